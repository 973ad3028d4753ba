"""A benchmark job's work without Flower: one plain PyTorch loop in one process.

The same partitions, model, seeds and local SGD steps per client per round as
the federation, FedAvg with Flower's own averaging (or IFCA's loss-based choice
and fl-clusters' per-cluster averaging) and every client's test evaluation each
round, one client after the other with the ClientApp's ``torch-threads``
(benchmarks/overhead.py, benchmarks/scale.py).
"""

from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from torch.utils.data import TensorDataset

from benchmarks.federation_runs import round_stats
from benchmarks.processes import in_fresh_process, maxrss_mb
from fl_clusters import protocol as p
from fl_clusters.clustering import group_by_kmeans, output_layer_profiles, weighted_average
from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import load_client_data, load_dataset
from fl_clusters.learner import TorchLearner, resolve_device
from fl_clusters.models import build_model
from fl_clusters.server_app import initial_arrays


def client_learner(
    settings: dict[str, Any], client: int, clients: int, model: torch.nn.Module | None = None
) -> TorchLearner:
    """Client ``client``'s learner (of ``clients``), with the ClientApp's partition.

    ``model``: the network to share with other learners (a new one when ``None``).
    """
    root = settings["data-root"] or None
    data = load_client_data(settings["dataset"], root, client, clients,
                            **partition_settings(settings))
    if model is None:
        num_classes = load_dataset(settings["dataset"], root).num_classes
        model = build_model(
            settings["model"], tuple(data.x_train.shape[1:]), num_classes  # type: ignore[arg-type]
        )
    return TorchLearner(
        model,
        TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        device=resolve_device(settings["device"]),
    )


def build_learners(settings: dict[str, Any], clients: int) -> list[TorchLearner]:
    """Every client's learner, with the ClientApp's partition and one shared model."""
    learners: list[TorchLearner] = []
    for client in range(clients):
        learners.append(client_learner(settings, client, clients,
                                       learners[0].model if learners else None))
    return learners


def choose(learner: TorchLearner, models: list[ArrayRecord], known: dict[bytes, float]) -> int:
    """The model with the lowest mean training loss (IFCA's choice; 0 for one model).

    ``known`` is the client's losses of the models it scored last, as the ClientApp
    keeps them in the node's context: each model is scored once.
    """
    if len(models) == 1:
        return 0
    return int(np.argmin(learner.mean_losses(models, "train", known)))


def average(models: list[ArrayRecord], weights: list[float]) -> ArrayRecord:
    """Example-weighted mean of models."""
    names = list(models[0].keys())
    layers = [[m[name].numpy() for name in names] for m in models]
    return p.numpy_to_record(names, weighted_average(layers, weights))


def fedavg_average(models: list[ArrayRecord], weights: list[float]) -> ArrayRecord:
    """Flower's FedAvg mean (its own function: float32 sums in the replies' order)."""
    records = [
        RecordDict({"arrays": m, "metrics": MetricRecord({"num-examples": w})})
        for m, w in zip(models, weights, strict=True)
    ]
    return aggregate_arrayrecords(records, "num-examples")


def plain_round(
    learners: list[TorchLearner], models: list[ArrayRecord], settings: dict[str, Any],
    server_round: int, num_clusters: int, known: list[dict[bytes, float]],
) -> list[ArrayRecord]:
    """One round of training without Flower; the new models.

    Every client trains the model of lowest training loss among ``models`` with the
    seed the ClientApp uses; each model becomes the example-weighted mean of its
    clients' models (one without clients keeps its own). IFCA's first round is its
    local-kmeans warm start: every client trains the single initial model for
    ``ifca-init-steps`` steps and k-means over the output-layer updates forms the
    ``num_clusters`` groups. IFCA's re-seeding of idle clusters is not repeated.
    """
    warm_start = num_clusters > 1 and len(models) == 1
    steps = settings["ifca-init-steps"] if warm_start else settings["local-steps"]
    chosen, trained = [], []
    for client, learner in enumerate(learners):
        cluster = choose(learner, models, known[client])
        arrays, _ = learner.train(
            models[cluster],
            lr=settings["lr"],
            batch_size=settings["batch-size"],
            epochs=settings["local-epochs"],
            steps=steps,
            seed=server_round * 100_003 + client % 100_003,
        )
        chosen.append(cluster)
        trained.append(arrays)
    if warm_start:
        start = models[0]
        last = [name for name in start if start[name].numpy().ndim == 2][-1]
        updates = np.stack([m[last].numpy() - start[last].numpy() for m in trained])
        chosen = group_by_kmeans(
            output_layer_profiles(updates.astype(np.float64)), num_clusters, settings["seed"]
        ).tolist()
        models = models * num_clusters
    weights = [float(learner.num_examples("train")) for learner in learners]
    # FedAvg averages as Flower's FedAvg does, IFCA as fl-clusters' strategies do.
    mean = fedavg_average if num_clusters == 1 else average
    new_models = []
    for j, model in enumerate(models):
        members = [i for i, cluster in enumerate(chosen) if cluster == j]
        new_models.append(
            mean([trained[i] for i in members], [weights[i] for i in members])
            if members
            else model
        )
    return new_models


def plain_evaluate(
    learners: list[TorchLearner], models: list[ArrayRecord], known: list[dict[bytes, float]]
) -> float:
    """Test accuracy over all clients, each with its model of lowest training loss."""
    correct, total = 0.0, 0
    for learner, kept in zip(learners, known, strict=True):
        _, accuracy = learner.evaluate(models[choose(learner, models, kept)], "test")
        correct += accuracy * learner.num_examples("test")
        total += learner.num_examples("test")
    return correct / total


def _plain_child(config: dict[str, Any], clients: int, t0: float, conn: Any) -> None:
    settings = parse_run_config(config)
    torch.set_num_threads(settings["torch-threads"])
    num_clusters = settings["num-clusters"] if settings["strategy"] == "ifca" else 1
    start = time.monotonic()
    learners = build_learners(settings, clients)
    loaded = time.monotonic()
    models, round_s, accuracy = [initial_arrays(settings)], [], 0.0
    known: list[dict[bytes, float]] = [{} for _ in learners]
    for server_round in range(1, settings["num-rounds"] + 1):
        round_start = time.monotonic()
        models = plain_round(learners, models, settings, server_round, num_clusters, known)
        accuracy = plain_evaluate(learners, models, known)
        round_s.append(time.monotonic() - round_start)
    conn.send(
        {
            "start": start,
            "data_load_s": loaded - start,
            "round_s": round_s,
            "accuracy": accuracy,
            "torch_threads": torch.get_num_threads(),
            "maxrss_mb": maxrss_mb(resource.getrusage(resource.RUSAGE_SELF)),
        }
    )


def plain_loop(config: dict[str, Any], clients: int) -> dict[str, Any]:
    """The job's work in one plain PyTorch loop, in a fresh process."""
    result, t0, tree_mb = in_fresh_process(_plain_child, config, clients)
    return {
        "data_load_s": result["data_load_s"],
        # Process start, imports and data loading, then round 1: the federation's
        # start-up to the end of its round 1 covers the same.
        "startup_to_round1_end_s": result["start"] - t0 + result["data_load_s"]
        + result["round_s"][0],
        **round_stats(result["round_s"]),
        "accuracy": result["accuracy"],
        "torch_threads": result["torch_threads"],
        "memory": {
            "rusage_maxrss_mb": result["maxrss_mb"],
            "rusage": "maxrss of the plain loop's process (RUSAGE_SELF)",
            "tree_peak_rss_mb": tree_mb,
        },
    }
