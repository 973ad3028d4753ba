"""ACFL (Zhu, Gu, Sun 2024): similarity-ordered greedy clustering by positive incentive."""

from __future__ import annotations

import math

import numpy as np

from fl_clusters.clustering.margins import check_margin
from fl_clusters.clustering.similarity import _finite_matrix


def _square(similarity: np.ndarray) -> np.ndarray:
    """Validate a finite (N, N) similarity matrix with N >= 1."""
    matrix = _finite_matrix("similarity", similarity)
    if matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise ValueError(f"similarity must be a non-empty square matrix, got shape {matrix.shape}")
    return matrix


def order_by_similarity(similarity: np.ndarray, start: int) -> np.ndarray:
    """The other clients, most similar to ``start`` first.

    Parameters
    ----------
    similarity : np.ndarray
        (N, N) similarity matrix (ACFL: cosine of the last FedAvg round's updates).
    start : int
        Index of the start client, in [0, N - 1].

    Returns
    -------
    np.ndarray
        (N - 1,) int indices of every client but ``start``, by descending
        similarity to ``start``; equal similarities keep index order.
    """
    matrix = _square(similarity)
    if not 0 <= start < matrix.shape[0]:
        raise ValueError(f"start={start} is outside [0, {matrix.shape[0] - 1}]")
    order = np.argsort(-matrix[start], kind="stable")
    return order[order != start]


def incentive(global_acc: np.ndarray, local_acc: np.ndarray) -> float:
    """ACFL's incentive of a group: sum over members of (federated - local) accuracy.

    Parameters
    ----------
    global_acc : np.ndarray
        (G,) each member's local test accuracy under the group's federated model.
    local_acc : np.ndarray
        (G,) each member's local test accuracy under its own local-only model.

    Returns
    -------
    float
        ``sum(global_acc - local_acc)`` (eq. 8's left-hand side).
    """
    glob = np.asarray(global_acc, dtype=np.float64)
    local = np.asarray(local_acc, dtype=np.float64)
    if glob.ndim != 1 or glob.shape != local.shape:
        raise ValueError(
            f"global_acc and local_acc must be 1-D of equal length, got {glob.shape} "
            f"and {local.shape}"
        )
    if not (np.all(np.isfinite(glob)) and np.all(np.isfinite(local))):
        raise ValueError("global_acc and local_acc must hold only finite values")
    return float(np.sum(glob - local))


INCENTIVE_THRESHOLDS = ("beta", "noise")


def incentive_standard_error(
    global_acc: np.ndarray, local_acc: np.ndarray, num_samples: np.ndarray
) -> float:
    """Sampling noise of :func:`incentive`: its standard error over the validation splits.

    Each member's gain ``a_fed - a_loc`` is a difference of two accuracies measured
    on its ``n`` validation samples; treated as independent, its variance is
    ``(a_fed (1 - a_fed) + a_loc (1 - a_loc)) / n``, and the members' variances add
    up. Both models are scored on the same samples, so the paired variance is
    smaller: this errs on the side of a wider tolerance.

    Parameters
    ----------
    global_acc, local_acc : np.ndarray
        (G,) as in :func:`incentive`, each in [0, 1].
    num_samples : np.ndarray
        (G,) validation samples behind each member's accuracies, all > 0.

    Returns
    -------
    float
        ``sqrt(sum over members of the gain's variance)``.
    """
    incentive(global_acc, local_acc)  # validates shapes and values
    glob = np.asarray(global_acc, dtype=np.float64)
    local = np.asarray(local_acc, dtype=np.float64)
    counts = np.asarray(num_samples, dtype=np.float64)
    if counts.shape != glob.shape or not np.all(np.isfinite(counts)) or np.any(counts <= 0):
        raise ValueError(
            f"num_samples must hold one count > 0 per member ({glob.shape[0]}), got "
            f"{np.asarray(num_samples).tolist()}"
        )
    if np.any((glob < 0) | (glob > 1) | (local < 0) | (local > 1)):
        raise ValueError("accuracies must lie in [0, 1]")
    variance = (glob * (1 - glob) + local * (1 - local)) / counts
    return float(np.sqrt(variance.sum()))


def has_positive_incentive(
    global_acc: np.ndarray, local_acc: np.ndarray, beta: float = -0.17
) -> bool:
    """Eq. 8: the group benefits from federating when its incentive is at least ``beta``.

    Parameters
    ----------
    global_acc : np.ndarray
        (G,) members' accuracies under the group's federated model.
    local_acc : np.ndarray
        (G,) members' accuracies under their local-only models.
    beta : float (default: -0.17)
        Threshold on the summed accuracy difference (the paper's best value).

    Returns
    -------
    bool
        ``incentive(global_acc, local_acc) >= beta``; closer than ``TIE_TOLERANCE``
        (in accuracy units) is logged as a tie.
    """
    value = incentive(global_acc, local_acc)
    # Accuracies are fractions in [0, 1]: the margin is absolute, beta may be 0.
    check_margin("ACFL trial: incentive >= threshold", value, beta, scale=1.0)
    return value >= beta


class GreedyIncentiveClustering:
    """ACFL's clustering as a state machine the server drives, one federated trial at a time.

    A cluster opens at a start client drawn at random among the unplaced ones.
    The other unplaced clients are tried in order of descending similarity to
    the start client: each trial federates the cluster plus the candidate, and
    the candidate joins when the group shows positive incentive (eq. 8): its
    incentive is at least ``beta`` (``threshold="beta"``, the paper's rule), or
    (``threshold="noise"``) the incentive is at least ``-noise_z`` standard errors
    of itself (:func:`incentive_standard_error`) and the candidate's own gain at
    least ``-noise_z`` standard errors of that gain: tolerances that follow the
    members' validation sizes and the group's size instead of one number for every
    data set, and a newcomer that federating harms is not admitted because the
    members gain a little each.
    A rejected candidate stays unplaced for later clusters. The cluster closes
    when the list is exhausted or after ``m`` consecutive rejections; then the
    next cluster opens, until every client is placed. A cluster may end as a
    singleton.

    ``m`` adapts to the pool, as the paper asks without giving a formula:
    ``m = max(1, ceil(max_rejections * U / N))`` with ``U`` the unplaced clients
    outside the open cluster. It starts at ``max_rejections`` and shrinks as
    clients are placed: the fewer candidates remain, the fewer failures it takes
    to be sure the similarity order has moved past the cluster's members, and
    the total number of trials stays O(N).

    Typical use::

        acfl = GreedyIncentiveClustering(pairwise_cosine(updates), seed=0)
        while (group := acfl.next_trial()) is not None:
            # one federated round among `group`, then each member's accuracy
            acfl.report(global_acc, local_acc)
        labels = acfl.labels_

    Parameters
    ----------
    similarity : np.ndarray
        (N, N) similarity of the clients (cosine of their last updates).
    beta : float (default: -0.17)
        Incentive threshold of :func:`has_positive_incentive` (``threshold="beta"``).
    max_rejections : int (default: 3)
        Largest number ``m`` of consecutive rejections that closes a cluster, >= 1.
    seed : int or None (default: None)
        Seed of the start-client draws.
    threshold : str (default: "beta")
        ``"beta"``: admit when the incentive is at least ``beta``. ``"noise"``: admit
        when it is at least ``-noise_z`` times its standard error and so is the
        candidate's own gain; :meth:`report` then needs each member's validation
        size. The ACFL strategy uses ``"noise"`` by default (measured in
        docs/clustering-defaults.md); ``"beta"`` here keeps the paper's rule for
        callers without validation sizes.
    noise_z : float (default: 2.0)
        Tolerance of ``threshold="noise"`` in standard errors, >= 0.

    Attributes
    ----------
    labels_ : np.ndarray
        (N,) int cluster of every client, numbered in closing order; -1 while a
        client is not yet placed. Final once :attr:`done`.
    num_clusters_ : int
        Clusters closed so far.
    num_trials_ : int
        Trials reported so far (federated rounds spent on clustering).
    """

    def __init__(
        self,
        similarity: np.ndarray,
        beta: float = -0.17,
        max_rejections: int = 3,
        seed: int | None = None,
        threshold: str = "beta",
        noise_z: float = 2.0,
    ) -> None:
        if not math.isfinite(beta):
            raise ValueError(f"beta={beta} must be a finite number")
        if threshold not in INCENTIVE_THRESHOLDS:
            raise ValueError(f"threshold={threshold!r} must be one of {INCENTIVE_THRESHOLDS}")
        if not (math.isfinite(noise_z) and noise_z >= 0):
            raise ValueError(f"noise_z={noise_z} must be a finite number >= 0")
        self.threshold = threshold
        self.noise_z = noise_z
        if max_rejections < 1:
            raise ValueError(f"max_rejections={max_rejections} is outside [1, inf)")
        self.similarity = _square(similarity)
        self.beta = beta
        self.max_rejections = max_rejections
        self.labels_ = np.full(self.similarity.shape[0], -1, dtype=np.int64)
        self.num_clusters_ = 0
        self.num_trials_ = 0
        self._rng = np.random.default_rng(seed)
        self._cluster: list[int] = []
        self._candidates: list[int] = []
        self._rejections = 0
        self._pending: np.ndarray | None = None
        self._advance()

    @property
    def done(self) -> bool:
        """Whether every client is placed."""
        return self._pending is None

    @property
    def rejection_limit(self) -> int:
        """Current ``m``: consecutive rejections that close the open cluster."""
        unplaced = int(np.count_nonzero(self.labels_ < 0)) - len(self._cluster)
        return max(1, math.ceil(self.max_rejections * unplaced / self.labels_.size))

    def next_trial(self) -> np.ndarray | None:
        """Members of the next trial group, or None when every client is placed.

        Returns
        -------
        np.ndarray or None
            int indices: the open cluster's members, then the candidate last.
            The same group is returned until :meth:`report` is called.
        """
        return None if self._pending is None else self._pending.copy()

    def threshold_for(
        self,
        global_acc: np.ndarray,
        local_acc: np.ndarray,
        num_samples: np.ndarray | None = None,
    ) -> float:
        """The incentive a trial group with these scores must reach to admit its candidate.

        With ``threshold="noise"`` the candidate's own gain is checked as well
        (:meth:`report`).
        """
        if self.threshold == "beta":
            return self.beta
        if num_samples is None:
            raise ValueError('threshold="noise" needs each member\'s validation size '
                             "(num_samples)")
        return -self.noise_z * incentive_standard_error(global_acc, local_acc, num_samples)

    def report(
        self,
        global_acc: np.ndarray,
        local_acc: np.ndarray,
        num_samples: np.ndarray | None = None,
    ) -> bool:
        """Record the outcome of the pending trial.

        Parameters
        ----------
        global_acc : np.ndarray
            (G,) accuracy of each member of the trial group, in
            :meth:`next_trial`'s order, under the group's federated model.
        local_acc : np.ndarray
            (G,) the same members' accuracies under their local-only models.
        num_samples : np.ndarray or None (default: None)
            (G,) the members' validation sizes; needed by ``threshold="noise"``.

        Returns
        -------
        bool
            Whether the candidate joined the cluster.
        """
        if self._pending is None:
            raise RuntimeError("no trial is pending: every client is already placed")
        size = self._pending.size
        if np.shape(global_acc) != (size,) or np.shape(local_acc) != (size,):
            raise ValueError(
                f"global_acc and local_acc must each hold {size} accuracies (one per "
                f"member of the trial group), got shapes {np.shape(global_acc)} and "
                f"{np.shape(local_acc)}"
            )
        accepted = has_positive_incentive(
            global_acc, local_acc, self.threshold_for(global_acc, local_acc, num_samples)
        )
        if accepted and self.threshold == "noise":
            # The sum can hide a newcomer's loss behind the members' small gains;
            # it must not lose beyond its own noise either.
            accepted = has_positive_incentive(
                global_acc[-1:], local_acc[-1:],
                -self.noise_z * incentive_standard_error(
                    global_acc[-1:], local_acc[-1:], np.asarray(num_samples)[-1:]
                ),
            )
        self.num_trials_ += 1
        candidate = self._candidates.pop(0)
        if accepted:
            self._cluster.append(candidate)
            self._rejections = 0
        else:
            self._rejections += 1
        self._advance()
        return accepted

    def _advance(self) -> None:
        """Set the next pending trial, closing finished clusters and opening new ones."""
        while True:
            if self._cluster and self._candidates and self._rejections < self.rejection_limit:
                self._pending = np.array([*self._cluster, self._candidates[0]], dtype=np.int64)
                return
            if self._cluster:
                self.labels_[self._cluster] = self.num_clusters_
                self.num_clusters_ += 1
                self._cluster = []
            unplaced = np.flatnonzero(self.labels_ < 0)
            if unplaced.size == 0:
                self._pending = None
                return
            start = int(self._rng.choice(unplaced))
            self._cluster = [start]
            self._candidates = [
                int(j) for j in order_by_similarity(self.similarity, start) if self.labels_[j] < 0
            ]
            self._rejections = 0
