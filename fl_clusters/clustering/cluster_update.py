"""IFCA's server update of one cluster: model or gradient averaging, weighted or as the paper."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_clusters.clustering.aggregation import weighted_average

MODES = ("model", "gradient")
AGGREGATIONS = ("weighted", "paper")


def cluster_update(
    old: Sequence[np.ndarray],
    members: Sequence[Sequence[np.ndarray]],
    weights: Sequence[float],
    *,
    mode: str,
    aggregation: str,
    server_lr: float,
    num_replies: int,
) -> list[np.ndarray]:
    """The new layers of one cluster from its members' replies.

    Parameters
    ----------
    old : sequence of np.ndarray
        The cluster's layers this round.
    members : sequence of sequence of np.ndarray
        The members' replies, layers in the order of ``old``: trained models
        (``mode="model"``) or gradients at ``old`` (``mode="gradient"``).
    weights : sequence of float
        Each member's training examples (``aggregation="weighted"``).
    mode : str
        ``"model"``: the cluster becomes the members' mean. ``"gradient"``: it steps
        along their mean gradient.
    aggregation : str
        ``"weighted"``: example-weighted means, a step of ``server_lr``.
        ``"paper"``: IFCA's unweighted updates, a step ``theta_j - gamma / m *
        sum of cluster j's gradients``.
    server_lr : float
        gamma, the gradient step size.
    num_replies : int
        m, the clients that answered this round (all clusters).

    Returns
    -------
    list of np.ndarray
        The new layers, in the dtypes of ``old``.
    """
    if mode not in MODES or aggregation not in AGGREGATIONS:
        raise ValueError(f"mode={mode!r} or aggregation={aggregation!r} is unknown")
    if aggregation == "weighted":
        average = weighted_average(members, weights)
        if mode == "model":
            return average
        factor = server_lr
    else:
        average = [np.mean([model[i] for model in members], axis=0, dtype=np.float64)
                   for i in range(len(old))]
        if mode == "model":
            return [mean.astype(np.asarray(layer).dtype) for mean, layer in
                    zip(average, old, strict=True)]
        # gamma / m * sum of the cluster's gradients = gamma * |S_j| / m * their mean.
        factor = server_lr * len(members) / num_replies
    return [(np.asarray(layer) - factor * mean).astype(np.asarray(layer).dtype)
            for layer, mean in zip(old, average, strict=True)]
