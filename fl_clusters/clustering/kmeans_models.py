"""WeCFL's weighted k-means over client models (Ma et al. 2022)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans

from fl_clusters.clustering.margins import (
    TIE_TOLERANCE,
    assignment_margins,
    pairwise_euclidean,
    warn_tie,
)
from fl_clusters.clustering.similarity import _finite_matrix


def _check_weights(weights: np.ndarray, num_points: int) -> np.ndarray:
    values = np.asarray(weights, dtype=np.float64)
    if values.shape != (num_points,) or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(
            f"weights must be {num_points} finite values > 0 (one data size per point), got "
            f"shape {values.shape}"
        )
    return values


def weighted_kmeans(
    points: np.ndarray,
    weights: np.ndarray,
    centers: np.ndarray,
    max_iter: int = 100,
) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's iterations of data-size-weighted k-means started from given centres.

    Started from the current cluster models, cluster j stays cluster j (no
    label switching between rounds); :func:`recluster_kmeans` uses it when too
    few distinct models arrive for a fresh k-means. A cluster that no point
    chooses keeps its centre, where sklearn's KMeans would move it onto a far
    point.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points (flattened trained client models), N >= 1.
    weights : np.ndarray
        (N,) data sizes, > 0.
    centers : np.ndarray
        (k, D) finite starting centres, k >= 1.
    max_iter : int (default: 100)
        Most assignment/update passes, >= 1; stops earlier when no label changes.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        (N,) int labels in [0, k - 1] and the (k, D) float64 final centres
        (weighted means of their members; the start centre for an empty cluster).
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    table = _finite_matrix("centers", centers).astype(np.float64).copy()
    if matrix.shape[0] == 0:
        raise ValueError("points must hold at least 1 row, got 0")
    if table.shape[0] == 0 or table.shape[1] != matrix.shape[1]:
        raise ValueError(
            f"centers must have shape (k >= 1, {matrix.shape[1]}) to match points, got "
            f"{table.shape}"
        )
    sizes = _check_weights(weights, matrix.shape[0])
    if max_iter < 1:
        raise ValueError(f"max_iter={max_iter} is outside [1, inf)")
    labels = np.full(matrix.shape[0], -1, dtype=np.int64)
    for _ in range(max_iter):
        # argmin takes the first of equal distances: exact ties go to the lower cluster.
        new = np.argmin(_squared_distances(matrix, table), axis=1).astype(np.int64)
        if np.array_equal(new, labels):
            break
        labels = new
        for j in np.unique(labels):
            members = labels == j
            table[j] = np.average(matrix[members], axis=0, weights=sizes[members])
    report_assignment_ties("WeCFL weighted k-means", _squared_distances(matrix, table))
    return labels, table


def initial_kmeans(
    points: np.ndarray, weights: np.ndarray, num_clusters: int, n_init: int = 10, seed: int = 0
) -> np.ndarray:
    """Data-size-weighted k-means++ clustering of points that share no centres yet.

    WeCFL's first cluster step, on the models every client trained from the
    same initial model. Ten k-means++ starts recovered the groups of 20
    digits and Fashion-MNIST clients in every measured case; a single start
    averaged an ARI of 0.88-0.96 on digits (docs/clustering-defaults.md).

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points, N >= ``num_clusters``.
    weights : np.ndarray
        (N,) data sizes, > 0.
    num_clusters : int
        k, >= 1.
    n_init : int (default: 10)
        k-means++ starts; the one of lowest weighted inertia is kept, >= 1.
    seed : int (default: 0)
        Seed of the starts.

    Returns
    -------
    np.ndarray
        (N,) int labels in [0, k - 1].
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    sizes = _check_weights(weights, matrix.shape[0])
    if not 1 <= num_clusters <= matrix.shape[0]:
        raise ValueError(
            f"num_clusters={num_clusters} is outside [1, {matrix.shape[0]}] for "
            f"{matrix.shape[0]} points"
        )
    if n_init < 1:
        raise ValueError(f"n_init={n_init} is outside [1, inf)")
    kmeans = KMeans(num_clusters, n_init=n_init, random_state=seed)
    labels = kmeans.fit_predict(matrix, sample_weight=sizes).astype(np.int64)
    report_assignment_ties("WeCFL k-means", _squared_distances(matrix, kmeans.cluster_centers_))
    return labels


def _squared_distances(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    # Coordinate by coordinate (no (N, k, D) tensor, D is a model's size): the
    # expansion ||x||^2 - 2 x.c + ||c||^2 loses the gap between two near centres
    # to cancellation and follows the BLAS kernel's rounding.
    return pairwise_euclidean(points, centers) ** 2


def report_assignment_ties(
    decision: str, squared_distances: np.ndarray, tolerance: float = TIE_TOLERANCE
) -> float:
    """Log a warning when a point is about as near two centres; return the smallest margin.

    Parameters
    ----------
    decision : str
        The assignment, in words for the log.
    squared_distances : np.ndarray
        (N, k) squared distances of the points to the centres.
    tolerance : float (default: TIE_TOLERANCE)
        Relative margins (:func:`~fl_clusters.clustering.margins.assignment_margins`)
        below it are ties.

    Returns
    -------
    float
        The smallest margin over the points (inf with one centre).
    """
    margins = assignment_margins(squared_distances)
    point = int(np.argmin(margins))
    nearest = np.sort(squared_distances[point])[:2]
    warn_tie(f"{decision}: point {point}'s nearest centre against its second",
             float(nearest[0]), float(nearest[-1]), float(margins[point]), tolerance)
    return float(margins[point])


def match_to_previous(centers: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The previous cluster each new cluster continues: nearest centres, one to one.

    k-means numbers its clusters arbitrarily; matching the new centres to the
    cluster models they were trained from (Hungarian algorithm on squared
    distances) keeps every cluster model's identity across rounds, so a
    relabelling is not a move.

    Parameters
    ----------
    centers : np.ndarray
        (k, D) new centres.
    previous : np.ndarray
        (k, D) previous centres (the cluster models).

    Returns
    -------
    np.ndarray
        (k,) int: new cluster j continues previous cluster ``match[j]``.
    """
    new = _finite_matrix("centers", centers).astype(np.float64)
    old = _finite_matrix("previous", previous).astype(np.float64)
    if new.shape != old.shape:
        raise ValueError(f"centers {new.shape} and previous {old.shape} must have one shape")
    rows, cols = linear_sum_assignment(_squared_distances(new, old))
    match = np.empty(new.shape[0], dtype=np.int64)
    match[rows] = cols
    return match


def recluster_kmeans(
    points: np.ndarray, weights: np.ndarray, previous: np.ndarray, n_init: int = 10,
    seed: int = 0,
) -> np.ndarray:
    """WeCFL's cluster step after the first round: a fresh weighted k-means, matched.

    The authors re-run k-means over the client models every round, so a client
    whose model drifts to another group moves there. The fresh clusters are
    matched to the previous cluster models (:func:`match_to_previous`), so
    cluster j stays the cluster that model j serves. With fewer distinct points
    than clusters a fresh k-means cannot fill every cluster: Lloyd's iterations
    from the previous centres (:func:`weighted_kmeans`) place the points instead.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points (flattened client models).
    weights : np.ndarray
        (N,) data sizes, > 0.
    previous : np.ndarray
        (k, D) the current cluster models.
    n_init : int (default: 10)
        k-means++ starts, >= 1.
    seed : int (default: 0)
        Seed of the starts.

    Returns
    -------
    np.ndarray
        (N,) int labels in [0, k - 1], numbered as ``previous``.
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    sizes = _check_weights(weights, matrix.shape[0])
    old = _finite_matrix("previous", previous).astype(np.float64)
    k = old.shape[0]
    if np.unique(matrix, axis=0).shape[0] < k:
        return weighted_kmeans(matrix, sizes, old)[0]
    labels = initial_kmeans(matrix, sizes, k, n_init, seed)
    centers = np.stack([
        np.average(matrix[labels == j], axis=0, weights=sizes[labels == j]) for j in range(k)
    ])
    return match_to_previous(centers, old)[labels]
