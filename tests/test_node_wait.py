"""wait_for_nodes: waits for min-nodes, then only while nodes keep arriving, bounded."""

import time

import pytest

from fl_clusters import server_app


class _Arrivals:
    """A grid stand-in whose node count follows a schedule of (seconds, count)."""

    def __init__(self, schedule: list[tuple[float, int]]) -> None:
        self.schedule = schedule
        self.start = time.monotonic()

    def get_node_ids(self) -> list[int]:
        elapsed = time.monotonic() - self.start
        count = max(n for at, n in self.schedule if at <= elapsed)
        return list(range(1, count + 1))


def test_settle_is_bounded_when_nodes_never_stop_arriving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node every 0.1 s never gives a quiet period; the bounded settle still returns."""
    monkeypatch.setattr(server_app, "NODE_SETTLE_MAX_S", 1.0)
    grid = _Arrivals([(0.1 * i, 2 + i) for i in range(200)])
    assert len(server_app.wait_for_nodes(grid, 2)) >= 2


def test_waits_while_nodes_keep_arriving() -> None:
    grid = _Arrivals([(0.0, 2), (0.5, 3), (1.2, 5)])
    assert server_app.wait_for_nodes(grid, 2) == [1, 2, 3, 4, 5]


def test_too_few_nodes_raise_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_app, "NODE_WAIT_S", 0.5)
    with pytest.raises(RuntimeError, match="min-nodes"):
        server_app.wait_for_nodes(_Arrivals([(0.0, 1)]), 3)
