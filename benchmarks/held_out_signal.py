"""Why no strategy finds the groups of the held-out cell: the signal each one clusters on.

The held-out cell (``benchmarks/sweeps/held-out.toml``, issue 31) is digits, the
CNN, 8 rotation groups of 5 clients, 50 local steps at lr 0.01 with batches of 8.
Four recipes separate the data/model from the optimizer settings:

* ``A``: the held-out cell;
* ``B``: the tuned cell (MLP, 4 groups of 5, 10 steps at lr 0.1, batches of 32);
* ``C``: the held-out data and model with the tuned optimizer settings;
* ``D``: the tuned data and model with the held-out optimizer settings;
* ``E``, ``F``: the model apart from the federation: the MLP on the held-out
  federation and SGD, the CNN on the tuned federation and SGD.

For every recipe and seed, with the app's own partition, initial model, learner and
batch seeds:

1. every client trains one round from the same initial model; on the flattened
   updates, the cosine silhouette of the true groups and the ARI of k-means with
   k = number of groups (what CFL, FL+HC, WeCFL and the warm starts cluster on);
   per parameter tensor, its silhouette and its share of the squared update norm;
2. per group, one model trained on the group's pooled training data for the
   steps of ``ROUNDS`` rounds; its test accuracy on its own group, and the share
   of clients whose lowest-loss group model on their training data is their own
   (the best case of IFCA's loss-based choice), and on their test data;
3. one model trained on every client's pooled training data for the same steps;
   its test accuracy on every client's test data (what FedAvg can at most reach).

Writes ``benchmarks/measured/held_out_signal.json``::

    nice -n 10 .venv/bin/python benchmarks/held_out_signal.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, silhouette_score
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.client.task import sgd_settings
from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import ClientData, load_dataset, partition_dataset
from fl_clusters.learner import TorchLearner
from fl_clusters.models import build_model
from fl_clusters.server_app import initial_arrays, train_config
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "held_out_signal.json"
ROUNDS = 15  # the held-out sweep's rounds for IFCA, WeCFL, FL+HC, FedAvg and local-only
SEEDS = (0, 1, 2)
HELD_OUT_DATA = {"model": "cnn", "num-clusters": 8, "num-clients": 40}
TUNED_DATA = {"model": "mlp", "num-clusters": 4, "num-clients": 20}
HELD_OUT_SGD = {"local-steps": 50, "lr": 0.01, "batch-size": 8}
TUNED_SGD = {"local-steps": 10, "lr": 0.1, "batch-size": 32}
RECIPES = {
    "A held-out": {**HELD_OUT_DATA, **HELD_OUT_SGD},
    "B tuned": {**TUNED_DATA, **TUNED_SGD},
    "C held-out data+model, tuned SGD": {**HELD_OUT_DATA, **TUNED_SGD},
    "D tuned data+model, held-out SGD": {**TUNED_DATA, **HELD_OUT_SGD},
    "E held-out, MLP": {**HELD_OUT_DATA, **HELD_OUT_SGD, "model": "mlp"},
    "F tuned, CNN": {**TUNED_DATA, **TUNED_SGD, "model": "cnn"},
}
FIGURES = (
    "update_silhouette", "update_kmeans_ari", "group_model_accuracy",
    "loss_choice_own_share", "loss_choice_own_share_test", "pooled_model_accuracy",
)
PER_TENSOR = ("update_silhouette_by_tensor", "update_norm_share_by_tensor")


def learner_on(model: torch.nn.Module, clients: list[ClientData]) -> TorchLearner:
    """A learner on the pooled train and test splits of ``clients`` (one client: its own)."""
    def pooled(x: str, y: str) -> TensorDataset:
        return TensorDataset(
            torch.from_numpy(np.concatenate([getattr(c, x) for c in clients])),
            torch.from_numpy(np.concatenate([getattr(c, y) for c in clients])),
        )
    return TorchLearner(model, pooled("x_train", "y_train"), pooled("x_test", "y_test"))


def update_of(trained: ArrayRecord, start: ArrayRecord) -> dict[str, np.ndarray]:
    """Every parameter tensor's change, flattened to float64."""
    return {
        name: (trained[name].numpy() - start[name].numpy()).ravel().astype(np.float64)
        for name in start
    }


def by_tensor(updates: list[dict[str, np.ndarray]], truth: np.ndarray) -> dict[str, Any]:
    """Per tensor: the true groups' cosine silhouette and the share of the squared norm."""
    norms = {name: sum(float(u[name] @ u[name]) for u in updates) for name in updates[0]}
    return {
        "update_silhouette_by_tensor": {
            name: float(silhouette_score(np.stack([u[name] for u in updates]), truth,
                                         metric="cosine"))
            for name in updates[0]
        },
        "update_norm_share_by_tensor": {
            name: norm / sum(norms.values()) for name, norm in norms.items()
        },
    }


def measure(recipe: dict[str, Any], seed: int) -> dict[str, Any]:
    """The figures of :data:`FIGURES` and :data:`PER_TENSOR` for one recipe and seed.

    Parameters
    ----------
    recipe : dict[str, Any]
        Run-config keys of the cell, plus ``num-clients``.
    seed : int
        The run's ``seed`` (partition, initial model).
    """
    run_config = {k: v for k, v in recipe.items() if k != "num-clients"}
    settings = parse_run_config({**run_config, "seed": seed, "dataset": "digits"})
    num_clients, num_groups = recipe["num-clients"], settings["num-groups"]
    dataset = load_dataset("digits")
    clients = partition_dataset(dataset, num_clients, **partition_settings(settings))
    truth = np.array([c.true_cluster for c in clients])
    start = initial_arrays(settings)
    model = build_model(settings["model"], tuple(dataset.x.shape[1:]), dataset.num_classes)
    config = train_config(settings)
    config[p.CFG_ROUND] = 1
    updates = []
    for client_id, client in enumerate(clients):
        node = {"partition-id": client_id, "num-partitions": num_clients}
        context = Context(0, client_id, node, RecordDict(), {})
        trained, _ = learner_on(model, [client]).train(start, **sgd_settings(config, context))
        updates.append(update_of(trained, start))
    updates_matrix = np.stack([np.concatenate(list(u.values())) for u in updates])
    kmeans = KMeans(num_groups, n_init=10, random_state=seed).fit(updates_matrix)
    budget = {
        "lr": settings["lr"], "batch_size": settings["batch-size"],
        "steps": ROUNDS * settings["local-steps"], "seed": seed,
    }
    group_models, group_accuracy = [], []
    for group in range(num_groups):
        learner = learner_on(model, [c for c in clients if c.true_cluster == group])
        trained, _ = learner.train(start, **budget)
        group_models.append(trained)
        group_accuracy.append(learner.evaluate(trained)[1])
    chosen = {
        split: np.array([
            int(np.argmin(learner_on(model, [c]).mean_losses(group_models, split)))
            for c in clients
        ])
        for split in ("train", "test")
    }
    pooled = learner_on(model, clients)
    return {
        "update_silhouette": float(silhouette_score(updates_matrix, truth, metric="cosine")),
        "update_kmeans_ari": float(adjusted_rand_score(truth, kmeans.labels_)),
        "group_model_accuracy": float(np.mean(group_accuracy)),
        "loss_choice_own_share": float(np.mean(chosen["train"] == truth)),
        "loss_choice_own_share_test": float(np.mean(chosen["test"] == truth)),
        "pooled_model_accuracy": pooled.evaluate(pooled.train(start, **budget)[0])[1],
        **by_tensor(updates, truth),
    }


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over seeds of every figure and every per-tensor figure."""
    means: dict[str, Any] = {f: float(np.mean([r[f] for r in runs])) for f in FIGURES}
    for figure in PER_TENSOR:
        means[figure] = {
            name: float(np.mean([r[figure][name] for r in runs])) for name in runs[0][figure]
        }
    return means


def main() -> int:
    """Measure every recipe and seed, write the results file and print a table.

    Seeds given as arguments replace :data:`SEEDS`.
    """
    torch.set_num_threads(1)
    seeds = tuple(int(s) for s in sys.argv[1:]) or SEEDS
    results: dict[str, Any] = {}
    print(f"{'recipe':34} " + " ".join(f"{f[:24]:>24}" for f in FIGURES))
    for name, recipe in RECIPES.items():
        per_seed = {str(seed): measure(recipe, seed) for seed in seeds}
        means = mean_of(list(per_seed.values()))
        results[name] = {"recipe": recipe, "seeds": per_seed, "mean": means}
        print(f"{name:34} " + " ".join(f"{means[f]:>24.3f}" for f in FIGURES))
    OUT.write_text(json.dumps({
        "provenance": measurement_provenance(),
        "rounds": ROUNDS,
        "figures": {
            "update_silhouette": "cosine silhouette of the true groups on one round's updates "
                                 "from the same initial model",
            "update_kmeans_ari": "ARI of KMeans(k = groups, n_init=10) on those updates",
            "group_model_accuracy": "mean over groups of the test accuracy on its own group of "
                                    "a model trained on the group's pooled training data for "
                                    "rounds x local-steps steps",
            "loss_choice_own_share": "share of clients whose lowest mean training loss among "
                                     "those group models is their own group's",
            "loss_choice_own_share_test": "the same share, with the loss on the client's "
                                          "test split (data no group model trained on)",
            "pooled_model_accuracy": "test accuracy on every client's test data of one model "
                                     "trained on all pooled training data for the same steps",
            "update_silhouette_by_tensor": "update_silhouette on one parameter tensor's updates",
            "update_norm_share_by_tensor": "the tensor's share of the squared norm of all "
                                           "clients' updates",
        },
        "recipes": results,
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
