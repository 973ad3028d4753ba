"""Evaluating cluster models: on the nodes (each with the model it would use) and centrally."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.strategies.kit.replies import num_examples

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def per_cluster_evaluate(evaluate_fn: EvaluateFn) -> EvaluateFn:
    """Adapt a FedAvg-style centralized ``evaluate_fn`` to packed cluster models.

    The returned function passes a plain model through unchanged; a packed record
    is unpacked and ``evaluate_fn`` is called on every cluster model, its metrics
    returned under ``cluster-<j>/<name>`` keys (Flower's ``result`` keeps them per
    round in ``evaluate_metrics_serverapp``).
    """

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if not p.is_packed(arrays):
            return evaluate_fn(server_round, arrays)
        merged = MetricRecord()
        for j, model in enumerate(p.unpack_clusters(arrays)):
            for name, value in (evaluate_fn(server_round, model) or {}).items():
                merged[p.cluster_prefix(j) + name] = value
        return merged

    return evaluate


def evaluate_content(
    arrays: ArrayRecord,
    models: Sequence[ArrayRecord],
    config: ConfigRecord,
    cluster: int | None,
    features: np.ndarray | None,
    feature_samples: int | None = None,
) -> RecordDict:
    """What one node evaluates: the model it would use, or every model to choose from.

    Parameters
    ----------
    arrays : ArrayRecord
        Every cluster model, packed.
    models : Sequence[ArrayRecord]
        The same models, unpacked.
    config : ConfigRecord
        The node's evaluate config (MCFL's features are added to it).
    cluster : int | None
        The node's server-side cluster; ``None``: the node picks by training loss.
    features : np.ndarray | None
        MCFL's cluster features; with them every node picks the cluster whose
        feature is nearest to the mean of its test inputs.
    feature_samples : int | None
        With ``features``: the test inputs a node averages (sampled); ``None``: all.
    """
    if features is not None:
        add_cluster_features(config, features)
        if feature_samples is not None:
            config[p.CFG_NUM_SAMPLES] = feature_samples
    elif cluster is not None and len(models) > 1:
        return RecordDict({p.ARRAYS: models[cluster], p.CONFIG: config})
    return RecordDict({p.CLUSTERS: arrays, p.CONFIG: config})


def mean_metrics(valid: Sequence[Message]) -> tuple[float, float, float]:
    """The example-weighted mean accuracy and loss of evaluate replies, and their examples."""
    weights = np.array([num_examples(m) for m in valid])
    metrics = [m.content.metric_records[p.METRICS] for m in valid]
    accuracy = float(np.average([float(m[p.M_ACCURACY]) for m in metrics], weights=weights))  # type: ignore[arg-type]
    loss = float(np.average([float(m[p.M_LOSS]) for m in metrics], weights=weights))  # type: ignore[arg-type]
    return accuracy, loss, float(weights.sum())


def clusters_used(
    valid: Sequence[Message], assignment_for: Callable[[int], int | None]
) -> dict[int, int]:
    """Which cluster each evaluated node used.

    A node's cluster is the ``cluster-id`` its reply reports when it chose among
    every model (by training loss, or by MCFL's feature distance), else the
    server's assignment (``assignment_for``), else 0 (a single model).
    """
    used: dict[int, int] = {}
    for msg in valid:
        node = msg.metadata.src_node_id
        chosen = msg.content.metric_records[p.METRICS].get(p.M_CLUSTER)
        cluster = chosen if chosen is not None else assignment_for(node)
        used[node] = 0 if cluster is None else int(cluster)  # type: ignore[arg-type]
    return used


def cluster_accuracy(valid: Sequence[Message], used: dict[int, int]) -> dict[int, float]:
    """Each used cluster's example-weighted accuracy over the nodes that used it."""
    per_cluster: dict[int, float] = {}
    for cluster in sorted(set(used.values())):
        members = [m for m in valid if used[m.metadata.src_node_id] == cluster]
        per_cluster[cluster] = float(np.average(
            [float(m.content.metric_records[p.METRICS][p.M_ACCURACY]) for m in members],  # type: ignore[arg-type]
            weights=[num_examples(m) for m in members],
        ))
    return per_cluster


def add_cluster_features(config: ConfigRecord, features: np.ndarray) -> None:
    """Put the clusters that have a feature, and their features, into an evaluate config."""
    usable = np.flatnonzero(np.all(np.isfinite(features), axis=1))
    config[p.CFG_MCFL_CLUSTERS] = usable.tolist()
    config[p.CFG_MCFL_FEATURES] = features[usable].ravel().tolist()
