"""Who each node is: the start-up handshake, and the node registry built on it.

Simulated node ids are random per run; each node's stable key (``query.identity``)
is what orders and samples nodes, so that the same seed gives the same run, and
what finds a node again when a run resumes from its checkpoint. The
same reply may carry the node's ground-truth group when its app knows one (for
progress lines and scores only: no strategy sees it), and a node that cannot take
part (its data set is missing) says so here, before round 1. A node whose app has
no identity handler, or raises, is only logged: it still trains.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.client_errors import client_error_message

KEY_FIELD = p.MetricField(integer=True, low=0.0)
GROUP_FIELD = p.MetricField(integer=True, low=0.0, required=False)
PARTITION_FIELD = p.MetricField(integer=True, low=0.0, required=False)


@dataclass
class NodeIdentities:
    """What the nodes said at the handshake.

    Parameters
    ----------
    keys : dict[int, int | None]
        Node id -> stable key (``None``: the node gave none).
    groups : dict[int, int]
        Node id -> ground-truth group, for the nodes that reported one.
    problems : dict[int, str]
        Node id -> why it gave no key (a client error, a malformed reply).
    startup_problems : dict[int, str]
        Node id -> why the node cannot take part, as its app said (its data set
        is missing...).
    partitions : dict[int, int]
        Node id -> the ``partition-id`` of its node config, for the nodes that
        reported one (to name nodes in the log).
    unanswered : list[int]
        Nodes that sent no reply within the timeout: slow, not broken, so they
        are asked again (:class:`NodeRegistry`).
    every_node : set[int]
        The nodes of ``startup_problems`` whose reason every node of the
        federation shares (its partition plan cannot be made).
    """

    keys: dict[int, int | None] = field(default_factory=dict)
    groups: dict[int, int] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    startup_problems: dict[int, str] = field(default_factory=dict)
    partitions: dict[int, int] = field(default_factory=dict)
    unanswered: list[int] = field(default_factory=list)
    every_node: set[int] = field(default_factory=set)

    def update(self, other: NodeIdentities) -> None:
        """Add what ``other`` (a handshake with other nodes) found."""
        for name in ("keys", "groups", "problems", "startup_problems", "partitions"):
            getattr(self, name).update(getattr(other, name))
        self.unanswered += other.unanswered
        self.every_node |= other.every_node


def identify_nodes(grid: Grid, nodes: Iterable[int], timeout: float | None) -> NodeIdentities:
    """Ask ``nodes`` who they are (``query.identity``), waiting at most ``timeout``.

    A node whose app has no identity handler, or that answers with no whole
    ``node-key`` >= 0, is logged once and gets no key.

    Parameters
    ----------
    grid : Grid
        The grid to ask through.
    nodes : Iterable[int]
        Node ids to ask.
    timeout : float | None
        Seconds to wait for the replies; a node that does not answer in time
        is listed in ``unanswered``, with no key and no problem (it may be slow,
        not broken).
    """
    nodes = list(nodes)
    queries = [
        Message(content=RecordDict({p.CONFIG: ConfigRecord()}), dst_node_id=node,
                message_type=p.QUERY_IDENTITY)
        for node in nodes
    ]
    found = NodeIdentities()
    for msg in grid.send_and_receive(queries, timeout=timeout):
        _read_identity(msg, found)
    # Within one handshake the first reply to claim a key or partition keeps it.
    refuse_taken_claims(found, {}, {}, found.partitions)
    for node, problem in sorted(found.problems.items()):
        log(WARNING, "identity: node %d gave no stable key (%s); it is ordered by its "
            "random node id, so runs with it may not repeat", node, problem)
    found.unanswered = [node for node in nodes if node not in found.keys]
    if found.unanswered:
        log(WARNING, "identity: %d of %d nodes did not answer within %s s (round-timeout); "
            "they are asked again when next listed", len(found.unanswered), len(nodes), timeout)
    return found


def _read_identity(msg: Message, found: NodeIdentities) -> None:
    """Add one node's identity reply to ``found`` (its key, group, partition or problem)."""
    node = msg.metadata.src_node_id
    found.keys[node] = None
    if msg.has_error():
        found.problems[node] = f"client error ({client_error_message(msg.error.reason)})"
        return
    startup = msg.content.config_records.get(p.STARTUP_PROBLEM)
    if startup is not None:
        found.startup_problems[node] = str(startup.get("message", "no reason given"))
        if startup.get(p.EVERY_NODE) is True:
            found.every_node.add(node)
    metrics = msg.content.metric_records.get(p.METRICS)
    problem = (
        f"no '{p.METRICS}' record" if metrics is None
        else p.field_problem(metrics, p.M_NODE_KEY, KEY_FIELD)
    )
    if problem is not None:
        found.problems[node] = problem
        return
    found.keys[node] = int(metrics[p.M_NODE_KEY])  # type: ignore[index,arg-type]
    optional = ((p.M_TRUE_GROUP, GROUP_FIELD, found.groups),
                (p.M_PARTITION_ID, PARTITION_FIELD, found.partitions))
    for name, field_, kept in optional:
        if name in metrics and p.field_problem(metrics, name, field_) is None:
            kept[node] = int(metrics[name])  # type: ignore[arg-type]


def _named(node: int, partitions: Mapping[int, int]) -> str:
    """``node`` with the partition it holds, for a line naming two nodes."""
    partition = partitions.get(node)
    return f"node {node}" if partition is None else f"node {node} (partition {partition})"


def _claimed(key: int | None, partition: int | None) -> str:
    """What a node claims to be, for a log line."""
    return f"node-key {key}" + ("" if partition is None else f" and partition {partition}")


def refuse(found: NodeIdentities, node: int, problem: str) -> None:
    """Take back everything ``node`` claimed in ``found``; ``problem`` says why.

    The node is then ordered and named by its node id, and its reason in
    ``found.problems`` counts it as a rejected reply.
    """
    found.keys[node] = None
    found.partitions.pop(node, None)
    found.groups.pop(node, None)
    found.problems[node] = problem


def refuse_taken_claims(
    found: NodeIdentities,
    keys_taken: dict[int, int],
    partitions_taken: dict[int, int],
    partitions: Mapping[int, int],
) -> None:
    """Refuse each identity in ``found`` whose key or partition another node holds.

    Parameters
    ----------
    found : NodeIdentities
        A handshake's replies; their nodes are taken in reply order, so that of two
        nodes claiming one key the first keeps it.
    keys_taken, partitions_taken : dict[int, int]
        Key (partition) -> the live node holding it; every claim kept is added.
    partitions : Mapping[int, int]
        Node -> partition, to name a holder in the log.
    """
    for node, key in list(found.keys.items()):
        if key is None:
            continue
        partition = found.partitions.get(node)
        holder = keys_taken.get(key)
        if holder is None and partition is not None:
            holder = partitions_taken.get(partition)
        if holder is not None and holder != node:
            refuse(found, node, f"refused: it claims {_claimed(key, partition)}, held by "
                   f"{_named(holder, partitions)}")
            continue
        keys_taken[key] = node
        if partition is not None:
            partitions_taken[partition] = node


def refuse_held_claims(
    found: NodeIdentities,
    keys: Mapping[int, int | None],
    partitions: Mapping[int, int],
    live: Collection[int],
) -> None:
    """:func:`refuse_taken_claims` against the keys and partitions live nodes hold.

    Parameters
    ----------
    found : NodeIdentities
        A later handshake's replies.
    keys, partitions : Mapping
        Node -> key (partition) of the nodes known before it.
    live : Collection[int]
        The known nodes still connected: a key whose holder has left may be claimed
        by a node that joins again under a new id.
    """
    before = set(found.problems)
    keys_taken = {key: node for node, key in keys.items() if key is not None and node in live}
    partitions_taken = {part: node for node, part in partitions.items() if node in live}
    refuse_taken_claims(found, keys_taken, partitions_taken, partitions)
    for node in sorted(set(found.problems) - before):
        log(WARNING, "identity: node %d %s; it is ordered by its random node id",
            node, found.problems[node])


# From this many nodes the start-up handshake asks one node before the others.
FIRST_NODE_ALONE_FROM = 100


def identify_federation(
    grid: Grid, nodes: Iterable[int], timeout: float | None
) -> NodeIdentities:
    """:func:`identify_nodes` for the start-up; in a large federation one node first.

    A reason not to take part that every node shares (its partition plan cannot
    be made) then stops the run after one node's answer: every node's handshake
    would say the same, and at 10,000 nodes asking them all takes minutes. A
    small federation is asked at once: there the separate first ask would only
    add a round trip (in a deployment, a ClientApp process started on the node).
    """
    nodes = list(nodes)
    if len(nodes) < FIRST_NODE_ALONE_FROM:
        return identify_nodes(grid, nodes, timeout)
    found = identify_nodes(grid, nodes[:1], timeout)
    if not found.every_node:
        rest = identify_nodes(grid, nodes[1:], timeout)
        refuse_held_claims(rest, found.keys, found.partitions, found.keys)
        found.update(rest)
    return found


# How often a node that does not answer is asked for its key before it is
# ordered without one.
IDENTITY_ASKS = 3


class NodeRegistry:
    """The nodes a strategy knows by stable key: their order, sampling, and a resume.

    A strategy keeps one; fl-clusters' ServerApp fills it from the start-up
    handshake, and the strategy asks a node that joins later when it first sees it
    (:meth:`learn`). Nodes without a key come after the keyed ones, by their
    (random) id.

    Attributes
    ----------
    keys : dict[int, int | None]
        Node id -> stable key (``None``: the node gave none).
    started : bool
        Whether the strategy's start-up handshake ran: from then on a node not
        seen before is asked for its key when the strategy lists it.
    partitions : dict[int, int]
        Node id -> ``partition-id``, for the nodes whose node config has one.
    unanswered : dict[int, int]
        Node id -> how often it was asked for its key without answering; it is
        asked again until :data:`IDENTITY_ASKS` asks, then ordered without a key.
    """

    def __init__(self) -> None:
        self.keys: dict[int, int | None] = {}
        self.started = False
        self.partitions: dict[int, int] = {}
        self.unanswered: dict[int, int] = {}

    def describe(self, node: int) -> str:
        """How the log names ``node``: its partition where known (ids are random per run)."""
        partition = self.partitions.get(node)
        return f"node {node}" if partition is None else f"partition {partition}"

    def claim_problem(self, node: int, claims: Mapping[str, object]) -> str | None:
        """Why ``claims`` (a reply's metrics) contradict who ``node`` registered as, or ``None``.

        A reply is from the node id Flower gives; a ``node-key`` in it that differs
        from what that node id registered at the handshake is refused, naming both.
        A ``partition-id`` that differs is no identity (a node's data can change
        mid-run: tests/test_drift_moves.py); it is never believed either: results
        file the node under its registered partition (:func:`partition_change`).
        """
        claimed, held = claims.get(p.M_NODE_KEY), self.keys.get(node)
        if claimed is not None and held is not None and claimed != held:
            return (f"it claims {p.M_NODE_KEY} {claimed}, but the handshake registered {held} "
                    f"for node {node}")
        return None

    def partition_change(self, node: int, claims: Mapping[str, object]) -> str | None:
        """What to say when ``node``'s reply names another partition than it registered."""
        claimed, held = claims.get(p.M_PARTITION_ID), self.partitions.get(node)
        if claimed is None or held is None or claimed == held:
            return None
        return (f"{self.describe(node)} now reports {p.M_PARTITION_ID} {claimed}: its data "
                f"changed since the handshake, or it claims another node's; it stays "
                f"partition {held} in the results")

    def order(self, node: int) -> tuple[int, int, int]:
        """Sort key of ``node``: its stable key, then (for nodes without one) its id."""
        key = self.keys.get(node)
        return (0, key, node) if key is not None else (1, 0, node)

    def in_order(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` sorted by :meth:`order`."""
        nodes = list(nodes)
        keys = list(map(self.keys.get, nodes))
        if None in keys:
            return sorted(nodes, key=self.order)
        # Every node keyed: by (key, node id) in numpy, as order() sorts them; a
        # strategy orders every logical client each round (100,000 and more).
        try:
            positions = np.lexsort((np.asarray(nodes, dtype=np.uint64),
                                    np.asarray(keys, dtype=np.int64)))
        except OverflowError:  # a key beyond int64
            return sorted(nodes, key=self.order)
        return [nodes[i] for i in positions.tolist()]

    def replies_in_order(self, replies: Iterable[Message]) -> list[Message]:
        """``replies`` sorted by their sender's :meth:`order`: sums in that order repeat."""
        return sorted(replies, key=lambda m: self.order(m.metadata.src_node_id))

    def adopt(self, identities: NodeIdentities, live: Collection[int] | None = None) -> None:
        """Keep the keys and partitions the handshake found (:func:`identify_nodes`).

        A node is its node id, never what it claims: a claim that contradicts what
        the node registered before, or that a node of ``live`` holds (``None``: every
        known node), is refused (:func:`refuse`, logged, in ``identities.problems``,
        which the caller counts as rejected) and the first holder keeps it.

        A node that did not answer stays unknown, so it is asked again when next
        listed: on a busy machine a cold node misses the start-up handshake, and
        without its key its kept state could not follow it across a resume. After
        :data:`IDENTITY_ASKS` asks it is ordered without a key, so a node that
        never answers does not cost a round timeout every round.
        """
        for node in identities.keys:
            problem = self.claim_problem(node, {p.M_NODE_KEY: identities.keys[node],
                                                p.M_PARTITION_ID: identities.partitions.get(node)})
            if problem is not None:
                refuse(identities, node, f"refused: {problem}")
                log(WARNING, "identity: %s: %s", self.describe(node), identities.problems[node])
        refuse_held_claims(identities, self.keys, self.partitions,
                           self.keys if live is None else live)
        for node, key in identities.keys.items():
            if key is not None or self.keys.get(node) is None:  # a refusal keeps what was held
                self.keys[node] = key
        self.partitions.update(identities.partitions)
        for node in identities.keys:
            self.unanswered.pop(node, None)
        for node in identities.unanswered:
            self.unanswered[node] = self.unanswered.get(node, 0) + 1
            if self.unanswered[node] >= IDENTITY_ASKS:
                log(WARNING, "identity: %s did not answer %d asks for its key; it is ordered "
                    "by its random node id, so runs with it may not repeat",
                    self.describe(node), IDENTITY_ASKS)
                self.keys[node] = None
                del self.unanswered[node]

    def learn(self, grid: Grid, nodes: Iterable[int], timeout: float | None) -> int:
        """Ask the nodes of ``nodes`` not known yet for their key.

        Returns
        -------
        int
            How many of their replies were errors or malformed (rejected).
        """
        nodes = set(nodes)
        missing = sorted(nodes - set(self.keys))
        if not missing:
            return 0
        found = identify_nodes(grid, missing, timeout)
        self.adopt(found, live=set(nodes))
        return len(found.problems)

    def sample(self, nodes: Iterable[int], fraction: float, rng: np.random.Generator) -> list[int]:
        """Draw ``fraction`` of ``nodes`` (at least one) with ``rng``, in key order.

        Positions are drawn among the nodes sorted by :meth:`order`, so the same
        seed samples the same partitions in every run.
        """
        ordered = self.in_order(nodes)
        size = max(1, round(len(ordered) * fraction))
        # Draw positions, not ids: node ids are uint64 and numpy would turn a list
        # of them into float64, rounding them into ids that do not exist.
        chosen = rng.choice(len(ordered), size=min(size, len(ordered)), replace=False)
        return self.in_order(ordered[int(i)] for i in chosen)

    def moved_ids(self, keys_now: Mapping[int, int | None]) -> dict[int, int]:
        """Old node id -> new node id of the known nodes a resumed run finds again.

        A resumed run is a new Flower run whose node ids differ; a node is found
        again by its key in ``keys_now`` (the resumed run's handshake). Keys no node
        holds now are logged: those nodes count as lost.
        """
        node_by_key = {key: node for node, key in keys_now.items() if key is not None}
        missing = sorted(key for key in self.keys.values()
                         if key is not None and key not in node_by_key)
        if missing:
            log(WARNING, "resume: no node holds key(s) %s now; their clusters keep their "
                "models and the nodes count as lost", missing)
        return {
            old: node_by_key[key] for old, key in self.keys.items()
            if key is not None and key in node_by_key and node_by_key[key] != old
        }
