"""Weighted k-means that starts from the partition already found (WeCFL's robust re-clustering).

A fresh k-means over the trained client models (``n_init`` k-means++ starts, the
lowest weighted inertia wins) may settle on another local optimum than the one
the clusters hold: when the updates of one group spread more than the groups lie
apart (momentum SGD on labels that conflict), splitting by the size of the
update can have the lower inertia, and nodes change cluster without any change
to their data. Started from the current partition instead, Lloyd's iterations
only ever move a node whose trained model lies nearer another cluster's centre,
so the groups found stay found and a node whose data changed still moves.
"""

from __future__ import annotations

import numpy as np

from fl_clusters.clustering.kmeans_models import _check_weights, weighted_kmeans
from fl_clusters.clustering.similarity import _checked_labels, _finite_matrix

# A point's current cluster when it has none yet (a node never clustered).
UNCLUSTERED = -1


def partition_centres(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, fallback: np.ndarray
) -> np.ndarray:
    """Each cluster's weighted mean of the points it holds; ``fallback[j]`` for one that holds none.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points.
    weights : np.ndarray
        (N,) weights, > 0.
    labels : np.ndarray
        (N,) int cluster of each point in [0, k - 1], or :data:`UNCLUSTERED`.
    fallback : np.ndarray
        (k, D) centres of the clusters that hold no point (the current cluster models).

    Returns
    -------
    np.ndarray
        (k, D) float64 centres.
    """
    centres = np.array(fallback, dtype=np.float64, copy=True)
    for j in range(centres.shape[0]):
        members = labels == j
        if members.any():
            centres[j] = np.average(points[members], axis=0, weights=weights[members])
    return centres


def anchored_kmeans(
    points: np.ndarray, weights: np.ndarray, labels: np.ndarray, centres: np.ndarray,
    max_iter: int = 100,
) -> np.ndarray:
    """Weighted k-means started from the current partition of the points.

    The start centres are the weighted means of the points by their current
    cluster (:func:`partition_centres`); a cluster that holds no point starts
    from its current model. Lloyd's iterations
    (:func:`~fl_clusters.clustering.kmeans_models.weighted_kmeans`) then move a
    point only when it lies nearer another centre, and each move lowers the
    weighted inertia, so the result is the local optimum reached from the
    partition found, numbered as ``centres``. An unclustered point joins the
    cluster of nearest start centre.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points (flattened trained client models), N >= 1.
    weights : np.ndarray
        (N,) data sizes, > 0.
    labels : np.ndarray
        (N,) int current cluster of each point in [0, k - 1], or
        :data:`UNCLUSTERED` (-1) for a point that has none.
    centres : np.ndarray
        (k, D) finite current cluster models, k >= 1.
    max_iter : int (default: 100)
        Most Lloyd passes, >= 1.

    Returns
    -------
    np.ndarray
        (N,) int labels in [0, k - 1].
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    table = _finite_matrix("centres", centres).astype(np.float64)
    current = _checked_labels(labels, matrix.shape[0], UNCLUSTERED, table.shape[0])
    if table.shape[1] != matrix.shape[1]:
        raise ValueError(f"centres {table.shape} and points {matrix.shape} differ in width")
    sizes = _check_weights(weights, matrix.shape[0])
    start = partition_centres(matrix, sizes, current, table)
    return weighted_kmeans(matrix, sizes, start, max_iter)[0]
