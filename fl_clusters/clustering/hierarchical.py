"""FL+HC's agglomerative clustering of client updates with a scale-free distance threshold."""

from __future__ import annotations

import numpy as np
from scipy.sparse.csgraph import connected_components
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import pairwise_distances

from fl_clusters.clustering.margins import check_margin, warn_tie
from fl_clusters.clustering.similarity import _finite_matrix
from fl_clusters.params import Param, ParamError, check_params

LINKAGES = ("ward", "average", "complete", "single")
DISTANCES = ("euclidean", "manhattan", "cosine")
THRESHOLDS = ("gap", "relative", "absolute")
# What UpdateHierarchy takes; FL+HC's declarations (run-config keys, the paper's
# values) are these with its own help and defaults.
HIERARCHY_PARAMS = (
    Param("linkage", "ward", "str", "agglomerative linkage", choices=LINKAGES),
    Param("metric", "euclidean", "str", "distance between points", choices=DISTANCES),
    Param("threshold", "gap", "str", "how the tree is cut", choices=THRESHOLDS),
    Param("min_gap", 1.6, "float", "gap cut's smallest jump", above=1.0),
    Param("distance_ratio", 2.5, "float", "relative cut", above=0.0),
    Param("distance_threshold", 0.9, "float", "absolute cut", above=0.0),
)
# Updates closer than this fraction of the median distance between distinct updates
# are copies of one update (the same data and seed, up to floating-point noise).
COPY_RATIO = 1e-3


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


def distinct_updates(points: np.ndarray, metric: str = "euclidean") -> np.ndarray:
    """Which distinct update each point copies: exact copies and near copies count once.

    Two clients with the same data and seed (or a device that reports again)
    send the same update up to floating-point noise. Clustered as separate
    points they form the lowest merge of the tree by far, and under ward they
    weigh twice. Points closer than :data:`COPY_RATIO` x the median distance
    between exactly distinct points are chained into one copy group,
    represented by its first point, so a copy changes nothing about how the
    other points are grouped.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points, N >= 1.
    metric : str (default: "euclidean")
        One of :data:`DISTANCES`.

    Returns
    -------
    np.ndarray
        (N,) int: for every point, the index of the first point of its copy group.
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    _, first, inverse = np.unique(matrix, axis=0, return_index=True, return_inverse=True)
    owner = first[inverse.ravel()]
    unique = np.sort(first)
    if unique.size < 2:
        return owner
    distances = pairwise_distances(matrix[unique], metric=metric)
    if metric == "cosine":
        # 1 - cos grows with the square of the angle; its root grows linearly, like
        # the other metrics, so COPY_RATIO means the same for all.
        distances = np.sqrt(np.maximum(distances, 0.0))
    # The median over all pairs: copies, however many, are a small share of the pairs.
    pairs = distances[np.triu_indices(unique.size, 1)]
    tolerance = COPY_RATIO * float(np.median(pairs))
    check_margin("FL+HC copy test: distance <= copy tolerance",
                 float(pairs[np.argmin(np.abs(pairs - tolerance))]), tolerance)
    _, groups = connected_components(distances <= tolerance, directed=False)
    # ``unique`` is sorted, so a group's first entry in ``groups`` is its first point.
    _, lowest = np.unique(groups, return_index=True)
    return unique[lowest[groups]][np.searchsorted(unique, owner)]


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

    Copies of an update (exact, or closer than :data:`COPY_RATIO` x the median
    distance between updates) are clustered once and take their original's
    label (:func:`distinct_updates`): a copy would otherwise be the tree's first,
    tiny merge, whose jump to the next merge wins the gap cut (4 groups of 5
    with one near-identical pair gave 19 clusters). For the same reason the gap
    cut only counts jumps whose lower merge is at least the median
    nearest-neighbour distance / ``min_gap`` (the noise floor): two unusually
    close updates of one group merge far below it.

    Parameters
    ----------
    linkage : str (default: "ward")
        One of :data:`LINKAGES`; ``"ward"`` needs ``metric="euclidean"``.
    metric : str (default: "euclidean")
        One of :data:`DISTANCES`.
    threshold : str (default: "gap")
        ``"gap"``: cut at the geometric mean of the two merge heights around the
        largest ratio between consecutive heights whose lower height is above
        the noise floor, if that ratio is >= ``min_gap``, else one cluster (fewer
        than 3 distinct points: one cluster).
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
        Largest ratio between consecutive merge heights above the noise floor
        (NaN below 3 distinct points; 1 when no merge lies above the floor).
    nearest_distance_ : float
        Median nearest-neighbour distance of the distinct points (NaN for one).
    num_distinct_ : int
        Number of distinct points, copies counted once.
    margin_ : float
        Smallest relative margin of the cut's decisions (the gap cut: largest
        jump against ``min_gap``, against the runner-up, merge heights against
        the noise floor; a given cut: the nearest merge height against it); a
        margin below ``TIE_TOLERANCE`` is logged as a tie. inf when nothing was cut.
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
        values = check_params("UpdateHierarchy", HIERARCHY_PARAMS, {
            "linkage": linkage, "metric": metric, "threshold": threshold, "min_gap": min_gap,
            "distance_ratio": distance_ratio, "distance_threshold": distance_threshold})
        if linkage == "ward" and metric != "euclidean":
            raise ParamError("metric", "'euclidean' with linkage='ward' (or choose linkage "
                             "'average', 'complete' or 'single' for that metric)", metric)
        for name, value in values.items():
            setattr(self, name, value)

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
        if self.metric == "cosine" and np.any(np.linalg.norm(matrix, axis=1) == 0.0):
            raise ValueError("points holds a zero row: its cosine distance is undefined")
        self.max_gap_ = float("nan")
        self.margin_ = float("inf")
        owner = distinct_updates(matrix, self.metric)
        distinct = np.unique(owner)
        self.num_distinct_ = int(distinct.size)
        if distinct.size == 1:
            self._set(np.zeros(matrix.shape[0], dtype=np.int64), float("nan"), float("inf"))
            return self
        matrix = matrix[distinct]
        nearest = median_nearest_distance(matrix, self.metric)
        if self.threshold == "gap":
            cut = self._gap_cut(matrix, nearest)
        elif self.threshold == "relative":
            cut = self.distance_ratio * nearest
        else:
            cut = self.distance_threshold
        if cut == float("inf"):
            labels = np.zeros(matrix.shape[0], dtype=np.int64)
        else:
            tree = AgglomerativeClustering(
                n_clusters=None, distance_threshold=cut, linkage=self.linkage, metric=self.metric
            ).fit(matrix)
            labels = tree.labels_
            # A merge at the cut's height is kept or not by rounding (sklearn merges
            # below the threshold); the gap cut lies sqrt(min_gap) from every merge.
            self.margin_ = min(self.margin_, check_margin(
                "FL+HC cut: merge height < distance threshold",
                float(tree.distances_[np.argmin(np.abs(tree.distances_ - cut))]), cut))
        # Every copy takes the label of the update it copies.
        self._set(labels[np.searchsorted(distinct, owner)], nearest, cut)
        return self

    def _gap_cut(self, matrix: np.ndarray, nearest: float) -> float:
        """The cut inside the largest jump of merge heights above the noise floor, or inf.

        Only jumps whose lower merge lies at or above ``nearest / min_gap`` count:
        merges inside a group reach at least the distance at which a typical
        update finds its nearest neighbour, so a merge a whole gap below it joins
        two unusually close updates of one group, not the top of a group.
        """
        if matrix.shape[0] < 3:
            return float("inf")
        tree = AgglomerativeClustering(
            n_clusters=1, linkage=self.linkage, metric=self.metric, compute_distances=True
        ).fit(matrix)
        heights = np.sort(tree.distances_)
        low, high = heights[:-1], heights[1:]
        above = low >= nearest / self.min_gap
        # The floor is > 0 (the updates are distinct): every counted ratio is finite.
        jumps = np.divide(high, low, out=np.ones_like(high), where=above)
        i = int(np.argmax(jumps))
        self.max_gap_ = float(jumps[i])
        self.margin_ = self._gap_margin(low, high, jumps, nearest / self.min_gap)
        if jumps[i] < self.min_gap:
            return float("inf")
        return float(np.sqrt(low[i] * high[i]))

    def _gap_margin(
        self, low: np.ndarray, high: np.ndarray, jumps: np.ndarray, floor: float
    ) -> float:
        """Smallest relative margin of the gap cut's decisions, ties logged.

        The largest jump against ``min_gap``; the runner-up against it when both
        reach ``min_gap`` (they cut at different heights); and the noise floor
        against a merge height whose jump reaches ``min_gap`` (counted or not).
        """
        order = np.argsort(jumps)[::-1]
        margins = [check_margin("FL+HC gap cut: largest jump >= min_gap", float(jumps[order[0]]),
                                self.min_gap)]
        if jumps.size > 1 and jumps[order[1]] >= self.min_gap:
            margins.append(check_margin("FL+HC gap cut: largest jump against the second",
                                        float(jumps[order[1]]), float(jumps[order[0]])))
        raw = high / np.where(low > 0, low, np.inf)
        for height in low[raw >= self.min_gap]:
            margin = abs(height - floor) / floor
            warn_tie("FL+HC gap cut: merge height >= noise floor", float(height), floor, margin)
            margins.append(margin)
        return float(min(margins))

    def describe_cut(self) -> str:
        """What the last :meth:`fit` compared to place its cut, in words for a log."""
        if self.threshold == "gap":
            n = self.num_points_ - self.num_distinct_
            copies = f"{n} cop{'y' if n == 1 else 'ies'} counted once; " if n else ""
            if np.isnan(self.max_gap_):
                return f"{copies}fewer than 3 distinct updates: one cluster"
            found = self.max_gap_ >= self.min_gap
            return (f"{copies}largest jump of merge heights above the noise floor "
                    f"{self.max_gap_:.3g} "
                    f"{'>=' if found else '<'} min gap {self.min_gap:.3g}: "
                    + (f"cut at {self.threshold_:.4g}" if found else "no cut, one cluster"))
        if self.threshold == "relative":
            return (f"cut at {self.distance_ratio:.3g} x median nearest distance "
                    f"{self.nearest_distance_:.4g} = {self.threshold_:.4g}")
        return f"cut at distance {self.threshold_:.4g}"

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
        self.num_points_ = int(labels.size)
        self.threshold_ = float(cut)
        self.nearest_distance_ = float(nearest)
