"""Speed of a client's local work: index-slice batches against a DataLoader.

For each data set, builds the learners of the first clients of a federation (as the
ClientApp does) and times, per client, one message's work: one local epoch of SGD
and the evaluation a round sends (test loss/accuracy), on the fast path (the
learner's in-memory TensorDataset) and on the DataLoader path (the same samples
behind a generic Dataset). CPU time of this process is reported, which the other
jobs on a shared machine disturb less than wall time; the load average is
recorded next to it. Writes ``benchmarks/measured/learner_speed.json`` (one row per
data set under ``rows``, beside the run's ``provenance``).

    python benchmarks/learner_speed.py [--clients 20] [--measured 10]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset, TensorDataset

from fl_clusters.data import DATASET_SHAPES, load_client_data
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "learner_speed.json"


class GenericDataset(Dataset):
    """The same tensors behind ``__getitem__``: what a DataLoader path sees."""

    def __init__(self, data: TensorDataset) -> None:
        self.x, self.y = data.tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _time(learner: TorchLearner, arrays: object, repeats: int) -> float:
    start = time.process_time()
    for seed in range(repeats):
        learner.train(arrays, lr=0.05, batch_size=32, epochs=1, seed=seed)  # type: ignore[arg-type]
        learner.evaluate(arrays)  # type: ignore[arg-type]
    return (time.process_time() - start) / repeats


def measure(dataset: str, num_clients: int, measured: int, repeats: int) -> dict[str, object]:
    """Mean CPU seconds of one train+evaluate message per client, both paths.

    Also the CPU seconds of building a fresh model and learner, which the ClientApp
    did for every message before learners were cached per node and process.
    """
    shape, num_classes = DATASET_SHAPES[dataset]
    model = build_model("mlp", shape, num_classes, seed=0)
    arrays = model_to_arrays(model)
    fast_s, loader_s, rebuild_s, samples = 0.0, 0.0, 0.0, 0
    # Warm-up: torch's first forward/backward pays one-off set-up costs.
    warm = load_client_data(dataset, None, 0, num_clients)
    _time(
        TorchLearner(
            model,
            *(TensorDataset(torch.from_numpy(warm.x_train), torch.from_numpy(warm.y_train)),) * 2,
        ),
        arrays,
        1,
    )
    for client in range(measured):
        data = load_client_data(dataset, None, client, num_clients)
        train = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
        test = TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test))
        samples += len(data.y_train)
        # What a message would pay without the learner cache: a new model and learner.
        start = time.process_time()
        for _ in range(repeats):
            TorchLearner(build_model("mlp", shape, num_classes), train, test)
        rebuild_s += (time.process_time() - start) / repeats
        fast_s += _time(TorchLearner(model, train, test), arrays, repeats)
        loader_s += _time(
            TorchLearner(model, GenericDataset(train), GenericDataset(test)), arrays, repeats
        )
    return {
        "dataset": dataset,
        "clients": num_clients,
        "clients_measured": measured,
        "mean_train_samples": samples / measured,
        "fast_cpu_s_per_message": fast_s / measured,
        "dataloader_cpu_s_per_message": loader_s / measured,
        "speedup": loader_s / fast_s,
        "rebuild_cpu_s_per_message": rebuild_s / measured,
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20, help="federation size (partition)")
    parser.add_argument("--measured", type=int, default=10, help="clients timed")
    parser.add_argument("--repeats", type=int, default=3, help="messages timed per client")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a client process with torch-threads = 1
    source = measurement_provenance()
    rows = [
        measure(name, args.clients, args.measured, args.repeats)
        for name in ("digits", "fashion-mnist")
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"provenance": source, "rows": rows}, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
