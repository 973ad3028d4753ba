"""Placement regret: what each client loses to the cluster a run placed it in.

A diagnostic only: no strategy reads it. The final report scores every cluster
model on every client's test split; a client's *placement regret* is how much
better the best of those models does than the model the client uses. Two log
warnings come with it: a client left for several rounds in a cluster that costs
it more than :data:`REGRET_THRESHOLD`, and a round whose moves undo a clustering
that had held for :data:`STABLE_ROUNDS` rounds. Both work on the strategy's
per-round history of the cluster each evaluated client used
(``assignment_history``), which checkpoints keep, so they hold across a resume.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from logging import WARNING
from typing import Any, TypeVar

import numpy as np
from flwr.common.logger import log
from scipy.optimize import linear_sum_assignment

# The bar: a client whose regret exceeds 0.1 (ten points of test accuracy)
# lost more to its placement than seeds and sampling move a run's accuracy.
REGRET_THRESHOLD = 0.1
# A wrong placement held when its client used that cluster for this many evaluated
# rounds in a row; one that moved more recently may still be on its way (both warned).
PERSISTENT_ROUNDS = 3
# Evaluated rounds a clustering must keep (up to relabelling) before a change of
# it counts as undoing a settled clustering rather than the clustering forming.
STABLE_ROUNDS = 3
# Clients a log line or table cell names before it says how many more there are.
MAX_NAMED = 10
PLACEMENT_FIX = ("let clients choose their cluster on held-out data, warm up longer before "
                 "clustering, or check num-clusters")
OWN_MODEL_FIX = ("evaluate them on their cluster's model, or give their own models more "
                 "rounds to catch up")
STABILITY_FIX = ("unless their data drifted, the clustering is not settled: check num-clusters "
                 "and the strategy's clustering threshold, or warm up longer before clustering")

Client = TypeVar("Client", bound=Hashable)


def placement_regret(
    accuracy: np.ndarray, personal: Sequence[float] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each client's best cluster model and its placement regret.

    The regret is the best cluster model's test accuracy minus that of the
    model the client actually uses (its personal accuracy): the cluster
    model it is assigned under a hard clustering, FedEM's mixture, or the
    client's own model (FedSoft, local-only). It is never below 0: a model of
    the client's own that beats every cluster model costs it nothing. With one
    model (FedAvg, FedProx, local-only) there is no placement to get wrong: 0.

    Parameters
    ----------
    accuracy : np.ndarray
        (clients, cluster models) test accuracy of every model on every client.
    personal : Sequence[float] | np.ndarray
        Each client's test accuracy with the model it uses.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The best cluster model of each client, and each client's regret.
    """
    accuracy = np.asarray(accuracy, dtype=float)
    best = np.argmax(accuracy, axis=1)
    if accuracy.shape[1] < 2:
        return best, np.zeros(accuracy.shape[0])
    gain = accuracy[np.arange(accuracy.shape[0]), best] - np.asarray(personal, dtype=float)
    return best, np.maximum(gain, 0.0)


def client_id(row: Mapping[str, Any]) -> dict[str, int | None]:
    """How ``summary.json`` names a report row's client: its partition (if known) and node."""
    partition = row.get("partition-id")
    return {"partition_id": None if partition is None else int(partition),
            "node_id": int(row["node-id"])}


def client_name(client: Mapping[str, int | None]) -> str:
    """``partition 3``, or ``node 12`` for a client of unknown partition (as the log names it)."""
    partition = client.get("partition_id")
    return f"node {client['node_id']}" if partition is None else f"partition {partition}"


def listed(names: Sequence[str], most: int = MAX_NAMED) -> str:
    """``names`` joined by commas, the first ``most`` of them and how many more."""
    more = f" (+{len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def placement_fields(
    rows: Sequence[Mapping[str, Any]],
    personal: Sequence[float],
    history: tuple[Mapping[int, Mapping[int, int]], Any] | None,
) -> dict[str, Any]:
    """``summary.json``'s placement diagnostic; warns of clients left in a costly cluster.

    Parameters
    ----------
    rows : Sequence[Mapping[str, Any]]
        The final report's rows (``test-accuracy``, ``assigned``, ``node-id``).
    personal : Sequence[float]
        Each row's personal accuracy (``per_client_accuracy``).
    history : tuple[Mapping[int, Mapping[int, int]], Any] | None
        The strategy's ``round_history()``: round -> node -> cluster used first;
        ``None`` for strategies that keep no clusters.
    """
    accuracy = np.array([row["test-accuracy"] for row in rows], dtype=float)
    best, regret = placement_regret(accuracy, personal)
    used = history[0] if history is not None else {}
    clients = [client_id(row) for row in rows]
    warn_costly_placements(rows, best, regret, used)
    return {
        "placement_regret": [float(value) for value in regret],
        "best_cluster": [int(cluster) for cluster in best],
        "max_placement_regret": float(regret.max(initial=0.0)),
        "placement_regret_threshold": REGRET_THRESHOLD,
        "clients_with_regret_above_threshold": [
            client for client, value in zip(clients, regret, strict=True)
            if value > REGRET_THRESHOLD
        ],
        "broken_clusterings": broken_clusterings(used, rows),
    }


def rounds_in_cluster(used: Mapping[int, Mapping[int, int]], node: int, cluster: int) -> int:
    """How many of ``node``'s last evaluated rounds, in a row, it used ``cluster``."""
    rounds = [used[r][node] for r in sorted(used) if node in used[r]]
    held = 0
    for chosen in reversed(rounds):
        if chosen != cluster:
            break
        held += 1
    return held


def warn_costly_placements(
    rows: Sequence[Mapping[str, Any]], best: np.ndarray, regret: np.ndarray,
    used: Mapping[int, Mapping[int, int]],
) -> list[str]:
    """Warn of every client whose regret exceeds :data:`REGRET_THRESHOLD`, by name.

    One line per (cluster, better cluster, case): clients that sat in their cluster
    for their last :data:`PERSISTENT_ROUNDS` evaluated rounds or more (a placement
    that held), clients that joined it more recently (it may still be settling),
    and clients whose own model (FedSoft's, FedEM's mixture) trails the cluster
    model they are assigned. Returns the lines logged.
    """
    groups: dict[tuple[int, int, str], list[tuple[str, float, int]]] = {}
    for row, cluster, value in zip(rows, best, regret, strict=True):
        if value <= REGRET_THRESHOLD:
            continue
        assigned = int(row["assigned"])
        held = rounds_in_cluster(used, int(row["node-id"]), assigned)
        case = ("own" if cluster == assigned
                else "held" if held >= PERSISTENT_ROUNDS else "recent")
        groups.setdefault((assigned, int(cluster), case), []).append(
            (client_name(client_id(row)), float(value), held))
    lines = []
    for (assigned, better, case), clients in sorted(groups.items()):
        # Every client is named, however many: the warning is the record of who lost.
        names = listed([name for name, _, _ in clients], len(clients))
        gains = listed([f"+{value:.2f}" for _, value, _ in clients], len(clients))
        fewest = min(held for _, _, held in clients)
        where = {
            "held": f"{names} sat in cluster {assigned} for at least their last {fewest} "
                    f"evaluated rounds while cluster {better}'s model scores {gains} over theirs",
            "recent": f"{names} ended in cluster {assigned}, joined in their last {fewest} "
                      f"evaluated round(s), while cluster {better}'s model scores {gains} over "
                      f"theirs",
            "own": f"{names} use a model of their own that cluster {assigned}'s, their "
                   f"cluster's, beats by {gains}",
        }[case]
        fix = (OWN_MODEL_FIX if case == "own" else PLACEMENT_FIX)
        lines.append(f"placement regret: {where} on their test data (above "
                     f"{REGRET_THRESHOLD}); {fix}")
        log(WARNING, "%s", lines[-1])
    return lines


# ----------------------------------------------------------- clustering stability
@dataclass(frozen=True)
class ClusteringBreak:
    """A round whose moves undid a clustering that had held for :data:`STABLE_ROUNDS` rounds.

    ``change`` is ``split`` (each new group is part of one old group), ``merge``
    (each old group lies within one new group) or ``regrouping``; ``moved`` maps
    each client that left its group to its cluster before and after.
    """

    server_round: int
    change: str
    moved: dict[Hashable, tuple[int, int]]


def partition_moves(
    previous: Mapping[Client, int], current: Mapping[Client, int]
) -> dict[Client, tuple[int, int]]:
    """The clients whose group changed between two rounds, up to relabelling.

    Over the clients of both rounds, old and new clusters are matched one to one
    by the most shared clients (Hungarian matching); a client moved when its new
    cluster is not its old cluster's match. Empty exactly when both rounds
    partition those clients alike, however the clusters are numbered.
    """
    common = [client for client in previous if client in current]
    old = sorted({previous[client] for client in common})
    new = sorted({current[client] for client in common})
    shared = np.zeros((len(old), len(new)))
    for client in common:
        shared[old.index(previous[client]), new.index(current[client])] += 1
    # Less than one client in all: only breaks ties, towards a cluster keeping its
    # number, so a split names the clients that left rather than those that stayed.
    shared += 0.5 / max(len(old), len(new), 1) * np.equal.outer(old, new)
    matched_rows, matched_cols = linear_sum_assignment(-shared)
    match = {old[r]: new[c] for r, c in zip(matched_rows, matched_cols, strict=True)}
    return {client: (previous[client], current[client]) for client in common
            if match.get(previous[client]) != current[client]}


def _change(previous: Mapping[Hashable, int], current: Mapping[Hashable, int]) -> str:
    pairs = {(previous[client], current[client]) for client in previous if client in current}
    if len(pairs) == len({new for _, new in pairs}):
        return "split"
    if len(pairs) == len({old for old, _ in pairs}):
        return "merge"
    return "regrouping"


def broken_clustering(
    used: Mapping[int, Mapping[Hashable, int]], server_round: int
) -> ClusteringBreak | None:
    """Whether ``server_round``'s clusters undo a clustering that had held, and how.

    It had held when the :data:`STABLE_ROUNDS` evaluated rounds before partitioned
    their clients alike (:func:`partition_moves`) into two clusters or more (one
    cluster for all is no clustering yet, e.g. CFL's or FL+HC's warm-up).

    Parameters
    ----------
    used : Mapping[int, Mapping[Hashable, int]]
        Round -> client -> cluster used (the strategy's ``assignment_history``).
    server_round : int
        The round to check; a round missing from ``used`` is no break.
    """
    before = sorted(r for r in used if r < server_round)[-STABLE_ROUNDS:]
    if server_round not in used or len(before) < STABLE_ROUNDS:
        return None
    held = [used[r] for r in before]
    if any(partition_moves(a, b) for a, b in pairwise(held)):
        return None
    if len(set(held[-1].values())) < 2:
        return None
    moved = partition_moves(held[-1], used[server_round])
    if not moved:
        return None
    return ClusteringBreak(server_round, _change(held[-1], used[server_round]), moved)


def describe_break(event: ClusteringBreak, name: Callable[[Any], str]) -> str:
    """The warning's line for ``event``, clients named by ``name``."""
    moves = [f"{name(client)} {old}->{new}" for client, (old, new) in event.moved.items()]
    return (f"round {event.server_round}: its moves undid a clustering that had held for the "
            f"last {STABLE_ROUNDS} evaluated rounds ({event.change}); moved (cluster "
            f"before->after): {listed(moves)}; {STABILITY_FIX}")


def warn_if_clustering_broke(
    used: Mapping[int, Mapping[int, int]], server_round: int, name: Callable[[int], str]
) -> ClusteringBreak | None:
    """Log a warning when ``server_round`` undid a settled clustering; the break, if any.

    ``used`` is the strategy's ``assignment_history`` (round -> node -> cluster)
    and ``name`` how the log names a node (``NodeRegistry.describe``).
    """
    event = broken_clustering(used, server_round)
    if event is not None:
        log(WARNING, "%s", describe_break(event, name))
    return event


def broken_clusterings(
    used: Mapping[int, Mapping[int, int]], rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Every round of ``used`` that undid a settled clustering, as ``summary.json`` lists it.

    The same rounds the run warned of (:func:`warn_if_clustering_broke`), found
    again in the history; a node missing from ``rows`` is named by its id alone.
    """
    clients = {int(row["node-id"]): client_id(row) for row in rows}
    events = []
    for server_round in sorted(used):
        event = broken_clustering(used, server_round)
        if event is not None:
            events.append({
                "round": server_round,
                "change": event.change,
                "moved": [
                    {**(clients.get(node) or {"partition_id": None, "node_id": node}),
                     "from": old, "to": new}
                    for node, (old, new) in event.moved.items()
                ],
            })
    return events


def table_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The closing table's placement rows: the largest regret and who is above the bar."""
    if "max_placement_regret" not in summary:
        return []
    above = summary["clients_with_regret_above_threshold"]
    return [
        ("max placement regret", f"{summary['max_placement_regret']:.4f}"),
        (f"placement regret > {summary['placement_regret_threshold']}",
         listed([client_name(client) for client in above], most=5) if above else "none"),
    ]
