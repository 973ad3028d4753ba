"""The ServerApp's grid: traffic metering and flow control around Flower's Grid."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from fl_clusters import protocol as p

# Replies are pulled after PULL_FIRST_S, then every PULL_SHARE of the time waited so
# far, at most every PULL_MAX_S. Flower's grids sleep a fixed 0.1 s (InMemoryGrid,
# simulation) or 3 s (HttpGrid, deployment) between pulls: most of a short round.
PULL_FIRST_S = 0.002
PULL_SHARE = 0.05
PULL_MAX_S = 0.5
# In simulation at most this many messages per CPU core wait in Flower's in-memory
# state at once: its dispatcher checks every stored message for every node every
# 0.1 s, so a tick costs nodes x stored messages and takes its cycles from the
# ClientApp actors. A smaller window starves the actors, a larger one feeds the
# dispatcher (docs/performance.md).
SIMULATION_IN_FLIGHT_PER_CORE = 16


def record_bytes(content: RecordDict) -> int:
    """Bytes of a message's records (arrays, metrics and configs)."""
    return sum(record.count_bytes() for record in content.values())


def local_cores() -> int:
    """The CPU cores this process may run on (Flower's simulation runs its actors on
    the same machine, one CPU each by default)."""
    # sched_getaffinity honours CPU limits set on the process; it is Linux-only.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def simulation_in_flight() -> int:
    """The default message window in simulation: ``SIMULATION_IN_FLIGHT_PER_CORE``
    times :func:`local_cores`."""
    return SIMULATION_IN_FLIGHT_PER_CORE * local_cores()


class WrappingGrid(Grid):
    """A Grid around another whose run and message creation stay the wrapped grid's.

    Parameters
    ----------
    grid : Grid
        The Grid to wrap.
    """

    def __init__(self, grid: Grid) -> None:
        self._grid = grid

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


class MeteredGrid(WrappingGrid):
    """A Grid that counts the bytes of every message content it sends and receives.

    It wraps the Grid Flower hands the ServerApp, so it meters any strategy,
    Flower's own included, without touching it. Traffic is tallied per
    ``server-round`` (read from the outgoing config, 0 when absent).

    ``send_and_receive`` pushes and pulls through the wrapped grid itself, pulling
    at an interval that grows with the wait (2 ms at first, 5 % of the time
    waited since the last push, at most 0.5 s), so a reply is collected within
    5 % of the round's time instead of after Flower's fixed pull interval.

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
        super().__init__(grid)
        self.max_in_flight = max_in_flight
        self.sent: dict[int, int] = defaultdict(int)
        self.received: dict[int, int] = defaultdict(int)
        # Messages whose reply did not come before the timeout (late, or the node left).
        self.unanswered = 0
        # Every node id the grid ever listed, to tell joined and lost nodes apart.
        self.nodes_seen: set[int] = set()
        self._listed_range = range(0)

    @property
    def bytes_sent(self) -> int:
        """Bytes of all message contents sent."""
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        """Bytes of all reply contents received."""
        return sum(self.received.values())

    def get_node_ids(self) -> Iterable[int]:
        """Delegate to the wrapped grid, remembering every node it lists."""
        nodes = self._grid.get_node_ids()
        if isinstance(nodes, range):
            # Logical clients (fl_clusters.logical_grid): the same ids every call, so
            # they are remembered once, not walked again each time they are listed.
            if nodes != self._listed_range:
                self.nodes_seen.update(nodes)
                self._listed_range = nodes
            return nodes
        nodes = list(nodes)
        self.nodes_seen.update(nodes)
        return nodes

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
        """Send, receive and count; wait at most ``timeout`` seconds (``None``: for all).

        Replies come in arrival order.
        """
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
