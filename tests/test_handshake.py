"""The stable-key handshake: a node that misses it is asked again, a bounded number of times."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message

from fl_clusters.handshake import IDENTITY_ASKS, NodeRegistry, identify_nodes
from tests.conftest import StubGrid


class LateGrid(StubGrid):
    """A StubGrid whose nodes in ``silent`` miss their first ``misses`` identity queries."""

    def __init__(self, nodes: list[int], silent: set[int], misses: int) -> None:
        super().__init__(nodes)
        self.silent = silent
        self.misses = misses
        self.asked: dict[int, int] = {}

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        answered = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            self.asked[node] = self.asked.get(node, 0) + 1
            if node not in self.silent or self.asked[node] > self.misses:
                answered.append(msg)
        return super().send_and_receive(answered)


def test_a_node_that_misses_the_handshake_is_asked_again_and_gets_its_key(
    server_identity: None,
) -> None:
    grid = LateGrid([1, 2, 3], silent={2}, misses=1)
    registry = NodeRegistry()
    found = identify_nodes(grid, grid.nodes, timeout=1.0)
    assert found.unanswered == [2] and 2 not in found.keys
    registry.adopt(found)
    assert registry.keys == {1: 999, 3: 997}
    registry.learn(grid, grid.nodes, timeout=1.0)
    assert registry.keys == {1: 999, 2: 998, 3: 997}
    assert grid.asked == {1: 1, 2: 2, 3: 1}
    # Known now: ordered by its key, and not asked again.
    assert registry.in_order(grid.nodes) == [3, 2, 1]
    registry.learn(grid, grid.nodes, timeout=1.0)
    assert grid.asked[2] == 2


def test_a_node_that_never_answers_is_asked_a_bounded_number_of_times(
    server_identity: None,
) -> None:
    grid = LateGrid([1, 2], silent={2}, misses=10**6)
    registry = NodeRegistry()
    for _ in range(IDENTITY_ASKS + 3):
        registry.learn(grid, grid.nodes, timeout=1.0)
    assert grid.asked == {1: 1, 2: IDENTITY_ASKS}
    assert registry.keys == {1: 999, 2: None}
    assert registry.unanswered == {}
