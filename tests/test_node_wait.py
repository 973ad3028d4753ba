"""wait_for_nodes: waits for min-nodes, then only while nodes keep arriving, bounded."""

import time
from collections.abc import Callable

import pytest

from fl_clusters import server_app


class _Arrivals:
    """A grid stand-in whose node count follows a schedule of (seconds, count)."""

    def __init__(self, schedule: list[tuple[float, int]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = schedule
        self.clock = clock
        self.start = clock()

    def get_node_ids(self) -> list[int]:
        elapsed = self.clock() - self.start
        count = max(n for at, n in self.schedule if at <= elapsed)
        return list(range(1, count + 1))


class _Clock:
    """``time`` for the code under test: ``sleep`` advances ``monotonic`` at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_settle_is_bounded_when_nodes_never_stop_arriving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node every poll never gives a quiet period; the wait ends at the bound.

    Times are multiples of 0.25 s, exact in binary, so the poll that reaches the
    bound is known: the one at 1.0 s, when 2 + 4 nodes are connected.
    """
    clock = _Clock()
    monkeypatch.setattr(server_app, "time", clock)
    monkeypatch.setattr(server_app, "NODE_POLL_S", 0.25)
    monkeypatch.setattr(server_app, "NODE_SETTLE_MAX_S", 1.0)
    grid = _Arrivals([(0.25 * i, 2 + i) for i in range(200)], clock.monotonic)
    assert server_app.wait_for_nodes(grid, 2) == [1, 2, 3, 4, 5, 6]
    assert clock.now == 1.0


def test_waits_while_nodes_keep_arriving() -> None:
    grid = _Arrivals([(0.0, 2), (0.5, 3), (1.2, 5)])
    assert server_app.wait_for_nodes(grid, 2) == [1, 2, 3, 4, 5]


def test_too_few_nodes_raise_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_app, "NODE_WAIT_S", 0.5)
    with pytest.raises(RuntimeError, match="min-nodes"):
        server_app.wait_for_nodes(_Arrivals([(0.0, 1)]), 3)
