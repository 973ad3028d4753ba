"""FL+HC's agglomerative clustering of client updates with a scale-free distance threshold."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import pairwise_distances

from fl_clusters.clustering.similarity import _finite_matrix

LINKAGES = ("ward", "average", "complete", "single")
DISTANCES = ("euclidean", "manhattan", "cosine")
THRESHOLDS = ("gap", "relative", "absolute")


def median_nearest_distance(points: np.ndarray, metric: str = "euclidean") -> float:
    """Median over the points of the distance to their nearest other point.

    When most clients share their distribution with at least one other client,
    a client's nearest neighbour is a client of its own group, so this median
    measures how far apart the updates of ONE distribution lie: the noise of
    local SGD, in the units of the model at hand.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points, N >= 2.
    metric : str (default: "euclidean")
        One of :data:`DISTANCES`.

    Returns
    -------
    float
        The median nearest-neighbour distance, >= 0.
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    if matrix.shape[0] < 2:
        raise ValueError(f"points must hold at least 2 rows, got {matrix.shape[0]}")
    if metric not in DISTANCES:
        raise ValueError(f"metric={metric!r} is unknown; allowed: {', '.join(DISTANCES)}")
    distances = pairwise_distances(matrix, metric=metric)
    np.fill_diagonal(distances, np.inf)
    return float(np.median(distances.min(axis=1)))


class UpdateHierarchy:
    """Agglomerative clustering of client updates cut at a distance threshold (FL+HC).

    The number of clusters is not given: merging stops at ``threshold_``, as in
    Briggs et al. (2020). An absolute threshold only fits the model and local
    training it was tuned on (update norms scale with both), so by default the
    cut is read off the tree itself: merges inside a group happen at similar
    heights, and the first merge across groups is much higher. The default cut
    lies in the largest jump between consecutive merge heights, when that jump
    is at least ``min_gap`` times; otherwise every update joins one cluster.
    Ratios of heights do not depend on the units of the updates.

    Parameters
    ----------
    linkage : str (default: "ward")
        One of :data:`LINKAGES`; ``"ward"`` needs ``metric="euclidean"``.
    metric : str (default: "euclidean")
        One of :data:`DISTANCES`.
    threshold : str (default: "gap")
        ``"gap"``: cut at the geometric mean of the two merge heights around the
        largest ratio between consecutive heights, if that ratio is >=
        ``min_gap``, else one cluster (fewer than 3 points: one cluster).
        ``"relative"``: cut at ``distance_ratio`` x the median nearest-neighbour
        distance. ``"absolute"``: cut at ``distance_threshold`` (the paper's form).
    min_gap : float (default: 1.6)
        Smallest jump between consecutive merge heights that separates clusters,
        > 1. Measured on 20 clients (ward, docs/clustering-defaults.md): groups
        gave jumps of 1.71 to 6.07, one distribution 1.09 to 1.28 (MLPs) and up
        to 1.45 (a CNN that had not learned yet).
    distance_ratio : float (default: 2.5)
        Relative cut, > 0.
    distance_threshold : float (default: 0.9)
        Absolute cut, > 0, in the units of ``metric``.

    Attributes
    ----------
    labels_ : np.ndarray
        (N,) int cluster of every point, numbered in order of first appearance.
    num_clusters_ : int
        Number of clusters found.
    threshold_ : float
        The distance at which merging stopped; inf when everything merged
        because no jump reached ``min_gap``.
    max_gap_ : float
        Largest ratio between consecutive merge heights (NaN below 3 points).
    nearest_distance_ : float
        Median nearest-neighbour distance (NaN for a single point).
    """

    def __init__(
        self,
        linkage: str = "ward",
        metric: str = "euclidean",
        threshold: str = "gap",
        min_gap: float = 1.6,
        distance_ratio: float = 2.5,
        distance_threshold: float = 0.9,
    ) -> None:
        if linkage not in LINKAGES:
            raise ValueError(f"linkage={linkage!r} is unknown; allowed: {', '.join(LINKAGES)}")
        if metric not in DISTANCES:
            raise ValueError(f"metric={metric!r} is unknown; allowed: {', '.join(DISTANCES)}")
        if linkage == "ward" and metric != "euclidean":
            raise ValueError(
                f"linkage='ward' needs metric='euclidean', got metric={metric!r}; choose "
                "linkage 'average', 'complete' or 'single' for that metric"
            )
        if threshold not in THRESHOLDS:
            raise ValueError(
                f"threshold={threshold!r} is unknown; allowed: {', '.join(THRESHOLDS)}"
            )
        if not min_gap > 1.0:
            raise ValueError(f"min_gap={min_gap} is outside (1, inf)")
        if not distance_ratio > 0.0:
            raise ValueError(f"distance_ratio={distance_ratio} is outside (0, inf)")
        if not distance_threshold > 0.0:
            raise ValueError(f"distance_threshold={distance_threshold} is outside (0, inf)")
        self.linkage = linkage
        self.metric = metric
        self.threshold = threshold
        self.min_gap = min_gap
        self.distance_ratio = distance_ratio
        self.distance_threshold = distance_threshold

    def fit(self, points: np.ndarray) -> UpdateHierarchy:
        """Cluster ``points``.

        Parameters
        ----------
        points : np.ndarray
            (N, D) finite points (flattened client updates), N >= 1.
        """
        matrix = _finite_matrix("points", points).astype(np.float64)
        if matrix.shape[0] == 0:
            raise ValueError("points must hold at least 1 row, got 0")
        self.max_gap_ = float("nan")
        if matrix.shape[0] == 1:
            self._set(np.zeros(1, dtype=np.int64), float("nan"), float("inf"))
            return self
        if self.metric == "cosine" and np.any(np.linalg.norm(matrix, axis=1) == 0.0):
            raise ValueError("points holds a zero row: its cosine distance is undefined")
        nearest = median_nearest_distance(matrix, self.metric)
        if self.threshold == "gap":
            cut = self._gap_cut(matrix)
        elif self.threshold == "relative":
            cut = self.distance_ratio * nearest
        else:
            cut = self.distance_threshold
        if cut == float("inf"):
            labels = np.zeros(matrix.shape[0], dtype=np.int64)
        elif cut == 0.0:
            # Most updates have an identical twin: only identical updates merge.
            labels = np.unique(matrix, axis=0, return_inverse=True)[1].ravel()
        else:
            labels = AgglomerativeClustering(
                n_clusters=None, distance_threshold=cut, linkage=self.linkage, metric=self.metric
            ).fit_predict(matrix)
        self._set(labels, nearest, cut)
        return self

    def _gap_cut(self, matrix: np.ndarray) -> float:
        """The cut inside the largest jump of merge heights, or inf when none is large enough."""
        if matrix.shape[0] < 3:
            return float("inf")
        tree = AgglomerativeClustering(
            n_clusters=1, linkage=self.linkage, metric=self.metric, compute_distances=True
        ).fit(matrix)
        heights = np.sort(tree.distances_)
        low, high = heights[:-1], heights[1:]
        # A jump from height 0 (identical updates) to any distance is infinite.
        jumps = np.divide(high, low, out=np.full_like(high, np.inf), where=low > 0)
        jumps[(low == 0) & (high == 0)] = 1.0
        i = int(np.argmax(jumps))
        self.max_gap_ = float(jumps[i])
        if jumps[i] < self.min_gap:
            return float("inf")
        return float(np.sqrt(low[i] * high[i])) if low[i] > 0 else float(high[i] / 2)

    def fit_predict(self, points: np.ndarray) -> np.ndarray:
        """Cluster ``points`` and return ``labels_``."""
        return self.fit(points).labels_

    def _set(self, labels: np.ndarray, nearest: float, cut: float) -> None:
        # sklearn numbers clusters arbitrarily; first-appearance order makes the
        # labels (and so the cluster models' order) reproducible.
        _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
        order = np.argsort(np.argsort(first))
        self.labels_ = order[inverse.ravel()].astype(np.int64)
        self.num_clusters_ = int(first.size)
        self.threshold_ = float(cut)
        self.nearest_distance_ = float(nearest)
