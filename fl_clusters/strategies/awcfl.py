"""AWCFL's inter-cluster mixing, an option of every hard-clustered strategy (Ma et al.)."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord

from fl_clusters import protocol as p
from fl_clusters.clustering import inter_cluster_mix


def mix_clusters(
    models: list[ArrayRecord], beta: float, active: Iterable[int] | None = None
) -> list[ArrayRecord]:
    """Blend each active cluster model with the other active ones (identity when beta is 0).

    Cluster k becomes ``beta/(n-1) * sum of the other clusters + (1-beta) * its own
    mean`` (:func:`~fl_clusters.clustering.inter_cluster_mix`).

    Parameters
    ----------
    models : list[ArrayRecord]
        Every cluster's model after this round's aggregation.
    beta : float
        The weight of the other clusters, in [0, 1].
    active : Iterable[int] | None
        The clusters that aggregated members this round; only they are mixed
        with each other. A cluster without members keeps its model: mixing it
        would drag it to the others' mean, where it can capture their clients.
        ``None`` mixes every cluster.

    Returns
    -------
    list[ArrayRecord]
        The models, the active ones mixed (``models`` itself when nothing mixes).
    """
    chosen = sorted(set(range(len(models)) if active is None else active))
    if beta == 0.0 or len(chosen) < 2:
        return models
    names = list(models[0].keys())
    mixed = inter_cluster_mix([[models[j][n].numpy() for n in names] for j in chosen], beta)
    result = list(models)
    for j, arrays in zip(chosen, mixed, strict=True):
        result[j] = p.numpy_to_record(names, arrays)
    return result
