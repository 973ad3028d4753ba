"""Cost of one node's final report with k cluster models: chosen by the node or named.

The final report scores every cluster model on the node's test split (for the
inter-cluster accuracy). A node that chooses its cluster itself also needs every
model's loss on its training split; a node the server names a cluster for does
not; with many clusters (a CFL run can end with 19) those training passes are
most of the report. Times the ClientApp's report handler for both cases, per
client, in CPU seconds of this process. Writes ``benchmarks/measured/report_cost.json``
(one row per cluster count under ``rows``, beside the run's ``provenance``).

    python benchmarks/report_cost.py [--dataset fashion-mnist] [--model cnn] [--clusters 4 19]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.client.queries import report_reply
from fl_clusters.data import DATASET_SHAPES, load_client_data
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "report_cost.json"


def report_seconds(learner: TorchLearner, packed: object, assigned: int) -> float:
    """CPU seconds of one report whose config names cluster ``assigned`` (-1: none)."""
    message = Message(
        RecordDict({p.CLUSTERS: packed, p.CONFIG: ConfigRecord({p.CFG_ASSIGNED: assigned})}),  # type: ignore[dict-item]
        dst_node_id=1, message_type=p.QUERY_REPORT,
    )
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    start = time.process_time()
    report_reply(learner, message, context, {})
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--clients", type=int, default=20, help="federation size (partition)")
    parser.add_argument("--measured", type=int, default=3, help="clients timed")
    parser.add_argument("--clusters", type=int, nargs="+", default=[4, 19])
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a client process with torch-threads = 1
    source = measurement_provenance()
    for name in ("_run_id", "_node_id", "_task_id"):  # Message() needs a run identity
        setattr(TaskIdentity, name, 1)
    shape, num_classes = DATASET_SHAPES[args.dataset]
    rows = []
    for k in args.clusters:
        packed = p.pack_clusters([
            model_to_arrays(build_model(args.model, shape, num_classes, seed=s)) for s in range(k)
        ])
        chooses, named, train_samples = 0.0, 0.0, 0
        for client in range(args.measured):
            data = load_client_data(args.dataset, None, client, args.clients)
            learner = TorchLearner(
                build_model(args.model, shape, num_classes),
                TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
                TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
            )
            train_samples += len(data.y_train)
            chooses += report_seconds(learner, packed, -1)
            named += report_seconds(learner, packed, 0)
        rows.append({
            "dataset": args.dataset, "model": args.model, "clusters": k,
            "clients_measured": args.measured, "mean_train_samples": train_samples / args.measured,
            "node_chooses_cpu_s": chooses / args.measured,
            "server_names_cpu_s": named / args.measured,
            "speedup": chooses / named,
            "load_average_1m": os.getloadavg()[0],
        })
        print(json.dumps(rows[-1]))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"provenance": source, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
