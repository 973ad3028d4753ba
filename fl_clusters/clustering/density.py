"""FLDC (Wang and Li 2025): DBSCAN over client models and stratified client sampling."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import DBSCAN
from sklearn.metrics import silhouette_score

from fl_clusters.clustering.margins import TIE_TOLERANCE, pairwise_euclidean, warn_tie
from fl_clusters.clustering.similarity import _finite_matrix

EPS_METHODS = ("knee", "silhouette")

def k_distance_curve(points: np.ndarray, k: int) -> np.ndarray:
    """Sorted distances from every point to its k-th nearest other point.

    The point itself does not count as its own neighbour: ``k=1`` is the distance
    to the closest other point. sklearn's DBSCAN counts the point itself in
    ``min_samples``, so a point is a core point for radius ``eps`` exactly when
    its distance for ``k = min_samples - 1`` is at most ``eps``.

    Parameters
    ----------
    points : np.ndarray
        (N, D) points, e.g. flattened client models.
    k : int
        Neighbour rank, in [1, N - 1].

    Returns
    -------
    np.ndarray
        (N,) float64 Euclidean distances in ascending order.
    """
    matrix = _finite_matrix("points", points)
    if not 1 <= k <= matrix.shape[0] - 1:
        raise ValueError(
            f"k={k} is outside [1, {matrix.shape[0] - 1}] for {matrix.shape[0]} points"
        )
    return _k_distances(pairwise_euclidean(matrix), k)


def _k_distances(distances: np.ndarray, k: int) -> np.ndarray:
    """:func:`k_distance_curve` from the (N, N) distance matrix DBSCAN is given."""
    # Each row sorted holds the point's own 0 first among its zeros, so entry k is
    # the k-th nearest other point, copies of the point included.
    return np.sort(np.sort(distances, axis=1)[:, k])


def clear_radius(
    eps: float, distances: np.ndarray, tolerance: float = TIE_TOLERANCE
) -> tuple[float, float]:
    """The radius DBSCAN compares with: ``eps``'s neighbourhoods, away from every distance.

    The knee (and a silhouette candidate at a quantile end) is itself a pairwise
    distance, and another pair may lie an ulp from it: ``distance <= eps`` then
    follows the rounding of the machine. Distances within ``tolerance`` (relative)
    above ``eps`` count as equal to it, thus within (``<=``), and the radius is
    the midpoint of the gap between the largest distance counted in and the
    smallest left out. An ``eps`` already clear of every distance is kept.

    Parameters
    ----------
    eps : float
        The chosen eps, >= 0.
    distances : np.ndarray
        Every pairwise distance, >= 0.
    tolerance : float (default: TIE_TOLERANCE)
        Relative margin below which a distance counts as a tie.

    Returns
    -------
    tuple[float, float]
        ``(radius, margin)``: the radius, > 0, and the relative margin of the
        distance nearest to it, ``min |d - radius| / radius``. A margin below
        ``tolerance`` (distances packed closer than it around eps) is logged
        as a tie.
    """
    values = np.unique(np.asarray(distances, dtype=np.float64))
    radius = float(eps)
    if radius > 0.0 and values.size and np.min(np.abs(values - radius)) >= tolerance * radius:
        return radius, float(np.min(np.abs(values - radius)) / radius)
    inside = values[values <= radius * (1.0 + tolerance)]
    outside = values[values > radius * (1.0 + tolerance)]
    lower = float(inside[-1]) if inside.size else 0.0
    # With no distance above, any radius beyond the largest keeps every pair in.
    upper = float(outside[0]) if outside.size else 2.0 * max(lower, radius)
    # DBSCAN rejects 0, which all-equal points give: the smallest positive float
    # keeps "distance <= radius" meaning "identical".
    radius = max((lower + upper) / 2.0, float(np.finfo(np.float64).tiny))
    margin = float(np.min(np.abs(values - radius)) / radius) if values.size else np.inf
    warn_tie("FLDC DBSCAN neighbourhood (distance <= eps)", lower, radius, margin, tolerance)
    return radius, margin


def knee_eps(curve: np.ndarray) -> float:
    """Value at the knee of an ascending k-distance curve (the kneedle idea).

    Both axes are scaled to [0, 1] so the knee does not depend on the distance
    unit; the knee is the point furthest below the chord from the first to the
    last point. Left of it the distances grow slowly (dense regions); right of
    it they shoot up (sparse points, noise).

    Parameters
    ----------
    curve : np.ndarray
        (N,) non-decreasing distances, N >= 1, as from :func:`k_distance_curve`.

    Returns
    -------
    float
        The curve's value at the knee. A flat curve returns its value. A curve
        that is not convex, i.e. lies on average on or above the chord
        (straight or concave, so no density structure), returns its last
        value, which puts every point in one neighbourhood rather than
        declaring most of them noise. A small bump below the chord on such a
        curve is noise, not a knee: one CI run's curve of 20 skewed digits
        clients rose by a third of its range over its first 4 points, yet a
        dip at its third point made that the knee and 16 clients noise.
    """
    values = np.asarray(curve, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise ValueError(f"curve must be a non-empty finite 1-D array, got shape {values.shape}")
    if np.any(np.diff(values) < 0):
        raise ValueError("curve must be sorted in ascending order")
    rise = values[-1] - values[0]
    if values.size < 3 or rise == 0.0:
        return float(values[-1])
    x = np.linspace(0.0, 1.0, values.size)
    y = (values - values[0]) / rise
    # In the scaled frame the chord is y = x, so x - y is proportional to the
    # distance below it; its mean is the signed area between chord and curve.
    gap = x - y
    if gap.mean() <= 0.0:
        return float(values[-1])
    return float(values[int(np.argmax(gap))])


def silhouette_eps(
    points: np.ndarray, min_samples: int, candidates: np.ndarray,
    distances: np.ndarray | None = None,
) -> tuple[float | None, np.ndarray]:
    """The eps of ``candidates`` whose DBSCAN clustering has the best silhouette.

    Our search, not the paper's: FLDC's table 5 scores eps values by the
    silhouette to validate the knee it picks; this picks eps by that score
    over a grid of the curve's quantiles. A candidate's score is the silhouette
    of its clustered points times the share of points it clusters (noise counts
    against it); one that leaves fewer than two clusters has no score (NaN) and
    is never chosen.

    Parameters
    ----------
    points : np.ndarray
        (N, D) points (flattened client models).
    min_samples : int
        DBSCAN's MinPts, >= 2.
    candidates : np.ndarray
        (C,) eps values to try, each > 0; DBSCAN compares with each one's
        :func:`clear_radius`.
    distances : np.ndarray or None (default: None)
        (N, N) distances of ``points`` (:func:`~fl_clusters.clustering.margins.
        pairwise_euclidean`), when the caller has them already.

    Returns
    -------
    tuple
        ``(eps, scores)``: the best candidate (``None`` if none gave two clusters)
        and every candidate's score (NaN for none). Two different best scores
        closer than ``TIE_TOLERANCE`` are logged as a tie.
    """
    matrix = _finite_matrix("points", points)
    grid = np.asarray(candidates, dtype=np.float64)
    if min_samples < 2:
        raise ValueError(f"min_samples={min_samples} is outside [2, inf)")
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError("candidates must be a non-empty 1-D array of eps values > 0")
    table = pairwise_euclidean(matrix) if distances is None else distances
    pairs = table[np.triu_indices(table.shape[0], 1)]
    scores = np.full(grid.size, np.nan)
    for i, eps in enumerate(grid):
        radius, _ = clear_radius(float(eps), pairs)
        labels = DBSCAN(eps=radius, min_samples=min_samples, metric="precomputed").fit(
            table).labels_
        clustered = labels >= 0
        # Silhouette needs 2 <= clusters <= points - 1 among the clustered points.
        if 2 <= np.unique(labels[clustered]).size < np.count_nonzero(clustered):
            # Weighted by the share of points clustered: the silhouette of the
            # clustered points alone rewards a small eps that calls most points noise.
            share = float(clustered.mean())
            scores[i] = _silhouette(table, labels) * share
    if np.all(np.isnan(scores)):
        return None, scores
    _report_score_tie(scores)
    return float(grid[int(np.nanargmax(scores))]), scores


def _report_score_tie(scores: np.ndarray) -> None:
    """Warn when the two best distinct silhouette scores are a tie (absolute margin)."""
    # Equal clusterings score bit-equal (one distance matrix): only distinct ones tie.
    best = np.unique(scores[~np.isnan(scores)])[::-1][:2]
    if best.size == 2:
        warn_tie("FLDC silhouette choice of eps (best against second best score)",
                 float(best[1]), float(best[0]), float(best[0] - best[1]))


def _silhouette(distances: np.ndarray, labels: np.ndarray) -> float:
    """Silhouette of the clustered points (label >= 0) from the precomputed distances."""
    clustered = labels >= 0
    within = distances[np.ix_(clustered, clustered)]
    return float(silhouette_score(within, labels[clustered], metric="precomputed"))


class DensityClustering:
    """DBSCAN over client models with eps from the k-distance knee (FLDC).

    Parameters
    ----------
    min_samples : int (default: 4)
        DBSCAN's MinPts, counting the point itself (sklearn's convention), >= 2.
        The paper uses 4.
    eps : float or None (default: None)
        Neighbourhood radius, > 0; None chooses it by ``eps_method``.
    eps_method : str (default: "knee")
        How eps is chosen when not given: ``"knee"`` of the (min_samples - 1)-
        distance curve, or ``"silhouette"``: the best silhouette over a grid of
        ``num_candidates`` quantiles of that curve (our search: the paper's table 5
        uses the silhouette to validate the knee), the knee when no candidate gives
        two clusters.
    num_candidates : int (default: 20)
        Size of the silhouette grid, >= 1.
    standardize : bool (default: False)
        Whether each coordinate is scaled to mean 0 and standard deviation 1 over
        the fitted points before the Euclidean distance (coordinates equal in every
        point are left out: they tell no point apart). Unscaled, a few coordinates
        that move far in every point (a model's output biases) outweigh thousands
        that move less but alike within a group; ``eps_`` and ``k_distances_`` are
        then in standardized units.

    Attributes
    ----------
    labels_ : np.ndarray
        (N,) int cluster labels, -1 for noise.
    eps_ : float
        The eps given or chosen (the knee's k-distance, a silhouette candidate).
    radius_ : float
        The radius DBSCAN compared distances with: ``eps_`` moved off the pairwise
        distances into the middle of the gap around it (:func:`clear_radius`),
        so ``distance <= eps`` does not follow rounding noise; distances within
        ``TIE_TOLERANCE`` (relative) above ``eps_`` count as within it.
    eps_margin_ : float
        Relative margin of that decision: ``min |d - radius_| / radius_`` over
        the pairwise distances d.
    num_clusters_ : int
        Number of clusters found (noise excluded).
    num_noise_ : int
        Number of noise points.
    silhouette_ : float
        Euclidean silhouette score over the non-noise points; NaN with fewer
        than 2 clusters.
    k_distances_ : np.ndarray
        (N,) ascending (min_samples - 1)-distance curve, computed whether or
        not ``eps`` was given.
    core_points_, core_labels_ : np.ndarray
        DBSCAN's core points (standardized if ``standardize``) and their labels,
        for :meth:`predict`.
    eps_scores_ : np.ndarray
        Silhouette of each grid candidate (``eps_method="silhouette"``), else empty.
    """

    def __init__(
        self,
        min_samples: int = 4,
        eps: float | None = None,
        eps_method: str = "knee",
        num_candidates: int = 20,
        standardize: bool = False,
    ) -> None:
        if min_samples < 2:
            raise ValueError(f"min_samples={min_samples} is outside [2, inf)")
        if eps is not None and not eps > 0.0:
            raise ValueError(f"eps={eps} is outside (0, inf); pass None to use the knee")
        if eps_method not in EPS_METHODS:
            raise ValueError(f"eps_method={eps_method!r} is not one of {EPS_METHODS}")
        if num_candidates < 1:
            raise ValueError(f"num_candidates={num_candidates} is outside [1, inf)")
        self.min_samples = min_samples
        self.eps = eps
        self.eps_method = eps_method
        self.num_candidates = num_candidates
        self.standardize = standardize

    def _scaled(self, matrix: np.ndarray) -> np.ndarray:
        """``matrix`` in the coordinates the distances are taken in (see ``standardize``)."""
        if not self.standardize:
            return matrix
        if not self._varying.any():
            # Every fitted point is the same: all distances are 0, as unscaled.
            return np.zeros((matrix.shape[0], 1))
        return (matrix[:, self._varying] - self._centre) / self._scale

    def fit(self, points: np.ndarray) -> DensityClustering:
        """Cluster ``points``.

        Parameters
        ----------
        points : np.ndarray
            (N, D) points (flattened client models), N >= ``min_samples``.

        Returns
        -------
        DensityClustering
            ``self``, with the fitted attributes set.
        """
        matrix = _finite_matrix("points", points)
        if matrix.shape[0] < self.min_samples:
            raise ValueError(
                f"points has {matrix.shape[0]} rows; DBSCAN with min_samples="
                f"{self.min_samples} needs at least that many"
            )
        self.num_features_ = matrix.shape[1]
        if self.standardize:
            wide = matrix.astype(np.float64)
            spread = wide.std(axis=0)
            self._varying = spread > 0
            self._centre = wide.mean(axis=0)[self._varying]
            self._scale = spread[self._varying]
        matrix = self._scaled(matrix)
        # One distance matrix for the knee, the neighbourhoods and the silhouette:
        # a pair compared twice is then the same number both times.
        distances = pairwise_euclidean(matrix)
        self.k_distances_ = _k_distances(distances, self.min_samples - 1)
        self.eps_ = self._choose_eps(matrix, distances)
        self.radius_, self.eps_margin_ = clear_radius(
            self.eps_, distances[np.triu_indices(distances.shape[0], 1)])
        dbscan = DBSCAN(eps=self.radius_, min_samples=self.min_samples,
                        metric="precomputed").fit(distances)
        self.labels_ = dbscan.labels_
        self.core_points_ = matrix[dbscan.core_sample_indices_]
        self.core_labels_ = dbscan.labels_[dbscan.core_sample_indices_]
        clustered = self.labels_ >= 0
        self.num_noise_ = int(np.count_nonzero(~clustered))
        self.num_clusters_ = int(np.unique(self.labels_[clustered]).size)
        self.silhouette_ = (
            _silhouette(distances, self.labels_) if self.num_clusters_ >= 2 else float("nan")
        )
        return self

    def _choose_eps(self, matrix: np.ndarray, distances: np.ndarray) -> float:
        """The given eps, or the one ``eps_method`` reads off the k-distance curve."""
        eps = self.eps if self.eps is not None else knee_eps(self.k_distances_)
        self.eps_scores_ = np.zeros(0)
        if self.eps is None and self.eps_method == "silhouette":
            positive = self.k_distances_[self.k_distances_ > 0]
            if positive.size:
                candidates = np.unique(np.quantile(positive,
                                                   np.linspace(0, 1, self.num_candidates)))
                best, self.eps_scores_ = silhouette_eps(matrix, self.min_samples, candidates,
                                                        distances)
                eps = best if best is not None else eps
        return float(eps)

    def predict(self, points: np.ndarray) -> np.ndarray:
        """DBSCAN's rule for new points: the cluster of the nearest core point within eps
        (within ``radius_``, the radius the fitted points were compared with).

        Parameters
        ----------
        points : np.ndarray
            (M, D) new points of the fitted dimension.

        Returns
        -------
        np.ndarray
            (M,) int labels, -1 (noise) where no core point lies within ``radius_``.
        """
        matrix = _finite_matrix("points", points)
        if not hasattr(self, "core_points_"):
            raise ValueError("call fit() before predict()")
        if matrix.shape[1] != self.num_features_:
            raise ValueError(
                f"points have {matrix.shape[1]} columns; the fitted points had "
                f"{self.num_features_}"
            )
        labels = np.full(matrix.shape[0], -1, dtype=np.int64)
        if self.core_points_.shape[0] == 0:
            return labels
        distances = pairwise_euclidean(self._scaled(matrix), self.core_points_)
        nearest = np.argmin(distances, axis=1)
        within = distances[np.arange(matrix.shape[0]), nearest] <= self.radius_
        labels[within] = self.core_labels_[nearest[within]]
        return labels


def stratified_sample(labels: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    """FLDC's per-round client sample: a fraction ``r`` of every cluster, at least one.

    Parameters
    ----------
    labels : np.ndarray
        (N,) int cluster labels; -1 (noise) is never sampled.
    r : float
        Sampling fraction, in (0, 1] (0.2 in the paper).
    rng : np.random.Generator
        Source of randomness.

    Returns
    -------
    np.ndarray
        Sorted int indices into ``labels``: from each cluster T, max(round(r|T|), 1)
        members drawn without replacement, rounding halves up. Empty when every
        label is -1.
    """
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r={r} is outside (0, 1]")
    values = np.asarray(labels)
    if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {values.dtype} {values.shape}")
    chosen = []
    for cluster in np.unique(values[values >= 0]):
        members = np.flatnonzero(values == cluster)
        # Half up rather than Python's round-half-to-even, so 2.5 clients become 3.
        size = max(int(np.floor(r * members.size + 0.5)), 1)
        chosen.append(rng.choice(members, size=size, replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
