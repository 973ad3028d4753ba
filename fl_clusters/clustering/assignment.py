"""Choosing a cluster: lowest loss (IFCA, FedSoft) and nearest input feature (MCFL)."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from fl_clusters.clustering.similarity import _checked_labels, _finite_matrix


def assign_by_loss(losses: np.ndarray) -> np.ndarray:
    """Index of the lowest-loss cluster for every row (client or sample).

    Parameters
    ----------
    losses : np.ndarray
        (N, k) finite losses of N clients (or samples) under k cluster models.
        Compute them on training or validation data, never on the test split.

    Returns
    -------
    np.ndarray
        (N,) int cluster indices; ties go to the lowest index.
    """
    matrix = _finite_matrix("losses", losses)
    if matrix.shape[1] == 0:
        raise ValueError("losses must have at least one column (cluster), got 0")
    return np.argmin(matrix, axis=1)


def cluster_feature_means(
    features: np.ndarray, labels: np.ndarray, num_clusters: int
) -> np.ndarray:
    """MCFL's cluster features: the mean of the member clients' input means.

    Parameters
    ----------
    features : np.ndarray
        (N, D) each client's mean input (the mean of n sampled inputs).
    labels : np.ndarray
        (N,) int cluster of each client, in [0, num_clusters - 1].
    num_clusters : int
        Number of clusters k, >= 1.

    Returns
    -------
    np.ndarray
        (k, D) float64 cluster features. A cluster without members gets a row of
        NaN: it has no feature, and :func:`nearest_feature` never picks it.
    """
    if num_clusters < 1:
        raise ValueError(f"num_clusters={num_clusters} is outside [1, inf)")
    matrix = _finite_matrix("features", features).astype(np.float64)
    clusters = _checked_labels(labels, matrix.shape[0], 0, num_clusters)
    sums = np.zeros((num_clusters, matrix.shape[1]))
    np.add.at(sums, clusters, matrix)
    sizes = np.bincount(clusters, minlength=num_clusters)[:, None]
    return np.divide(sums, sizes, out=np.full_like(sums, np.nan), where=sizes > 0)


def nearest_feature(query: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """MCFL's inference-time choice: the cluster whose feature is closest in Euclidean distance.

    Parameters
    ----------
    query : np.ndarray
        (M, D) finite features (e.g. each test client's mean input).
    centroids : np.ndarray
        (k, D) cluster features; rows holding NaN (empty clusters) are skipped.
        At least one row must be finite.

    Returns
    -------
    np.ndarray
        (M,) int indices into ``centroids``.
    """
    points = _finite_matrix("query", query).astype(np.float64)
    table = np.asarray(centroids, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != points.shape[1]:
        raise ValueError(
            f"centroids must have shape (k, {points.shape[1]}) to match query, got {table.shape}"
        )
    usable = np.flatnonzero(np.all(np.isfinite(table), axis=1))
    if usable.size == 0:
        raise ValueError("centroids has no finite row: every cluster is empty")
    distances = np.linalg.norm(points[:, None, :] - table[usable][None, :, :], axis=2)
    return usable[np.argmin(distances, axis=1)]


def group_by_kmeans(points: np.ndarray, num_groups: int, seed: int = 0) -> np.ndarray:
    """Split clients into ``num_groups`` groups by k-means over their points.

    FedSoft's optional warm start groups the clients' first local updates this
    way, so that its cluster models start from different sources instead of from
    random draws that fit every sample alike.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points, e.g. flattened client updates; N >= ``num_groups``.
    num_groups : int
        Number of groups k, >= 1.
    seed : int (default: 0)
        Seed of k-means' initializations (ten k-means++ starts, the best kept).

    Returns
    -------
    np.ndarray
        (N,) int group of every point, in [0, k - 1]; every group is non-empty
        when the points hold at least k distinct rows.
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    if not 1 <= num_groups <= matrix.shape[0]:
        raise ValueError(
            f"num_groups={num_groups} is outside [1, {matrix.shape[0]}] for "
            f"{matrix.shape[0]} points"
        )
    return KMeans(num_groups, n_init=10, random_state=seed).fit_predict(matrix).astype(np.int64)
