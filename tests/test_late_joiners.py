"""Nodes that join after CFL has split are placed down its split tree (Sattler et al.)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.clustering import closest_direction
from fl_clusters.strategies import CFL, IFCA
from fl_clusters.strategies.kit.replies import reply_updates

NAMES = ["body.weight", "head.bias"]
# The two groups pull the head in opposite directions.
GROUP_B = {4, 5, 6, 7}
SILENT = {8}


def _trained(start: ArrayRecord, node: int) -> ArrayRecord:
    """The model ``node`` returns: its group's direction plus a little noise."""
    sign = -1.0 if node in GROUP_B else 1.0
    head = 0.01 * sign * np.array([1.0, 0.5, 0.0, 0.0])
    head = head + np.random.default_rng(node).normal(scale=0.001, size=4)
    arrays = [start[n].numpy() for n in NAMES]
    return p.numpy_to_record(NAMES, [arrays[0], (arrays[1] + head).astype(np.float32)])


def _reply(request: Message) -> Message:
    metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5})
    start = request.content.array_records[p.ARRAYS]
    return Message(RecordDict({p.ARRAYS: _trained(start, request.metadata.dst_node_id),
                               p.METRICS: metrics}), reply_to=request)


class GrowingGrid:
    """A grid whose node set the test sets; it answers placement trainings, except SILENT."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes
        self.placements: list[int] = []

    def get_node_ids(self) -> list[int]:
        return self.nodes

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            assert msg.metadata.message_type == "train"
            self.placements.append(msg.metadata.dst_node_id)
            if msg.metadata.dst_node_id not in SILENT:
                replies.append(_reply(msg))
        return replies


def test_closest_direction_picks_the_most_similar_row() -> None:
    directions = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    assert closest_direction(np.array([0.2, 1.0]), directions) == 1
    assert closest_direction(np.array([-3.0, 0.1]), directions) == 2
    with pytest.raises(ValueError, match="directions"):
        closest_direction(np.array([1.0, 0.0]), np.ones((2, 3)))


def test_a_node_joining_after_the_split_follows_its_group(server_identity: None) -> None:
    cfl = CFL(gate="absolute", eps1=10.0, eps2=0.0, warmup_rounds=0, min_available_nodes=6)
    start = p.numpy_to_record(NAMES, [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    grid = GrowingGrid(list(range(1, 7)))
    requests = list(cfl.configure_train(1, p.pack_clusters([start]), ConfigRecord(), grid))  # type: ignore[arg-type]
    packed, _ = cfl.aggregate_train(1, [_reply(r) for r in requests])
    assert packed is not None and cfl.split_rounds == [1]
    group_b_cluster = cfl.assignments[4]
    assert {cfl.assignments[n] for n in GROUP_B - {7}} == {group_b_cluster}
    assert {cfl.assignments[n] for n in (1, 2, 3)} == {1 - group_b_cluster}
    assert grid.placements == []  # nobody is placed before a split exists

    grid.nodes = list(range(1, 9))  # nodes 7 (group B) and 8 (silent) join
    requests = list(cfl.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert sorted(grid.placements) == [7, 8]
    assert cfl.assignments[7] == group_b_cluster
    assert 8 not in cfl.assignments
    sent = {r.metadata.dst_node_id: r.content for r in requests}
    assert sent[7][p.CONFIG][p.CFG_ASSIGNED] == group_b_cluster
    # The silent newcomer still trains: it picks among all models by loss.
    assert p.CLUSTERS in sent[8] and p.CFG_ASSIGNED not in sent[8][p.CONFIG]
    assert cfl.summary_fields()["placed_nodes"] == {"7": group_b_cluster}


def test_mcfl_asks_a_node_that_joins_later_for_its_feature(server_identity: None) -> None:
    from tests.conftest import StubGrid

    features = {1: [0.0, 2.0], 2: [2.0, 4.0], 3: [10.0, 0.0], 4: [12.0, 2.0], 5: [1.0, 1.0]}
    grid = StubGrid([1, 2, 3, 4], features)
    strategy = IFCA(num_clusters=2, restarts=1, init="random", mcfl=True)
    strategy.learn_node_keys(grid, grid.nodes)  # type: ignore[arg-type]
    strategy.collect_features(grid, grid.nodes)  # type: ignore[arg-type]
    strategy.nodes.started = True  # what Strategy.start has done by round 1
    assert sorted(strategy.node_features) == [1, 2, 3, 4]
    grid.nodes = [1, 2, 3, 4, 5]  # node 5 joins
    strategy.sample(grid, 1.0)  # type: ignore[arg-type]
    assert sorted(strategy.node_features) == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(strategy.node_features[5], [1.0, 1.0])


def test_mcfl_asks_a_node_without_a_usable_feature_only_once(server_identity: None) -> None:
    from tests.conftest import StubGrid

    asked: list[int] = []

    class Counting(StubGrid):
        def send_and_receive(self, messages: Iterable[Message], **kw: object) -> list[Message]:
            messages = list(messages)
            asked.extend(m.metadata.dst_node_id for m in messages
                         if m.metadata.message_type == p.QUERY_FEATURES)
            return super().send_and_receive(messages, **kw)

    grid = Counting([1, 2], {1: [0.0, 1.0], 2: [0.0, 1.0, 2.0]})
    strategy = IFCA(num_clusters=2, restarts=1, init="random", mcfl=True)
    for _ in range(3):
        strategy.collect_features(grid, grid.nodes)  # type: ignore[arg-type]
    assert sorted(strategy.node_features) == [1]
    assert sorted(asked) == [1, 2]


def test_density_clustering_predicts_by_the_nearest_core_point() -> None:
    from fl_clusters.clustering import DensityClustering

    rng = np.random.default_rng(0)
    points = np.vstack([rng.normal(0.0, 0.1, (6, 2)), rng.normal(5.0, 0.1, (6, 2))])
    fitted = DensityClustering(min_samples=3, eps=0.5).fit(points)
    labels = fitted.predict(np.array([[0.05, 0.0], [5.1, 4.9], [2.5, 2.5]]))
    assert labels[0] == fitted.labels_[0] and labels[1] == fitted.labels_[6]
    assert labels[0] != labels[1] and labels[2] == -1  # far from every core point: noise
    with pytest.raises(ValueError, match="columns"):
        fitted.predict(np.zeros((1, 3)))


LATE_OFFSETS = {9: -1.0, 10: 40.0}


class Round0Grid(GrowingGrid):
    """Answers FLDC's placement trainings: node n returns the start plus its group's offset."""

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            self.placements.append(msg.metadata.dst_node_id)
            replies.append(_fldc_reply(msg, LATE_OFFSETS[msg.metadata.dst_node_id]))
        return replies


def _fldc_reply(request: Message, offset: float) -> Message:
    start = request.content.array_records[p.ARRAYS]
    noise = np.random.default_rng(request.metadata.dst_node_id).normal(scale=0.01, size=4)
    arrays = [start[n].numpy() + offset for n in NAMES]
    arrays[1] = (arrays[1] + noise).astype(np.float32)
    metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5})
    return Message(RecordDict({p.ARRAYS: p.numpy_to_record(NAMES, arrays),
                               p.METRICS: metrics}), reply_to=request)


def test_fldc_places_a_late_node_by_its_nearest_core_point(server_identity: None) -> None:
    from fl_clusters.strategies import FLDC

    fldc = FLDC(min_pts=3, eps=0.5, r=1.0, min_available_nodes=8)
    start = p.numpy_to_record(NAMES, [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    grid = Round0Grid(list(range(1, 9)))
    requests = list(fldc.configure_train(1, start, ConfigRecord(), grid))  # type: ignore[arg-type]
    # Round 0: nodes 1-4 move by +1, nodes 5-8 by -1: two strata.
    replies = [_fldc_reply(r, 1.0 if r.metadata.dst_node_id <= 4 else -1.0) for r in requests]
    packed, _ = fldc.aggregate_train(1, replies)
    assert packed is not None and fldc.clustering is not None
    assert fldc.clustering.num_clusters_ == 2 and grid.placements == []

    grid.nodes = list(range(1, 11))  # node 9 (like 5-8) and node 10 (far off) join
    requests = list(fldc.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert sorted(grid.placements) == [9, 10]
    assert fldc.labels[9] == fldc.labels[5] and fldc.labels[10] == -1
    trained = {r.metadata.dst_node_id for r in requests}
    assert 9 in trained and 10 not in trained  # r = 1: every stratum member trains
    assert fldc.summary_fields()["late_labels"] == {"9": fldc.labels[5], "10": -1}


def test_acfl_places_a_late_node_by_the_similarity_it_clustered_on(server_identity: None) -> None:
    from fl_clusters.strategies import ACFL

    acfl = ACFL(min_available_nodes=2)
    start = p.numpy_to_record(NAMES, [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    # What phase 2 leaves behind: nodes 1 and 4 clustered, each cluster's mean
    # phase-1 update (group A +x, group B -x) and the phase-1 start.
    acfl.assignments.update({1: 0, 4: 1})
    acfl._direction_start = start
    acfl._directions = np.stack([
        reply_updates([_reply_to(start, node)], start)[0] for node in (1, 4)
    ])
    acfl.clustering_round = 2
    grid = GrowingGrid([1, 4, 7, 8])  # 7 (group B) and 8 (silent) joined late
    packed = p.pack_clusters([start, start])
    requests = list(acfl.configure_train(3, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert sorted(grid.placements) == [7, 8]
    assert acfl.assignments[7] == 1 and 8 not in acfl.assignments
    sent = {r.metadata.dst_node_id: r.content for r in requests}
    assert sent[7][p.CONFIG][p.CFG_ASSIGNED] == 1
    assert p.CLUSTERS in sent[8]  # no answer: it picks by loss
    list(acfl.configure_train(4, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert sorted(grid.placements) == [7, 8]  # the silent node is not asked again
    assert acfl.summary_fields()["placed_nodes"] == {"7": 1}


def _reply_to(start: ArrayRecord, node: int) -> Message:
    """A reply-like message carrying the model ``node`` would return from ``start``."""
    return Message(RecordDict({p.ARRAYS: _trained(start, node)}), dst_node_id=node,
                   message_type="train")


def test_flhc_places_a_late_node_in_the_nearest_cluster(server_identity: None) -> None:
    from fl_clusters.strategies import FLHC

    flhc = FLHC(warmup_rounds=0, min_available_nodes=6)
    start = p.numpy_to_record(NAMES, [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)])
    grid = GrowingGrid(list(range(1, 7)))
    requests = list(flhc.configure_train(1, p.pack_clusters([start]), ConfigRecord(), grid))  # type: ignore[arg-type]
    packed, _ = flhc.aggregate_train(1, [_reply(r) for r in requests])
    assert packed is not None and flhc.clustering_round == 1
    group_b_cluster = flhc.assignments[4]
    assert {flhc.assignments[n] for n in (1, 2, 3)} == {1 - group_b_cluster}

    grid.nodes = list(range(1, 9))  # 7 (group B) and 8 (silent) join
    requests = list(flhc.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert sorted(grid.placements) == [7, 8]
    assert flhc.assignments[7] == group_b_cluster and 8 not in flhc.assignments
    assert flhc.summary_fields()["placed_nodes"] == {"7": group_b_cluster}
