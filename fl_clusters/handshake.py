"""The start-up handshake: who each node is, asked once before any round.

Simulated node ids are random per run; each node's stable key (``query.identity``)
is what orders and samples nodes, so that the same seed gives the same run. The
same reply may carry the node's ground-truth group when its app knows one (for
progress lines and scores only: no strategy sees it), and a node that cannot take
part (its data set is missing) says so here, before round 1. A node whose app has
no identity handler, or raises, is only logged: it still trains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fl_clusters import protocol as p

KEY_FIELD = p.MetricField(integer=True, low=0.0)
GROUP_FIELD = p.MetricField(integer=True, low=0.0, required=False)
# What Flower's ClientAppException puts before the client's own message.
CLIENT_MESSAGE_MARKER = "Message: "


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
    """

    keys: dict[int, int | None] = field(default_factory=dict)
    groups: dict[int, int] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    startup_problems: dict[int, str] = field(default_factory=dict)


def client_error_message(reason: str) -> str:
    """The client's own exception message out of Flower's error reason.

    Flower wraps it as ``<class ...>:<'... Message: <text>'>``; in simulation the
    reason also carries Ray's whole remote traceback before that last part.
    """
    text = reason.rsplit(CLIENT_MESSAGE_MARKER, 1)[-1]
    return text.removesuffix("'>").strip()


def identify_nodes(grid: Grid, nodes: Iterable[int], timeout: float | None) -> NodeIdentities:
    """Ask ``nodes`` who they are (``query.identity``), waiting at most ``timeout``.

    Parameters
    ----------
    grid : Grid
        The grid to ask through.
    nodes : Iterable[int]
        Node ids to ask.
    timeout : float | None
        Seconds to wait for the replies; a node that does not answer in time
        keeps no key and no problem (it may be slow, not broken).
    """
    nodes = list(nodes)
    queries = [
        Message(content=RecordDict({p.CONFIG: ConfigRecord()}), dst_node_id=node,
                message_type=p.QUERY_IDENTITY)
        for node in nodes
    ]
    found = NodeIdentities(keys=dict.fromkeys(nodes))
    for msg in grid.send_and_receive(queries, timeout=timeout):
        node = msg.metadata.src_node_id
        if msg.has_error():
            found.problems[node] = f"client error ({client_error_message(msg.error.reason)})"
            continue
        startup = msg.content.config_records.get(p.STARTUP_PROBLEM)
        if startup is not None:
            found.startup_problems[node] = str(startup.get("message", "no reason given"))
        metrics = msg.content.metric_records.get(p.METRICS)
        problem = (
            f"no '{p.METRICS}' record" if metrics is None
            else p.field_problem(metrics, p.M_NODE_KEY, KEY_FIELD)
        )
        if problem is not None:
            found.problems[node] = problem
            continue
        found.keys[node] = int(metrics[p.M_NODE_KEY])  # type: ignore[index,arg-type]
        if p.M_TRUE_GROUP in metrics and p.field_problem(
            metrics, p.M_TRUE_GROUP, GROUP_FIELD  # type: ignore[arg-type]
        ) is None:
            found.groups[node] = int(metrics[p.M_TRUE_GROUP])  # type: ignore[index,arg-type]
    return found
