"""CFL (Sattler et al.): when a cluster splits, and into which two parts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.cluster import AgglomerativeClustering

from fl_clusters.clustering.similarity import _finite_matrix, pairwise_cosine, update_norms


def bipartition_by_cosine(similarity: np.ndarray) -> tuple[np.ndarray, float]:
    """Split clients in two by complete-linkage clustering of their cosine similarities.

    Parameters
    ----------
    similarity : np.ndarray
        (N, N) symmetric cosine-similarity matrix of the clients' updates, N >= 2.

    Returns
    -------
    labels : np.ndarray
        (N,) int array with values in {0, 1}; both values occur.
    max_cross_similarity : float
        Largest similarity between a client of part 0 and a client of part 1
        (CFL's alpha_cross_max; the split is sound when it is small).
    """
    matrix = _finite_matrix("similarity", similarity)
    if matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
        raise ValueError(
            f"similarity must be a square matrix with N >= 2, got shape {matrix.shape}"
        )
    # -similarity as the distance, as in the CFL authors' code: complete linkage
    # only compares distances, so any decreasing map of the similarity gives the
    # same two groups.
    labels = (
        AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
        .fit(-matrix)
        .labels_.astype(np.int64)
    )
    cross = matrix[np.ix_(labels == 0, labels == 1)]
    return labels, float(cross.max())


def should_split(mean_norm: float, max_norm: float, eps1: float, eps2: float) -> bool:
    """CFL's norm test: near a stationary point of the joint objective, not of every client's.

    Parameters
    ----------
    mean_norm : float
        Norm of the mean client update, ``||mean_i Delta_i||``.
    max_norm : float
        Largest client update norm, ``max_i ||Delta_i||``.
    eps1 : float
        Upper bound for ``mean_norm``, >= 0 (0.4 in the authors' demo).
    eps2 : float
        Lower bound for ``max_norm``, >= 0 (1.6 in the authors' demo).

    Returns
    -------
    bool
        ``mean_norm < eps1 and max_norm > eps2``.
    """
    for name, value in (("eps1", eps1), ("eps2", eps2)):
        if not value >= 0.0:
            raise ValueError(f"{name}={value} is outside [0, inf)")
    return bool(mean_norm < eps1 and max_norm > eps2)


@dataclass(frozen=True)
class CFLSplitDecision:
    """Outcome of CFL's split test on one cluster.

    Parameters
    ----------
    split : bool
        Whether the cluster splits.
    labels : np.ndarray
        (N,) int array in {0, 1}: the two new clusters when ``split`` is true,
        all zeros otherwise, so applying it is always correct.
    mean_norm : float
        Norm of the mean update.
    max_norm : float
        Largest client update norm.
    max_cross_similarity : float
        Largest similarity across the proposed bipartition (computed even when
        the norms do not qualify, for logging); NaN for fewer than 2 clients.
    """

    split: bool
    labels: np.ndarray
    mean_norm: float
    max_norm: float
    max_cross_similarity: float


MIN_SPLIT_MEMBERS = 3


def decide_cfl_split(
    updates: np.ndarray,
    eps1: float,
    eps2: float,
    gamma_max: float,
    *,
    norms_qualify: bool | None = None,
) -> CFLSplitDecision:
    """Decide whether one CFL cluster splits, from its members' updates this round.

    Pass only the updates of clients that trained this round: a client with no
    known update would otherwise be split arbitrarily.

    Parameters
    ----------
    updates : np.ndarray
        (N, D) updates of the cluster's clients that trained this round.
    eps1 : float
        Split only when the mean update norm is below it, >= 0.
    eps2 : float
        Split only when the largest client update norm is above it, >= 0.
    gamma_max : float
        Split only when the largest cross-partition cosine similarity is below
        it, in [-1, 1]; at 1 only exactly parallel updates on both sides block
        a split.
    norms_qualify : bool | None (default: None)
        The outcome of a norm test made by the caller (e.g.
        :func:`~fl_clusters.clustering.relative_split_gate`); ``None`` applies
        :func:`should_split` with ``eps1`` and ``eps2``.

    Returns
    -------
    CFLSplitDecision
        The decision with the norms and the cross similarity that led to it.
        A cluster with fewer than ``MIN_SPLIT_MEMBERS`` (3) clients never splits:
        the authors split only clusters of more than two, a split of two would
        leave two single clients without a federation.
    """
    if not -1.0 <= gamma_max <= 1.0:
        raise ValueError(f"gamma_max={gamma_max} is outside [-1, 1]")
    mean_norm, max_norm = update_norms(updates)
    if norms_qualify is None:
        norms_qualify = should_split(mean_norm, max_norm, eps1, eps2)
    count = len(updates)
    if count < 2:
        return CFLSplitDecision(False, np.zeros(count, dtype=np.int64), mean_norm, max_norm, np.nan)
    labels, max_cross = bipartition_by_cosine(pairwise_cosine(updates))
    split = norms_qualify and count >= MIN_SPLIT_MEMBERS and max_cross < gamma_max
    return CFLSplitDecision(
        split=split,
        labels=labels if split else np.zeros(count, dtype=np.int64),
        mean_norm=mean_norm,
        max_norm=max_norm,
        max_cross_similarity=max_cross,
    )
