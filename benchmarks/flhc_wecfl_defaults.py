"""How FL+HC's cut and WeCFL's first k-means were chosen: client updates after FedAvg rounds.

For every case (data set, model, group structure; 20 clients, the run config's
default local training: 10 SGD steps of 32 samples, lr 0.1) the clients run FedAvg
in process (the fl-clusters learner, no Flower), and after w = 0..ROUNDS rounds
every client trains once more from the global model. On those updates:

- FL+HC (Euclidean, ward): the largest jump between consecutive merge heights
  and what the default gap cut gives; the range of relative cuts
  (``distance_ratio`` x the median distance to the nearest other update) that
  recover the groups exactly (ARI 1), or, without groups, keep every client in one
  cluster; and what the absolute cut 0.9 gives.
- WeCFL: the ARI of the first weighted k-means (w = 0, all clients trained the
  initial model) with ten k-means++ starts (worst over 5 seeds) and with one
  (mean over 10 seeds).

Results go to ``benchmarks/measured/flhc_wecfl_defaults.json``.

    PYTHONPATH=. python benchmarks/flhc_wecfl_defaults.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.clustering import UpdateHierarchy, initial_kmeans, weighted_average
from fl_clusters.data import DATASET_SHAPES, load_dataset
from fl_clusters.data.partition import partition_dataset
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model, model_to_arrays

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "measured" / "flhc_wecfl_defaults.json"
CLIENTS = 20
ROUNDS = 5
RATIOS = np.round(np.arange(1.0, 4.01, 0.05), 2)
CASES = [
    ("digits", "mlp", "rotation"),
    ("digits", "mlp", "label-permutation"),
    ("digits", "mlp", "none"),
    ("digits", "cnn", "rotation"),
    ("digits", "cnn", "none"),
    ("fashion-mnist", "mlp", "rotation"),
    ("fashion-mnist", "mlp", "label-permutation"),
    ("fashion-mnist", "mlp", "none"),
    ("fashion-mnist", "cnn", "rotation"),
]


def client_updates(data: str, model: str, structure: str, seed: int = 0) -> dict[str, Any]:
    """Updates of every client after w = 0..ROUNDS FedAvg rounds, with truth and sizes."""
    torch.set_num_threads(1)
    clients = partition_dataset(
        load_dataset(data), CLIENTS, structure=structure,
        num_groups=1 if structure == "none" else 4, seed=seed,
    )
    shape, classes = DATASET_SHAPES[data]
    learners = [
        TorchLearner(
            build_model(model, shape, classes),
            TensorDataset(torch.tensor(c.x_train), torch.tensor(c.y_train)),
            TensorDataset(torch.tensor(c.x_test), torch.tensor(c.y_test)),
        )
        for c in clients
    ]
    sizes = np.array([len(c.y_train) for c in clients], dtype=float)
    arrays = model_to_arrays(build_model(model, shape, classes, seed=seed))
    names = list(arrays.keys())
    updates = []
    for w in range(ROUNDS + 1):
        trained = [
            learner.train(arrays, lr=0.1, batch_size=32, steps=10, seed=w * 100_003 + i)[0]
            for i, learner in enumerate(learners)
        ]
        start = np.concatenate([arrays[n].numpy().ravel() for n in names])
        models = [[t[n].numpy() for n in names] for t in trained]
        updates.append(np.stack([np.concatenate([a.ravel() for a in m]) for m in models]) - start)
        arrays = p.numpy_to_record(names, weighted_average(models, sizes))
    return {"truth": np.array([c.true_cluster for c in clients]), "sizes": sizes,
            "updates": updates}


def _recovered(truth: np.ndarray, labels: np.ndarray) -> bool:
    if len(set(truth.tolist())) == 1:
        return len(set(labels.tolist())) == 1
    return adjusted_rand_score(truth, labels) == 1.0


def flhc_figures(truth: np.ndarray, updates: np.ndarray) -> dict[str, Any]:
    """The default gap cut, the relative cuts that recover the groups, the absolute cut."""
    good = [
        float(r) for r in RATIOS
        if _recovered(truth, UpdateHierarchy(threshold="relative", distance_ratio=float(r))
                      .fit_predict(updates))
    ]
    default = UpdateHierarchy().fit(updates)
    absolute = UpdateHierarchy(threshold="absolute").fit(updates)
    return {
        "max_gap": default.max_gap_,
        "default_clusters": default.num_clusters_,
        "default_ari": float(adjusted_rand_score(truth, default.labels_)),
        "good_ratios": [min(good), max(good)] if good else None,
        "absolute_clusters": absolute.num_clusters_,
        "absolute_ari": float(adjusted_rand_score(truth, absolute.labels_)),
        "median_nearest_distance": default.nearest_distance_,
    }


def wecfl_figures(truth: np.ndarray, sizes: np.ndarray, updates: np.ndarray) -> dict[str, Any]:
    """ARI of the first k-means with ten k-means++ starts and with one."""
    k = len(set(truth.tolist()))
    ten = [adjusted_rand_score(truth, initial_kmeans(updates, sizes, k, 10, s)) for s in range(5)]
    one = [adjusted_rand_score(truth, initial_kmeans(updates, sizes, k, 1, s)) for s in range(10)]
    return {"ari_n_init_10_min": float(min(ten)), "ari_n_init_1_mean": float(np.mean(one)),
            "ari_n_init_1_min": float(min(one))}


def main() -> None:
    """Measure every case and write the results file."""
    results: dict[str, Any] = {}
    for data, model, structure in CASES:
        case = client_updates(data, model, structure)
        truth, sizes = case["truth"], case["sizes"]
        row: dict[str, Any] = {
            f"flhc_after_{w}_rounds": flhc_figures(truth, u.astype(np.float64))
            for w, u in enumerate(case["updates"])
        }
        if structure != "none":
            row["wecfl_round_1"] = wecfl_figures(truth, sizes, case["updates"][0])
        results[f"{data}|{model}|{structure}"] = row
        print(f"{data}|{model}|{structure}: {json.dumps(row)}", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
