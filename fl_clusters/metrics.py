"""Scores of a clustered federation: cluster recovery and accuracies against ground truth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from fl_clusters.clustering import nearest_feature


def recovery_scores(true_groups: np.ndarray, found: np.ndarray) -> tuple[float, float]:
    """ARI and NMI of found clusters against ground truth (both label-permutation invariant)."""
    true_groups, found = np.asarray(true_groups), np.asarray(found)
    if true_groups.shape != found.shape or true_groups.ndim != 1:
        raise ValueError(f"shapes differ: truth {true_groups.shape}, found {found.shape}")
    return (
        float(adjusted_rand_score(true_groups, found)),
        float(normalized_mutual_info_score(true_groups, found)),
    )


# Hard clusterings a strategy reports beside its final assignment (summary field
# -> node id -> label), and the summary key of each one's ARI.
def labelling_scores(
    rows: list[dict[str, Any]], labellings: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    """ARI against the nodes' true clusters of each hard clustering in ``labellings``.

    ``labellings`` maps the score's key to a clustering (node id as a string ->
    label). Scored over the nodes that have a label and report ``true-cluster``;
    a clustering no such node has is left out.
    """
    truth = {str(r["node-id"]): r["true-cluster"] for r in rows if "true-cluster" in r}
    scores: dict[str, Any] = {}
    for key, labels in labellings.items():
        known = [node for node in labels if node in truth]
        if known:
            scores[key] = recovery_scores(
                np.array([truth[n] for n in known]), np.array([labels[n] for n in known])
            )[0]
    return scores


def rounds_to_target(accuracy_by_round: Mapping[int, float], target: float) -> int | None:
    """First round whose accuracy reaches ``target``, or ``None`` if none did."""
    for server_round in sorted(accuracy_by_round):
        if accuracy_by_round[server_round] >= target:
            return server_round
    return None


def intra_inter_accuracy(
    accuracy: np.ndarray, true_groups: np.ndarray, used_model: np.ndarray
) -> tuple[float, float]:
    """Intra- and inter-cluster accuracy (Li and Yan 2023).

    Parameters
    ----------
    accuracy : np.ndarray
        (N, k): accuracy of cluster model j on client l's held-out test split.
    true_groups : np.ndarray
        (N,): ground-truth group of each client.
    used_model : np.ndarray
        (N, N): the cluster model client i would use on client l's test data
        (its own model for a hard clustering; MCFL's nearest-feature choice).

    Returns
    -------
    tuple[float, float]
        Mean accuracy of each client's choice on test data of its own group
        (intra; itself included) and of the other groups (inter; ``nan`` when
        there is a single group).
    """
    n = len(true_groups)
    same = true_groups[:, None] == true_groups[None, :]
    scores = accuracy[np.arange(n)[None, :].repeat(n, 0), used_model]  # [i, l]
    intra = float(scores[same].mean())
    inter = float(scores[~same].mean()) if (~same).any() else float("nan")
    return intra, inter


def pooled_group_accuracy(correct: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Accuracy of every cluster model on every group, pooled over the nodes' test splits.

    Parameters
    ----------
    correct : np.ndarray
        (N, k, G): correct test predictions of cluster model j on group g at node i.
    counts : np.ndarray
        (N, G): test samples of group g at node i.

    Returns
    -------
    np.ndarray
        (k, G) float64; ``nan`` for a group with no test sample anywhere.
    """
    correct, counts = np.asarray(correct, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    if correct.ndim != 3 or counts.shape != (correct.shape[0], correct.shape[2]):
        raise ValueError(
            f"correct must be (N, k, G) and counts (N, G), got {correct.shape} and {counts.shape}"
        )
    if np.any(correct > counts[:, None, :]) or np.any(correct < 0):
        raise ValueError("correct counts must lie in [0, counts] for every node and group")
    total = counts.sum(axis=0)
    return np.divide(
        correct.sum(axis=0), total, out=np.full(correct.shape[1:], np.nan), where=total > 0
    )


def match_clusters_to_sources(accuracy: np.ndarray) -> np.ndarray:
    """One-to-one matching of cluster models to sources with the highest total accuracy.

    Cluster numbers carry no meaning, so scores against per-source ground truth go
    through this matching (Hungarian algorithm on the ``(k, G)`` accuracy matrix).

    Returns
    -------
    np.ndarray
        (k,) int: the source matched to each cluster, -1 for a cluster left
        unmatched when k > G.
    """
    matrix = np.nan_to_num(np.asarray(accuracy, dtype=np.float64), nan=0.0)
    if matrix.ndim != 2:
        raise ValueError(f"accuracy must be a (k, G) matrix, got shape {matrix.shape}")
    clusters, sources = linear_sum_assignment(matrix, maximize=True)
    match = np.full(matrix.shape[0], -1, dtype=np.int64)
    match[clusters] = sources
    return match


def importance_weight_error(
    weights: np.ndarray, proportions: np.ndarray, match: np.ndarray
) -> float:
    """Mean absolute error of soft cluster weights against true source proportions.

    Parameters
    ----------
    weights : np.ndarray
        (N, k): each node's weight of each cluster (FedSoft's u).
    proportions : np.ndarray
        (N, G): each node's true share of each source in its training data.
    match : np.ndarray
        (k,): the source of each cluster (:func:`match_clusters_to_sources`); clusters
        matched to -1 are left out.
    """
    weights = np.asarray(weights, dtype=np.float64)
    proportions = np.asarray(proportions, dtype=np.float64)
    match = np.asarray(match, dtype=np.int64)
    if weights.ndim != 2 or proportions.ndim != 2 or len(weights) != len(proportions):
        raise ValueError(
            f"weights (N, k) and proportions (N, G) need the same N, got {weights.shape} "
            f"and {proportions.shape}"
        )
    if match.shape != (weights.shape[1],) or np.any(match >= proportions.shape[1]):
        raise ValueError(f"match must give one source (< {proportions.shape[1]}) per cluster")
    matched = match >= 0
    if not matched.any():
        raise ValueError("no cluster is matched to a source")
    return float(np.abs(weights[:, matched] - proportions[:, match[matched]]).mean())


def soft_clustering_scores(
    rows: list[dict[str, Any]], importance: Mapping[str, Sequence[float]] | None
) -> dict[str, Any]:
    """``summary.json`` entries of a mixture federation, from the nodes' final reports.

    Parameters
    ----------
    rows : list[dict[str, Any]]
        The nodes' reports; each needs ``test-accuracy`` (one per cluster model) and,
        for any score here, ``group-correct``/``group-counts`` (see the ClientApp's
        ``test-groups`` metadata).
    importance : Mapping[str, Sequence[float]] | None
        A soft strategy's final weights per node id (as a string), or ``None``.

    Returns
    -------
    dict[str, Any]
        ``cluster_source_accuracy`` (k x G, ``None`` where a source has no test
        sample), ``cluster_best_source`` and ``cluster_source_match``; with
        ``importance`` and every node's ``true-mixture`` also
        ``importance_weight_error``. Empty when a node did not report groups.
    """
    if not rows or not all("group-correct" in r and "group-counts" in r for r in rows):
        return {}
    k = len(rows[0]["test-accuracy"])
    num_groups = max(len(r["group-counts"]) for r in rows)
    correct = np.zeros((len(rows), k, num_groups))
    counts = np.zeros((len(rows), num_groups))
    for i, row in enumerate(rows):
        g = len(row["group-counts"])
        correct[i, :, :g] = np.reshape(row["group-correct"], (k, g))
        counts[i, :g] = row["group-counts"]
    accuracy = pooled_group_accuracy(correct, counts)
    match = match_clusters_to_sources(accuracy)
    scores: dict[str, Any] = {
        "cluster_source_accuracy": [
            [None if np.isnan(a) else float(a) for a in cluster] for cluster in accuracy
        ],
        "cluster_best_source": np.nan_to_num(accuracy, nan=-1.0).argmax(axis=1).tolist(),
        "cluster_source_match": match.tolist(),
    }
    if importance and all("true-mixture" in r for r in rows):
        known = [r for r in rows if str(r["node-id"]) in importance]
        if known:
            weights = np.array([importance[str(r["node-id"])] for r in known])
            proportions = np.zeros((len(known), max(num_groups, len(known[0]["true-mixture"]))))
            for i, row in enumerate(known):
                proportions[i, : len(row["true-mixture"])] = row["true-mixture"]
            scores["importance_weight_error"] = importance_weight_error(
                weights, proportions, match
            )
    return scores


def mcfl_scores(rows: list[dict[str, Any]], cluster_features: np.ndarray) -> dict[str, Any]:
    """Intra- and inter-cluster accuracy when each test set picks its model by MCFL's rule.

    Under MCFL the model used on a test set depends on that test set only: the
    cluster whose feature is nearest to the mean of its inputs. The same models
    scored with each node's own cluster (no MCFL) are kept under ``assigned_*``.

    Parameters
    ----------
    rows : list[dict[str, Any]]
        The nodes' reports: ``test-accuracy`` (one per cluster model),
        ``test-feature-mean``, ``assigned`` and ``true-cluster``.
    cluster_features : np.ndarray
        (k, D) MCFL cluster features; NaN rows (clusters without members) are
        never chosen.

    Returns
    -------
    dict[str, Any]
        ``intra_cluster_accuracy`` and ``inter_cluster_accuracy`` under MCFL's
        choice, ``assigned_intra_cluster_accuracy`` and
        ``assigned_inter_cluster_accuracy`` under the nodes' own clusters,
        ``mcfl_choice_accuracy`` (share of nodes whose test data picks their own
        cluster's model) and ``mcfl_choices``.
    """
    accuracy = np.array([r["test-accuracy"] for r in rows], dtype=float)
    truth = np.array([r.get("true-cluster", 0) for r in rows], dtype=int)
    assigned = np.array([r["assigned"] for r in rows], dtype=int)
    choice = nearest_feature(np.array([r["test-feature-mean"] for r in rows]), cluster_features)
    n = len(rows)
    intra, inter = intra_inter_accuracy(accuracy, truth, np.repeat(choice[None, :], n, axis=0))
    own_intra, own_inter = intra_inter_accuracy(
        accuracy, truth, np.repeat(assigned[:, None], n, axis=1)
    )
    return {
        "intra_cluster_accuracy": intra,
        "inter_cluster_accuracy": inter,
        "assigned_intra_cluster_accuracy": own_intra,
        "assigned_inter_cluster_accuracy": own_inter,
        "mcfl_choice_accuracy": float(np.mean(choice == assigned)),
        "mcfl_choices": choice.astype(int).tolist(),
    }


def density_clustering_scores(
    rows: list[dict[str, Any]], labels: Mapping[str, int]
) -> dict[str, Any]:
    """Score a density clustering (noise label -1) of the nodes against ground truth.

    Nodes whose labels were randomized (``noisy``) form one ground-truth group of
    their own, as DBSCAN's noise forms one label: ARI 1 means every true group
    was recovered and exactly the randomized nodes were called noise.

    Parameters
    ----------
    rows : list[dict[str, Any]]
        The nodes' reports (``node-id``, ``true-cluster``, optional ``noisy``).
    labels : Mapping[str, int]
        Cluster label per node id (as a string); nodes absent here are left out.

    Returns
    -------
    dict[str, Any]
        ``ari``, ``nmi``, ``num_clusters_found`` (noise excluded),
        ``noisy_clients_flagged`` (randomized nodes labelled noise) and
        ``clean_clients_flagged`` (other nodes labelled noise).
    """
    known = [r for r in rows if str(r["node-id"]) in labels]
    if not known:
        return {}
    noisy = np.array([bool(r.get("noisy", 0)) for r in known])
    truth = np.where(noisy, -1, [r.get("true-cluster", 0) for r in known])
    found = np.array([int(labels[str(r["node-id"])]) for r in known])
    ari, nmi = recovery_scores(truth, found)
    return {
        "ari": ari,
        "nmi": nmi,
        "num_clusters_found": int(np.unique(found[found >= 0]).size),
        "noisy_clients_flagged": int(np.sum(noisy & (found < 0))),
        "clean_clients_flagged": int(np.sum(~noisy & (found < 0))),
    }
