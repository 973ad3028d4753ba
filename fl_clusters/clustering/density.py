"""FLDC (Wang and Li 2025): DBSCAN over client models and stratified client sampling."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import DBSCAN
from sklearn.metrics import silhouette_score
from sklearn.neighbors import NearestNeighbors

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
    # kneighbors() without a query excludes each point from its own neighbours.
    distances, _ = NearestNeighbors(n_neighbors=k).fit(matrix).kneighbors()
    return np.sort(distances[:, k - 1].astype(np.float64))


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
    points: np.ndarray, min_samples: int, candidates: np.ndarray
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
        (C,) eps values to try, each > 0.

    Returns
    -------
    tuple
        ``(eps, scores)``: the best candidate (``None`` if none gave two clusters)
        and every candidate's score (NaN for none).
    """
    matrix = _finite_matrix("points", points)
    grid = np.asarray(candidates, dtype=np.float64)
    if min_samples < 2:
        raise ValueError(f"min_samples={min_samples} is outside [2, inf)")
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid) & (grid > 0)):
        raise ValueError("candidates must be a non-empty 1-D array of eps values > 0")
    scores = np.full(grid.size, np.nan)
    for i, eps in enumerate(grid):
        labels = DBSCAN(eps=float(eps), min_samples=min_samples).fit(matrix).labels_
        clustered = labels >= 0
        # Silhouette needs 2 <= clusters <= points - 1 among the clustered points.
        if 2 <= np.unique(labels[clustered]).size < np.count_nonzero(clustered):
            # Weighted by the share of points clustered: the silhouette of the
            # clustered points alone rewards a small eps that calls most points noise.
            share = float(clustered.mean())
            scores[i] = silhouette_score(matrix[clustered], labels[clustered]) * share
    if np.all(np.isnan(scores)):
        return None, scores
    return float(grid[int(np.nanargmax(scores))]), scores


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
        Radius used.
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
        self.k_distances_ = k_distance_curve(matrix, self.min_samples - 1)
        eps = self.eps if self.eps is not None else knee_eps(self.k_distances_)
        self.eps_scores_ = np.zeros(0)
        if self.eps is None and self.eps_method == "silhouette":
            positive = self.k_distances_[self.k_distances_ > 0]
            if positive.size:
                candidates = np.unique(np.quantile(positive,
                                                   np.linspace(0, 1, self.num_candidates)))
                best, self.eps_scores_ = silhouette_eps(matrix, self.min_samples, candidates)
                eps = best if best is not None else eps
        # DBSCAN rejects eps = 0, which the knee gives when models coincide; the
        # smallest positive float keeps "distance <= eps" meaning "identical".
        self.eps_ = max(float(eps), float(np.finfo(np.float64).tiny))
        dbscan = DBSCAN(eps=self.eps_, min_samples=self.min_samples).fit(matrix)
        self.labels_ = dbscan.labels_
        self.core_points_ = matrix[dbscan.core_sample_indices_]
        self.core_labels_ = dbscan.labels_[dbscan.core_sample_indices_]
        clustered = self.labels_ >= 0
        self.num_noise_ = int(np.count_nonzero(~clustered))
        self.num_clusters_ = int(np.unique(self.labels_[clustered]).size)
        self.silhouette_ = (
            float(silhouette_score(matrix[clustered], self.labels_[clustered]))
            if self.num_clusters_ >= 2
            else float("nan")
        )
        return self

    def predict(self, points: np.ndarray) -> np.ndarray:
        """DBSCAN's rule for new points: the cluster of the nearest core point within eps.

        Parameters
        ----------
        points : np.ndarray
            (M, D) new points of the fitted dimension.

        Returns
        -------
        np.ndarray
            (M,) int labels, -1 (noise) where no core point lies within ``eps_``.
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
        distances, nearest = NearestNeighbors(n_neighbors=1).fit(self.core_points_).kneighbors(
            self._scaled(matrix)
        )
        within = distances[:, 0] <= self.eps_
        labels[within] = self.core_labels_[nearest[within, 0]]
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
