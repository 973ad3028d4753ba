"""Whole federations in this process, on :class:`~fl_clusters.loopback.LoopbackGrid`.

fl-clusters' own ServerApp logic (:func:`~fl_clusters.server_app.run_federation`)
and ClientApp run one tiny job with no Ray and no SuperLink: what the
conformance checks (:mod:`fl_clusters.testing.checks`) run on. A grid that loses
a node, lets one join late and corrupts replies is here too (:class:`ChurnGrid`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Error, Message, MetricRecord
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters import server_app
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.loopback import LoopbackGrid

NUM_CLIENTS = 6
# Two label-permutation groups on the bundled digits: every strategy's round is
# a few milliseconds of training, and the groups are easy to tell apart. ACFL's
# phase 1 ends after round 1, so its clustering runs within the 3 rounds (and the
# 2 of a stopped run).
TINY_JOB: dict[str, Any] = {
    "dataset": "digits", "cluster-structure": "label-permutation", "num-clusters": 2,
    "num-rounds": 3, "local-steps": 2, "plots": False, "seed": 1, "acfl-phase1-rounds": 1,
}
# The attributes of Flower's TaskIdentity that a ServerApp process has set.
_IDENTITY = ("_run_id", "_node_id", "_task_id")


@contextmanager
def in_process_server() -> Iterator[None]:
    """The run identity Flower gives a ServerApp process, and no wait for more nodes.

    Flower's ``Message()`` reads the process's run identity, which only Flower's
    app processes set. A LoopbackGrid's nodes are all there at once, so the
    ServerApp's wait for late arrivals (``NODE_QUIET_S``) would only add a second
    to every run. Both are put back as they were on leaving.
    """
    identity = {name: getattr(TaskIdentity, name) for name in _IDENTITY}
    quiet = server_app.NODE_QUIET_S
    try:
        for name in _IDENTITY:
            setattr(TaskIdentity, name, 1)
        server_app.NODE_QUIET_S = 0.0
        yield
    finally:
        for name, value in identity.items():
            setattr(TaskIdentity, name, value)
        server_app.NODE_QUIET_S = quiet


def loopback_run(
    overrides: Mapping[str, Any],
    results: Path,
    grid_class: type[LoopbackGrid] = LoopbackGrid,
    num_clients: int = NUM_CLIENTS,
) -> dict[str, Any]:
    """Run :data:`TINY_JOB` with ``overrides`` on ``grid_class``; its summary.json.

    The returned dict also holds ``_folder``, the run's results folder. Call it
    inside :func:`in_process_server`.

    Parameters
    ----------
    overrides : Mapping[str, Any]
        Run-config keys that replace or add to :data:`TINY_JOB`'s (``strategy``...).
    results : Path
        The folder the run writes its results folder into.
    grid_class : type[LoopbackGrid] (default: LoopbackGrid)
        The grid the nodes run on (:class:`ChurnGrid`: nodes that come and go).
    num_clients : int (default: NUM_CLIENTS)
        Nodes of the federation; ``min-nodes`` too unless ``overrides`` sets it.
    """
    settings = parse_run_config({**TINY_JOB, "min-nodes": num_clients,
                                 "results-dir": str(results), **overrides})
    grid = grid_class(build_client_app(settings), num_clients, settings)
    folder = server_app.run_federation(grid, settings)
    summary = json.loads((folder / "summary.json").read_text())
    summary["_folder"] = folder
    return summary


def message_round(message: Message) -> int:
    """The server round a message's config names (0 for the start-up queries)."""
    config = message.content.config_records.get(p.CONFIG)
    return int(config.get(p.CFG_ROUND, 0)) if config is not None else 0  # type: ignore[arg-type]


class ChurnGrid(LoopbackGrid):
    """A node that leaves after round 1 and a node that joins once round 1 has started.

    ``LOST`` is listed until a message of round 2 is sent, then answers every
    message with Flower's node-unavailable error; ``LATE`` is not listed until a
    message of round 1 is sent. The replies to the first ``CORRUPTED`` train
    messages from round 2 on carry a NaN model (the first) or no example count
    (the others). Run it with ``min-nodes`` one below the nodes it has: the late
    node is not there at the start.
    """

    LOST = 1000
    LATE = 1000 + NUM_CLIENTS - 1
    CORRUPTED = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.latest_round = 0
        self.corrupted: list[int] = []

    def get_node_ids(self) -> Iterable[int]:
        """The nodes connected now."""
        nodes = set(self.contexts)
        if self.latest_round < 1:
            nodes.discard(self.LATE)
        if self.latest_round >= 2:
            nodes.discard(self.LOST)
        return sorted(nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver, with the lost node's error replies and the corrupted replies."""
        messages = list(messages)
        self.latest_round = max([self.latest_round, *map(message_round, messages)])
        ids = list(super().push_messages(messages))
        for message in messages:
            reply = self._replies.get(message.metadata.message_id)
            if reply is None:
                continue
            if self.latest_round >= 2 and message.metadata.dst_node_id == self.LOST:
                error = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node left the federation")
                self._replies[message.metadata.message_id] = Message(error, reply_to=message)
            elif (message_round(message) >= 2 and message.metadata.message_type == p.TRAIN
                  and not reply.has_error() and len(self.corrupted) < self.CORRUPTED):
                self._replies[message.metadata.message_id] = corrupt(reply, len(self.corrupted))
                self.corrupted.append(message.metadata.dst_node_id)
        return ids


def corrupt(reply: Message, kind: int) -> Message:
    """``reply`` with its model's values NaN (``kind`` 0) or without ``num-examples``."""
    content = reply.content
    if kind == 0:
        for name in (p.ARRAYS, p.CLUSTERS):
            if name in content.array_records:
                record = content[name]
                content[name] = p.numpy_to_record(
                    list(record.keys()), [np.full_like(a.numpy(), np.nan) for a in record.values()])
    else:
        metrics = dict(content.metric_records[p.METRICS])
        metrics.pop(p.M_NUM_EXAMPLES, None)
        content[p.METRICS] = MetricRecord(metrics)
    return reply
