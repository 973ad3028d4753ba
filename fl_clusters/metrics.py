"""Metrics of a clustered federation: cluster recovery, accuracies, communication."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from fl_clusters import protocol as p
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
LABELLINGS = {"warm_start_groups": "warm_start_ari", "mixture_clusters": "mixture_ari"}


def labelling_scores(rows: list[dict[str, Any]], fields: Mapping[str, Any]) -> dict[str, Any]:
    """ARI against the nodes' true clusters of each clustering of :data:`LABELLINGS` in ``fields``.

    Scored over the nodes that have a label and report ``true-cluster``; a
    clustering no such node has is left out.
    """
    truth = {str(r["node-id"]): r["true-cluster"] for r in rows if "true-cluster" in r}
    scores: dict[str, Any] = {}
    for field, key in LABELLINGS.items():
        known = [node for node in fields.get(field) or {} if node in truth]
        if known:
            scores[key] = recovery_scores(
                np.array([truth[n] for n in known]), np.array([fields[field][n] for n in known])
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


def record_bytes(content: RecordDict) -> int:
    """Bytes of a message's records (arrays, metrics and configs)."""
    return sum(record.count_bytes() for record in content.values())


# Replies are pulled after PULL_FIRST_S, then every PULL_SHARE of the time waited so
# far, at most every PULL_MAX_S. Flower's grids sleep a fixed 0.1 s (InMemoryGrid,
# simulation) or 3 s (HttpGrid, deployment) between pulls: most of a short round.
PULL_FIRST_S = 0.002
PULL_SHARE = 0.05
PULL_MAX_S = 0.5
# In simulation at most this many messages per CPU core wait in Flower's in-memory
# state at once: its dispatcher checks every stored message for every node every
# 0.1 s, so a tick costs nodes x stored messages and takes its cycles from the
# ClientApp actors. At 1,000 clients on 2 cores a window of 32 was the fastest
# measured (8 starved the actors, 128 and 512 were slower); on 16 cores 128 and
# 1,000 tie (docs/performance.md).
SIMULATION_IN_FLIGHT_PER_CORE = 16


def simulation_in_flight() -> int:
    """The default message window in simulation: ``SIMULATION_IN_FLIGHT_PER_CORE``
    times the CPU cores this process may run on (Flower's simulation runs its actors
    on the same machine)."""
    # sched_getaffinity honours CPU limits set on the process; it is Linux-only.
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    return SIMULATION_IN_FLIGHT_PER_CORE * cores


class MeteredGrid(Grid):
    """A Grid that counts the bytes of every message content it sends and receives.

    It wraps the Grid Flower hands the ServerApp, so it meters any strategy,
    Flower's own included, without touching it. Traffic is tallied per
    ``server-round`` (read from the outgoing config, 0 when absent).

    ``send_and_receive`` pushes and pulls through the wrapped grid itself, pulling
    at an interval that grows with the wait (2 ms at first, 5 % of the time
    waited since the last push, at most 0.5 s), so a reply is collected within
    5 % of the round's time instead of after Flower's fixed pull interval.

    With ``node_order`` set it also lists nodes and returns replies in that order,
    so a strategy that draws among the listed nodes by position (Flower's FedAvg
    with a seeded ``random``) or sums replies in arrival order repeats its run.

    Parameters
    ----------
    grid : Grid
        The Grid to wrap.
    max_in_flight : int | None
        Most messages pushed and not yet answered at once; the rest are pushed as
        replies come in. ``None``: :func:`simulation_in_flight` (16 a CPU core) for
        Flower's simulation grid (``InMemoryGrid``), no limit otherwise (deployed
        SuperNodes fetch their own messages, and all should train at once).
    """

    def __init__(self, grid: Grid, max_in_flight: int | None = None) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
        if max_in_flight is None and isinstance(grid, InMemoryGrid):
            max_in_flight = simulation_in_flight()
        self.max_in_flight = max_in_flight
        self._grid = grid
        self.node_order: Callable[[int], Any] | None = None
        self.sent: dict[int, int] = defaultdict(int)
        self.received: dict[int, int] = defaultdict(int)
        # Messages whose reply did not come before the timeout (late, or the node left).
        self.unanswered = 0
        # Every node id the grid ever listed, to tell joined and lost nodes apart.
        self.nodes_seen: set[int] = set()

    @property
    def bytes_sent(self) -> int:
        """Bytes of all message contents sent."""
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        """Bytes of all reply contents received."""
        return sum(self.received.values())

    def set_run(self, run_id: int) -> None:  # type: ignore[override]
        """Delegate to the wrapped grid."""
        self._grid.set_run(run_id)

    @property
    def run(self):  # type: ignore[no-untyped-def]
        """Delegate to the wrapped grid."""
        return self._grid.run

    def create_message(self, *args, **kwargs) -> Message:  # type: ignore[no-untyped-def]
        """Delegate to the wrapped grid."""
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        """Delegate to the wrapped grid, remembering every node it lists."""
        nodes = list(self._grid.get_node_ids())
        self.nodes_seen.update(nodes)
        return nodes if self.node_order is None else sorted(nodes, key=self.node_order)

    def get_nodes(self):  # type: ignore[no-untyped-def]
        """Delegate to the wrapped grid."""
        return self._grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Count and push messages."""
        messages = list(messages)
        self._count_sent(messages)
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Pull and count replies."""
        replies = list(self._grid.pull_messages(message_ids))
        self._count_received(replies, 0)
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Send, receive and count; wait at most ``timeout`` seconds (``None``: for all)."""
        messages = list(messages)
        server_round = self._count_sent(messages)
        window = self.max_in_flight or max(1, len(messages))
        waiting = messages[::-1]  # popped from the end: sent in the given order
        pending: set[str] = set()
        replies: list[Message] = []
        start = pushed_at = time.monotonic()
        while True:
            if waiting and len(pending) < window:
                batch = [waiting.pop() for _ in range(min(len(waiting), window - len(pending)))]
                pending.update(self._grid.push_messages(batch))
                pushed_at = time.monotonic()
            pulled = list(self._grid.pull_messages(pending))
            replies += pulled
            pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
            now = time.monotonic()
            if (not pending and not waiting) or (timeout is not None and now - start >= timeout):
                break
            if pulled and waiting:
                continue  # free slots: push the next messages now
            pause = min(max(PULL_FIRST_S, PULL_SHARE * (now - pushed_at)), PULL_MAX_S)
            time.sleep(pause if timeout is None else min(pause, start + timeout - now))
        self._count_received(replies, server_round)
        self.unanswered += max(0, len(messages) - len(replies))
        if self.node_order is not None:
            replies.sort(key=lambda m: self.node_order(m.metadata.src_node_id))  # type: ignore[misc]
        return replies

    def _count_sent(self, messages: list[Message]) -> int:
        server_round = 0
        for msg in messages:
            config = msg.content.config_records.get(p.CONFIG)
            if config is not None and p.CFG_ROUND in config:
                server_round = int(config[p.CFG_ROUND])  # type: ignore[arg-type]
            self.sent[server_round] += record_bytes(msg.content)
        return server_round

    def _count_received(self, replies: list[Message], server_round: int) -> None:
        for msg in replies:
            if msg.has_content():
                self.received[server_round] += record_bytes(msg.content)


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
