"""Replies that lie about who sent them (issue 59): a node is its Flower node id.

A key or partition another live node holds is refused at the handshake (the first
holder keeps it), a later claim that contradicts what a node id registered is
rejected naming both, and the log names a sender by its own registered identity.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import handshake
from fl_clusters import protocol as p
from fl_clusters.handshake import NodeIdentities, NodeRegistry, identify_nodes
from fl_clusters.strategies import IFCA
from tests.conftest import StubGrid, train_reply


def _model(value: float) -> ArrayRecord:
    return p.numpy_to_record(
        ["layer.weight", "layer.bias"],
        [np.full((3, 4), value, np.float32), np.full(3, value, np.float32)],
    )


class ClaimingGrid(StubGrid):
    """Nodes answering the identity query with the (key, partition) given for each."""

    def __init__(self, claims: dict[int, tuple[int, int | None]]) -> None:
        super().__init__(list(claims))
        self.claims = claims

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:  # type: ignore[override]
        replies = []
        for msg in messages:
            key, partition = self.claims[msg.metadata.dst_node_id]
            metrics = MetricRecord({p.M_NODE_KEY: key})
            if partition is not None:
                metrics[p.M_PARTITION_ID] = partition
            replies.append(Message(RecordDict({p.METRICS: metrics}), reply_to=msg))
        return replies


def test_a_second_node_claiming_a_held_key_or_partition_is_refused_at_the_handshake(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Node 2 copies node 1's key and partition; node 3 only its partition.
    grid = ClaimingGrid({1: (7, 7), 2: (7, 7), 3: (8, 7), 4: (9, 9)})
    with caplog.at_level(logging.WARNING):
        found = identify_nodes(grid, grid.nodes, timeout=1.0)
    assert found.keys == {1: 7, 2: None, 3: None, 4: 9}
    assert found.partitions == {1: 7, 4: 9}
    assert found.problems == {
        2: "refused: it claims node-key 7 and partition 7, held by node 1 (partition 7)",
        3: "refused: it claims node-key 8 and partition 7, held by node 1 (partition 7)",
    }
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    registry = NodeRegistry()
    registry.adopt(found)
    # The liar is named by its own node id, never by the partition it claimed.
    assert registry.describe(2) == "node 2" and registry.describe(1) == "partition 7"


def test_the_first_node_asked_alone_keeps_its_key(
    server_identity: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handshake, "FIRST_NODE_ALONE_FROM", 3)
    grid = ClaimingGrid({1: (7, 7), 2: (8, 8), 3: (7, 7)})
    found = handshake.identify_federation(grid, grid.nodes, timeout=1.0)
    assert found.keys == {1: 7, 2: 8, 3: None}
    assert "held by node 1 (partition 7)" in found.problems[3]


def test_a_late_joiner_cannot_take_a_live_nodes_key_but_may_take_a_departed_ones(
    server_identity: None,
) -> None:
    registry = NodeRegistry()
    registry.learn(ClaimingGrid({1: (7, 7), 2: (8, 8)}), [1, 2], timeout=1.0)
    assert registry.learn(ClaimingGrid({1: (7, 7), 2: (8, 8), 5: (7, 7)}), [1, 2, 5], 1.0) == 1
    assert registry.keys[5] is None and 5 not in registry.partitions
    assert registry.keys[1] == 7 and registry.partitions[1] == 7
    # Node 1 has left; the same node back under a new id gets its key again.
    assert registry.learn(ClaimingGrid({2: (8, 8), 6: (7, 7)}), [2, 6], 1.0) == 0
    assert registry.keys[6] == 7 and registry.partitions[6] == 7


def test_a_later_identity_that_contradicts_the_registered_one_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = NodeRegistry()
    registry.adopt(NodeIdentities(keys={1: 7}, partitions={1: 7}))
    later = NodeIdentities(keys={1: 9}, partitions={1: 9})
    with caplog.at_level(logging.WARNING):
        registry.adopt(later)
    assert registry.keys == {1: 7} and registry.partitions == {1: 7}
    assert later.problems == {
        1: "refused: it claims node-key 9, but the handshake registered 7 for node 1"}
    assert "identity: partition 7: refused: it claims node-key 9" in caplog.text


def test_a_train_reply_claiming_another_key_is_rejected_and_logged_as_its_sender(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    grid = ClaimingGrid({1: (1, 1), 2: (2, 2), 3: (3, 3), 4: (4, 4)})
    strategy = IFCA(num_clusters=2, init="random", restarts=1, min_available_nodes=4)
    strategy.prepare(grid, 60.0, 3)  # type: ignore[arg-type]
    requests = list(strategy.configure_train(1, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    sent = p.unpack_clusters(requests[0].content.array_records[p.CLUSTERS])
    replies = []
    for msg in requests:
        node = msg.metadata.dst_node_id
        reply = train_reply(msg, _model(float(node)), 10, 0 if node < 3 else 1)
        if node == 2:  # node 2 says it is node 1 (its key)
            reply.content.metric_records[p.METRICS][p.M_NODE_KEY] = 1
        replies.append(reply)
    with caplog.at_level(logging.WARNING):
        packed, _ = strategy.aggregate_train(1, replies)
    assert packed is not None
    assert strategy.rejected_replies == 1
    assert ("rejected reply from partition 2: it claims node-key 1, but the handshake "
            "registered 2 for node 2") in caplog.text
    cluster0, cluster1 = p.unpack_clusters(packed)
    np.testing.assert_array_equal(cluster0["layer.bias"].numpy(), 1.0)  # node 1 alone
    np.testing.assert_array_equal(cluster1["layer.bias"].numpy(), 3.5)
    assert not np.array_equal(cluster0["layer.bias"].numpy(), sent[0]["layer.bias"].numpy())
