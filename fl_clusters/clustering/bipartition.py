"""CFL (Sattler et al.): when a cluster splits, and into which two parts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import silhouette_score

from fl_clusters.clustering.margins import check_margin
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


def cluster_structure_score(
    similarity: np.ndarray, max_clusters: int = 10
) -> tuple[float, int]:
    """How clearly the clients' updates fall into groups: the best silhouette over k.

    The clients are clustered by complete linkage of their cosine distances
    (``1 - similarity``) into k = 2 .. ``min(max_clusters, max(2, N // 2))``
    clusters; the score is the largest silhouette of these clusterings. Updates
    of distinct data distributions form tight groups (score 0.5-0.9 measured),
    while the updates of one distribution differ only by their clients' sample
    noise (score 0.05-0.3). The silhouette of the bipartition alone would not do:
    with many groups, each half holds several of them and its silhouette falls
    with their number even when every group is tight.

    Parameters
    ----------
    similarity : np.ndarray
        (N, N) symmetric cosine-similarity matrix of the clients' updates, N >= 3.
    max_clusters : int (default: 10)
        Largest number of clusters tried, >= 2.

    Returns
    -------
    score : float
        The best silhouette, in [-1, 1].
    num_clusters : int
        The k that reached it.
    """
    matrix = _finite_matrix("similarity", similarity)
    if matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 3:
        raise ValueError(
            f"similarity must be a square matrix with N >= 3, got shape {matrix.shape}"
        )
    if max_clusters < 2:
        raise ValueError(f"max_clusters={max_clusters} must be >= 2")
    distance = np.clip(1.0 - matrix, 0.0, None)
    np.fill_diagonal(distance, 0.0)
    # One complete-linkage tree, cut at every k: refitting per k rebuilds the same tree.
    tree = linkage(squareform(distance, checks=False), method="complete")
    best, best_k = -1.0, 2
    for k in range(2, min(max_clusters, max(2, matrix.shape[0] // 2)) + 1):
        labels = fcluster(tree, k, criterion="maxclust")
        if len(np.unique(labels)) < 2:  # all distances tied: no cut separates anyone
            continue
        score = float(silhouette_score(distance, labels, metric="precomputed"))
        if score > best:
            best, best_k = score, k
    return best, best_k


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
        ``mean_norm < eps1 and max_norm > eps2``; either comparison closer than
        ``TIE_TOLERANCE`` (relative) is logged as a tie.
    """
    for name, value in (("eps1", eps1), ("eps2", eps2)):
        if not value >= 0.0:
            raise ValueError(f"{name}={value} is outside [0, inf)")
    check_margin("CFL norm test: mean norm < eps1", mean_norm, eps1)
    check_margin("CFL norm test: max norm > eps2", max_norm, eps2)
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
    structure_score : float
        :func:`cluster_structure_score` of the updates; NaN where it did not
        decide (another test already refused the split, or the test is off).
    refusal : str
        Why the cluster did not split, in words for the log (the first test
        that refused it); empty when it splits.
    margin : float
        Smallest margin of the cross-similarity and group-silhouette tests that
        decided (absolute, both lie in [-1, 1]); inf when neither decided.
    """

    split: bool
    labels: np.ndarray
    mean_norm: float
    max_norm: float
    max_cross_similarity: float
    structure_score: float = np.nan
    refusal: str = ""
    margin: float = np.inf


# The authors split only clusters of more than two: a split of two would leave two
# single clients without a federation.
MIN_SPLIT_MEMBERS = 3


def decide_cfl_split(
    updates: np.ndarray, eps1: float, eps2: float, gamma_max: float, *,
    norms_qualify: bool | None = None, min_structure: float = -1.0,
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
        :func:`~fl_clusters.clustering.coherence_split_gate`); ``None`` applies
        :func:`should_split` with ``eps1`` and ``eps2``.
    min_structure : float (default: -1.0)
        Split only when :func:`cluster_structure_score` of the updates is at
        least this, in [-1, 1]; -1 turns the test off (the paper has none).
        It keeps a cluster whose members' updates differ only by sample noise
        from being cut where the cross similarity happens to fall below
        ``gamma_max``.

    Returns
    -------
    CFLSplitDecision
        The decision with the norms and the cross similarity that led to it; a
        cluster with fewer than ``MIN_SPLIT_MEMBERS`` (3) clients never splits.
    """
    for name, value in (("gamma_max", gamma_max), ("min_structure", min_structure)):
        if not -1.0 <= value <= 1.0:
            raise ValueError(f"{name}={value} is outside [-1, 1]")
    mean_norm, max_norm = update_norms(updates)
    if norms_qualify is None:
        norms_qualify = should_split(mean_norm, max_norm, eps1, eps2)
    count = len(updates)
    if count < 2:
        return CFLSplitDecision(False, np.zeros(count, dtype=np.int64), mean_norm, max_norm,
                                np.nan, refusal=f"{count} trained member, a split needs "
                                f"{MIN_SPLIT_MEMBERS}")
    similarity = pairwise_cosine(updates)
    labels, max_cross = bipartition_by_cosine(similarity)
    refusal, structure = _split_refusal(similarity, max_cross, norms_qualify, gamma_max,
                                        min_structure)
    return CFLSplitDecision(
        split=not refusal, labels=np.zeros(count, dtype=np.int64) if refusal else labels,
        mean_norm=mean_norm, max_norm=max_norm, max_cross_similarity=max_cross,
        structure_score=structure, refusal=refusal, margin=_split_margin(
            max_cross if norms_qualify and count >= MIN_SPLIT_MEMBERS else np.nan, gamma_max,
            structure, min_structure),
    )


def _split_margin(
    max_cross: float, gamma_max: float, structure: float, min_structure: float
) -> float:
    """Smallest absolute margin of the split tests that decided (NaN: did not), ties logged."""
    margins = [np.inf]
    if not np.isnan(max_cross):
        margins.append(check_margin("CFL split: cross similarity < gamma_max", max_cross,
                                    gamma_max, scale=1.0))
    if not np.isnan(structure):
        margins.append(check_margin("CFL split: group silhouette >= min_structure", structure,
                                    min_structure, scale=1.0))
    return float(min(margins))


def _split_refusal(
    similarity: np.ndarray, max_cross: float, norms_qualify: bool, gamma_max: float,
    min_structure: float,
) -> tuple[str, float]:
    """The first test that refuses a split of >= 2 members ("" when none), and the
    group silhouette (NaN where it did not decide)."""
    count = len(similarity)
    # The group test only decides a split the other tests let through; skipped
    # otherwise (a tree and up to 9 silhouettes per cluster and round).
    refusal = (
        "gate closed" if not norms_qualify
        else f"{count} trained members, a split needs {MIN_SPLIT_MEMBERS}"
        if count < MIN_SPLIT_MEMBERS
        else f"cross similarity {max_cross:.3f} >= {gamma_max:.3g}" if max_cross >= gamma_max
        else ""
    )
    structure = (
        cluster_structure_score(similarity)[0]
        if not refusal and min_structure > -1.0 else np.nan
    )
    if not refusal and min_structure > -1.0 and structure < min_structure:
        refusal = f"group silhouette {structure:.3f} < {min_structure:.3g}"
    return refusal, structure
