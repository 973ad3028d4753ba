"""Speed of the built-in CNN with channels-last weights (its layout) against NCHW.

For each data set, one client of a 20-client federation (as the ClientApp loads it)
with the CNN on one torch thread, as a simulation client runs: CPU seconds of
scoring its training split under one model (what IFCA's loss-based choice does
for every candidate, every round) and of 10 local SGD steps at batch 32 (the
default local work), with the weights channels-last (``fl_clusters.models.CNN``)
and with the same weights NCHW (torch's default layout). Both layouts start from
the same arrays; the largest difference of their logits and of their trained
weights is recorded beside the times. CPU time of this process is reported (other
jobs on a shared machine disturb it less than wall time), with the load average.
Writes ``benchmarks/measured/model_layout_speed.json``.

    python benchmarks/model_layout_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from fl_clusters.data import DATASET_SHAPES, load_client_data
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "model_layout_speed.json"
NUM_CLIENTS = 20
LOCAL_STEPS = 10
BATCH_SIZE = 32


def _cpu_seconds(work: object, repeats: int) -> float:
    """Median CPU seconds of ``work()`` over ``repeats`` calls, after one warm-up."""
    work()  # type: ignore[operator]
    times = []
    for _ in range(repeats):
        start = time.process_time()
        work()  # type: ignore[operator]
        times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2]


def measure(dataset: str, repeats: int) -> dict[str, object]:
    """Scoring and training seconds of one client, channels-last against NCHW."""
    shape, num_classes = DATASET_SHAPES[dataset]
    data = load_client_data(dataset, None, 0, NUM_CLIENTS)
    train = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
    test = TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))
    arrays = model_to_arrays(build_model("cnn", shape, num_classes, seed=0))
    learners = {
        "channels_last": TorchLearner(build_model("cnn", shape, num_classes), train, test),
        "nchw": TorchLearner(
            build_model("cnn", shape, num_classes).to(memory_format=torch.contiguous_format),
            train, test,
        ),
    }
    row: dict[str, object] = {"dataset": dataset, "train_samples": len(data.y_train)}
    losses, trained = {}, {}
    for layout, learner in learners.items():
        row[f"score_cpu_s_{layout}"] = _cpu_seconds(
            lambda learner=learner: learner.per_sample_losses(arrays, "train"), repeats
        )
        row[f"train_cpu_s_{layout}"] = _cpu_seconds(
            lambda learner=learner: learner.train(
                arrays, lr=0.1, batch_size=BATCH_SIZE, steps=LOCAL_STEPS, seed=0
            ),
            repeats,
        )
        losses[layout] = torch.from_numpy(learner.per_sample_losses(arrays, "train"))
        trained[layout] = learner.train(
            arrays, lr=0.1, batch_size=BATCH_SIZE, steps=LOCAL_STEPS, seed=0
        )[0]
    row["score_speedup"] = row["score_cpu_s_nchw"] / row["score_cpu_s_channels_last"]  # type: ignore[operator]
    row["train_speedup"] = row["train_cpu_s_nchw"] / row["train_cpu_s_channels_last"]  # type: ignore[operator]
    row["max_loss_difference"] = float((losses["nchw"] - losses["channels_last"]).abs().max())
    row["max_trained_weight_difference"] = max(
        float(abs(trained["nchw"][k].numpy() - trained["channels_last"][k].numpy()).max())
        for k in trained["nchw"]
    )
    row["torch_threads"] = torch.get_num_threads()
    row["load_average_1m"] = os.getloadavg()[0]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per figure")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a client process with torch-threads = 1
    source = measurement_provenance()
    rows = [measure(name, args.repeats) for name in ("digits", "fashion-mnist")]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"provenance": source, "rows": rows}, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
