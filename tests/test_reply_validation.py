"""Malformed client replies are rejected field by field and never crash a strategy."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.superlink.grid import InMemoryGrid
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_clusters import grid as grid_module
from fl_clusters import protocol as p
from fl_clusters.client.task import node_key
from fl_clusters.grid import MeteredGrid
from fl_clusters.report import collect_report, report_fields
from fl_clusters.results import node_fields
from fl_clusters.strategies import ACFL, CFL, FLDC, FLHC, IFCA, FedEM, FedSoft, LocalOnly, WeCFL
from fl_clusters.strategies.kit.base import ClusteredStrategy
from tests.conftest import StubGrid

NODES = [11, 12, 13, 14, 15, 16]
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1.0, 1e30, 0.5]


# ------------------------------------------------------------------ unit level
@pytest.mark.parametrize(
    ("metrics", "fields", "problem"),
    [
        ({p.M_NUM_EXAMPLES: math.inf}, {}, "NaN or Inf"),
        ({p.M_NUM_EXAMPLES: 0}, {}, "must be > 0"),
        ({p.M_NUM_EXAMPLES: [3, 4]}, {}, "is a list"),
        ({p.M_NUM_EXAMPLES: 5}, p.TRAIN_FIELDS, "no 'train-loss'"),
        ({p.M_NUM_EXAMPLES: 5, p.M_TRAIN_LOSS: math.nan}, p.TRAIN_FIELDS, "NaN or Inf"),
        ({p.M_NUM_EXAMPLES: 5, p.M_ACCURACY: 1.5, p.M_LOSS: 0.1}, p.EVALUATE_FIELDS,
         r"outside \[0, 1\]"),
        ({p.M_NUM_EXAMPLES: 5, p.M_CLUSTER: 0.5},
         {p.M_CLUSTER: p.MetricField(integer=True, required=False)}, "whole numbers"),
        ({p.M_NUM_EXAMPLES: 5, p.M_CLUSTER_LOSSES: [0.1]},
         {p.M_CLUSTER_LOSSES: p.MetricField(length=2)}, "must hold 2 numbers, got 1"),
        ({p.M_NUM_EXAMPLES: 5, p.M_COUNTS: [3, -1]},
         {p.M_COUNTS: p.MetricField(length=2, low=0.0)}, "outside"),
    ],
)
def test_check_metrics_names_the_bad_field(
    metrics: dict, fields: dict, problem: str
) -> None:
    found = p.check_metrics(MetricRecord(metrics), fields)
    assert found is not None
    assert re.search(problem, found), found


def test_check_metrics_accepts_a_valid_reply_and_an_absent_optional_field() -> None:
    fields = {**p.TRAIN_FIELDS, p.M_CLUSTER: p.MetricField(integer=True, required=False)}
    assert p.check_metrics(MetricRecord({p.M_NUM_EXAMPLES: 5, p.M_TRAIN_LOSS: 0.3}), fields) is None
    record = MetricRecord({p.M_NUM_EXAMPLES: 5, p.M_TRAIN_LOSS: 0.3, p.M_CLUSTER: 1})
    assert p.check_metrics(record, fields) is None


def test_a_report_keeps_a_diverged_models_infinite_loss_and_refuses_nan() -> None:
    """An attacker can blow its own cluster's model up; every node scores every model
    in the final report, so an Inf loss there must not void every node's report."""
    fields = report_fields(2)
    report = {p.M_NUM_EXAMPLES: 5, "num-test": 10, "test-accuracy": [0.9, 0.1],
              "test-loss": [0.3, p.reported_loss(math.nan)], "train-loss": [0.2, math.inf]}
    assert report["test-loss"][1] == math.inf
    assert p.check_metrics(MetricRecord(report), fields) is None
    for bad in (math.nan, -math.inf):
        found = p.check_metrics(MetricRecord({**report, "test-loss": [0.3, bad]}), fields)
        assert found == "'test-loss' holds NaN or -Inf"
    # Rounds' training replies still refuse an infinite loss.
    assert p.check_metrics(MetricRecord({p.M_NUM_EXAMPLES: 5, p.M_TRAIN_LOSS: math.inf}),
                           p.TRAIN_FIELDS) == "'train-loss' holds NaN or Inf"
    # A node choosing by loss passes a diverged model over.
    assert int(np.argmin([p.reported_loss(math.nan), 0.7])) == 1


# --------------------------------------------------------------- property level
def _model() -> ArrayRecord:
    rng = np.random.default_rng(0)
    return p.numpy_to_record(
        ["fc.weight", "fc.bias"],
        [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32)],
    )


def _number(bad: bool) -> st.SearchStrategy[float]:
    good = st.floats(0.0, 3.0, allow_nan=False)
    return st.sampled_from(BAD_NUMBERS) if bad else good


def _metric(draw: st.DrawFn, name: str, num_clusters: int) -> float | int | list | None:
    """A value for one metric: absent, valid, or broken in one of many ways."""
    kind = draw(st.sampled_from(["valid"] * 4 + ["absent", "bad-number", "wrong-type"]))
    if kind == "absent":
        return None
    bad = kind == "bad-number"
    vectors = {p.M_CLUSTER_LOSSES, p.M_COUNTS, p.M_FEATURE_MEAN}
    if kind == "wrong-type":
        # A list where a number is read, or a number/list of the wrong length.
        return draw(st.one_of(st.just([1.0, 2.0, 3.0, 4.0, 5.0]), st.just(1.0)))
    if name in vectors:
        length = 4 if name == p.M_FEATURE_MEAN else num_clusters
        return draw(st.lists(_number(bad), min_size=length, max_size=length))
    if name == p.M_CLUSTER:
        return draw(st.sampled_from(BAD_NUMBERS) if bad else st.integers(0, num_clusters - 1))
    if name == p.M_NUM_EXAMPLES:
        return draw(st.sampled_from(BAD_NUMBERS) if bad else st.integers(1, 50))
    if name == p.M_ACCURACY:
        return draw(st.sampled_from(BAD_NUMBERS) if bad else st.floats(0.0, 1.0))
    return draw(_number(bad))


def _arrays(draw: st.DrawFn, sent: ArrayRecord) -> ArrayRecord:
    """The model a client returns: what it was sent, trained a little, or broken."""
    names = list(sent.keys())
    arrays = [a.numpy() + draw(st.floats(-0.5, 0.5)) for a in sent.values()]
    kind = draw(st.sampled_from(["valid"] * 5 + ["nan", "shape", "missing-key"]))
    if kind == "nan":
        arrays[0] = arrays[0].copy()
        arrays[0].flat[0] = np.nan
    elif kind == "shape":
        arrays[1] = np.zeros(arrays[1].size + 1, dtype=np.float32)
    elif kind == "missing-key":
        names, arrays = names[:1], arrays[:1]
    return p.numpy_to_record(names, arrays)


class FuzzGrid(StubGrid):
    """A grid whose nodes answer every message with a random, often malformed, reply."""

    def __init__(self, draw: st.DrawFn, num_clusters: int) -> None:
        super().__init__(NODES)
        self.draw = draw
        self.num_clusters = num_clusters
        self.errors = 0

    def send_and_receive(  # type: ignore[override]
        self, messages: Iterable[Message], **_: object
    ) -> list[Message]:
        return [r for r in (self._reply(m) for m in messages) if r is not None]

    def _reply(self, msg: Message) -> Message | None:
        draw = self.draw
        kind = draw(st.sampled_from(["answer"] * 6 + ["error", "silent"]))
        if kind == "silent":  # stalled past the timeout: the grid returns no reply
            return None
        if kind == "error":
            self.errors += 1
            return Message(Error(code=0, reason="fuzzed crash"), reply_to=msg)
        names = [p.M_NUM_EXAMPLES, p.M_TRAIN_LOSS, p.M_CLUSTER, p.M_CLUSTER_LOSSES,
                 p.M_COUNTS, p.M_ACCURACY, p.M_LOSS, p.M_FEATURE_MEAN]
        values = {n: _metric(draw, n, self.num_clusters) for n in names}
        content = RecordDict({p.METRICS: MetricRecord(
            {n: v for n, v in values.items() if v is not None}
        )})
        if msg.metadata.message_type == MessageType.TRAIN:
            records = msg.content.array_records
            sent = records.get(p.ARRAYS) or p.unpack_clusters(
                records.get(p.CLUSTERS) or records[p.CENTERS])[0]
            content[p.ARRAYS] = _arrays(draw, sent)
        return Message(content, reply_to=msg)


STRATEGIES: dict[str, Callable[[], ClusteredStrategy]] = {
    "ifca-kmeans": lambda: IFCA(num_clusters=2, init="local-kmeans", init_steps=1,
                                min_available_nodes=2),
    "ifca-random": lambda: IFCA(num_clusters=2, init="random", restarts=2, min_available_nodes=2),
    "ifca-gradient": lambda: IFCA(num_clusters=2, init="random", mode="gradient",
                                  min_available_nodes=2),
    "cfl": lambda: CFL(warmup_rounds=0, min_available_nodes=2),
    "acfl": lambda: ACFL(phase1_rounds=1, min_available_nodes=2),
    "fedsoft": lambda: FedSoft(num_clusters=2, tau=1, min_available_nodes=2),
    "fldc": lambda: FLDC(min_pts=2, min_available_nodes=2),
    "local": lambda: LocalOnly(min_available_nodes=2),
    "flhc": lambda: FLHC(warmup_rounds=1, min_available_nodes=2),
    "wecfl": lambda: WeCFL(num_clusters=2, min_available_nodes=2),
    "fedem": lambda: FedEM(num_clusters=2, init_steps=1, min_available_nodes=2),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
# Derandomized: CI runs the same cases every time, so a failure always reproduces.
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.large_base_example, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_malformed_replies_never_crash_a_strategy(
    server_identity: None, name: str, data: st.DataObject
) -> None:
    strategy = STRATEGIES[name]()
    strategy.max_failed_rounds = 1_000  # here every round may fail: that is not the test
    grid = FuzzGrid(data.draw, num_clusters=2)
    result = strategy.start(grid, _model(), num_rounds=4)  # type: ignore[arg-type]
    # Nothing malformed reached a model: every array the run returns is finite.
    # (A run in which no round had a valid reply returns no model at all; the
    # ServerApp refuses to write that, see test_faults.py.)
    for array in result.arrays.values():
        assert np.all(np.isfinite(array.numpy()))
    # Every error reply was seen and counted (and malformed ones on top of them).
    assert strategy.rejected_replies >= grid.errors


# ------------------------------------------------------------- the final report
class ReportGrid(StubGrid):
    """Nodes answering the final report with the given metrics (or an error)."""

    def __init__(self, answers: dict[int, dict | None]) -> None:
        super().__init__(list(answers))
        self.answers = answers

    def send_and_receive(  # type: ignore[override]
        self, messages: Iterable[Message], **_: object
    ) -> list[Message]:
        replies = []
        for msg in messages:
            answer = self.answers[msg.metadata.dst_node_id]
            content = Error(code=0, reason="crash") if answer is None else RecordDict(
                {p.METRICS: MetricRecord(answer)}
            )
            replies.append(Message(content, reply_to=msg))
        return replies


def test_malformed_reports_are_left_out_and_listed(server_identity: None) -> None:
    good = {"test-accuracy": [0.5, 0.9], "test-loss": [1.0, 0.2], "train-loss": [1.1, 0.3],
            "num-test": 10, p.M_NUM_EXAMPLES: 40}
    answers: dict[int, dict | None] = {
        1: good,
        2: {**good, "test-accuracy": [math.nan, 0.9]},
        3: {**good, "train-loss": [0.3]},
        4: None,
        # IFCA sent it no cluster: it must say which model fits its training data.
        5: {key: value for key, value in good.items() if key != "train-loss"},
    }
    grid = MeteredGrid(ReportGrid(answers))  # type: ignore[arg-type]
    packed = p.pack_clusters([_model(), _model()])
    settings_ = {"mcfl-feature-samples": 8, "round-timeout": 5.0}
    rows, answered = collect_report(grid, IFCA(num_clusters=2), packed, [1, 2, 3, 4, 5], settings_)
    assert answered == {1, 2, 3, 4, 5}
    assert [r["node-id"] for r in rows] == [1]
    assert rows[0]["assigned"] == 1  # lowest training loss
    fields = node_fields([1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 5], {1, 2, 3, 4, 5, 9}, rows,
                         answered)
    assert fields == {"lost_nodes": [9], "late_nodes": [], "unreported_nodes": [2, 3, 4, 5],
                      "report_asked": 5, "report_of": 5}
    assert set(report_fields(2)) >= {"test-accuracy", "train-loss", "num-test"}


def test_a_report_naming_another_partition_is_filed_under_its_own(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    good = {"test-accuracy": [0.5, 0.9], "test-loss": [1.0, 0.2], "train-loss": [1.1, 0.3],
            "num-test": 10, p.M_NUM_EXAMPLES: 40}
    strategy = IFCA(num_clusters=2)
    strategy.nodes.partitions.update({1: 0, 2: 1})
    grid = MeteredGrid(ReportGrid({1: {**good, "partition-id": 0},
                                   2: {**good, "partition-id": 0}}))  # type: ignore[arg-type]
    packed = p.pack_clusters([_model(), _model()])
    settings_ = {"mcfl-feature-samples": 8, "round-timeout": 5.0}
    with caplog.at_level(logging.WARNING):
        rows, answered = collect_report(grid, strategy, packed, [1, 2], settings_)
    assert answered == {1, 2}
    assert [(r["node-id"], r["partition-id"]) for r in rows] == [(1, 0), (2, 1)]
    assert ("report: partition 1 now reports partition-id 0: its data changed since the "
            "handshake, or it claims another node's; it stays partition 1 in the results"
            ) in caplog.text
    # Another node's key is an identity: that report is left out.
    strategy.nodes.keys.update({1: 11, 2: 12})
    grid = MeteredGrid(ReportGrid({1: good, 2: {**good, p.M_NODE_KEY: 11}}))  # type: ignore[arg-type]
    rows, _ = collect_report(grid, strategy, packed, [1, 2], settings_)
    assert [r["node-id"] for r in rows] == [1]


def test_late_nodes_are_marked_in_the_report_rows() -> None:
    rows = [{"node-id": 1}, {"node-id": 7}]
    fields = node_fields([1, 2], [1, 7], {1, 2, 7}, rows, {1, 7})
    assert fields == {"lost_nodes": [2], "late_nodes": [7], "unreported_nodes": [],
                      "report_asked": 2, "report_of": 2}
    # A node still listed but silent at the report is lost, not unreported.
    assert node_fields([1, 2], [1, 2], {1, 2}, rows[:1], {1})["lost_nodes"] == [2]
    # A node the report's sample left out is neither lost nor unreported.
    sampled = node_fields([1, 2, 3], [1, 2, 3], {1, 2, 3}, rows[:1], {1}, asked=[1])
    assert sampled["lost_nodes"] == sampled["unreported_nodes"] == []
    assert (sampled["report_asked"], sampled["report_of"]) == (1, 3)
    assert [r["late"] for r in rows] == [False, True]


def test_the_metered_grid_counts_messages_without_a_reply(server_identity: None) -> None:
    class Silent(ReportGrid):
        def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:  # type: ignore[override]
            return super().send_and_receive(list(messages)[:1])

    grid = MeteredGrid(Silent({1: {p.M_NUM_EXAMPLES: 1}, 2: None}))  # type: ignore[arg-type]
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN)
                for n in (1, 2)]
    assert len(list(grid.send_and_receive(messages, timeout=1.0))) == 1
    assert grid.unanswered == 1
    assert sorted(grid.get_node_ids()) == [1, 2] and grid.nodes_seen == {1, 2}


# ------------------------------------------------------ stable order (determinism)
def test_sampling_and_reply_order_follow_the_handshake_keys(server_identity: None) -> None:
    # StubGrid's key for node n is 1000 - n: the reverse of the id order.
    strategy = IFCA(num_clusters=2, init="random", min_available_nodes=3, fraction_train=1.0)
    strategy.start(StubGrid([5, 7, 9]), _model(), num_rounds=0)  # type: ignore[arg-type]
    assert strategy.nodes.keys == {5: 995, 7: 993, 9: 991}
    assert strategy.sample(StubGrid([5, 7, 9]), 1.0) == [9, 7, 5]
    requests = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.EVALUATE)
                for n in (5, 9, 7)]
    replies = [Message(RecordDict({p.METRICS: MetricRecord(
        {p.M_NUM_EXAMPLES: 3, p.M_ACCURACY: 0.5, p.M_LOSS: 1.0})}), reply_to=m) for m in requests]
    valid = strategy.check_replies(replies, None, "aggregate_evaluate", p.EVALUATE_FIELDS,
                                   trains=False)
    assert [m.metadata.src_node_id for m in valid] == [9, 7, 5]


def test_a_node_without_a_key_is_ordered_after_the_keyed_ones(server_identity: None) -> None:
    class NoIdentity(StubGrid):
        def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:  # type: ignore[override]
            messages = list(messages)
            answered = super().send_and_receive([m for m in messages
                                                 if m.metadata.dst_node_id != 3])
            return answered + [Message(Error(code=0, reason="no handler"), reply_to=m)
                               for m in messages if m.metadata.dst_node_id == 3]

    strategy = IFCA(num_clusters=2, init="random", min_available_nodes=3)
    strategy.start(NoIdentity([1, 2, 3]), _model(), num_rounds=0)  # type: ignore[arg-type]
    assert strategy.nodes.keys[3] is None
    assert sorted([1, 2, 3], key=strategy.node_order) == [2, 1, 3]


def test_the_client_key_is_the_partition_id_else_a_stable_hash() -> None:
    def context(node_config: dict) -> Context:
        return Context(run_id=1, node_id=12345, node_config=node_config, state=RecordDict(),
                       run_config={})

    assert node_key(context({"partition-id": 4, "num-partitions": 8})) == 4
    assert node_key(context({"site": "a"})) == node_key(context({"site": "a"}))
    assert node_key(context({"site": "a"})) != node_key(context({"site": "b"}))


class SlowNodes(StubGrid):
    """Node n's reply can be pulled only from fake time ``n`` seconds on."""

    def __init__(self, nodes: list[int], clock: list[float]) -> None:
        super().__init__(nodes)
        self.clock = clock
        self.pulls = 0

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        wanted = set(message_ids)
        ready = [m for m in self._pushed
                 if m.metadata.message_id in wanted and m.metadata.dst_node_id <= self.clock[0]]
        self._pushed = [m for m in self._pushed if m not in ready]
        return [Message(RecordDict({p.METRICS: MetricRecord({p.M_NUM_EXAMPLES: 1})}), reply_to=m)
                for m in ready]


@pytest.mark.parametrize("timeout", [None, 2.5])
def test_the_metered_grid_pulls_soon_after_sending_and_less_often_as_it_waits(
    server_identity: None, monkeypatch: pytest.MonkeyPatch, timeout: float | None
) -> None:
    clock = [0.0]
    pauses: list[float] = []

    class FakeTime:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

        @staticmethod
        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            clock[0] += seconds

    monkeypatch.setattr(grid_module, "time", FakeTime)
    inner = SlowNodes([1, 2, 3], clock)
    grid = MeteredGrid(inner)  # type: ignore[arg-type]
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN)
                for n in (1, 2, 3)]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    got = sorted(m.metadata.src_node_id for m in replies)
    # Flower's in-memory grid would first pull again after 0.1 s, its gRPC grid after 3 s.
    assert pauses[0] == grid_module.PULL_FIRST_S
    assert max(pauses) <= grid_module.PULL_MAX_S
    # The interval only grows with the wait (the last pause may be cut to the timeout).
    assert pauses[:-1] == sorted(pauses[:-1])
    if timeout is None:
        assert got == [1, 2, 3] and grid.unanswered == 0
        # Node 3's reply (ready at t = 3 s) is collected within 5 % of the wait.
        assert clock[0] <= 3 * (1 + grid_module.PULL_SHARE) + grid_module.PULL_FIRST_S
    else:
        assert got == [1, 2] and grid.unanswered == 1
        assert clock[0] == pytest.approx(timeout)


def test_the_metered_grid_keeps_at_most_max_in_flight_messages_waiting(
    server_identity: None,
) -> None:
    class Counting(StubGrid):
        def __init__(self) -> None:
            super().__init__([1, 2, 3, 4, 5])
            self.outstanding, self.most, self.order = 0, 0, []  # type: ignore[var-annotated]

        def push_messages(self, messages: Iterable[Message]) -> list[str]:
            messages = list(messages)
            self.order += [m.metadata.dst_node_id for m in messages]
            self.outstanding += len(messages)
            self.most = max(self.most, self.outstanding)
            return super().push_messages(messages)

        def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
            answered, self._pushed = self._pushed[:1], self._pushed[1:]  # one reply a pull
            self.outstanding -= len(answered)
            return [Message(RecordDict({p.METRICS: MetricRecord({p.M_NUM_EXAMPLES: 1})}),
                            reply_to=m) for m in answered]

    inner = Counting()
    grid = MeteredGrid(inner, max_in_flight=2)  # type: ignore[arg-type]
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN)
                for n in (1, 2, 3, 4, 5)]
    replies = list(grid.send_and_receive(messages, timeout=None))
    assert sorted(m.metadata.src_node_id for m in replies) == [1, 2, 3, 4, 5]
    assert inner.most == 2 and inner.order == [1, 2, 3, 4, 5]
    # Deployed SuperNodes all train at once: no limit unless asked for; Flower's
    # simulation grid gets the window by default.
    assert MeteredGrid(StubGrid([1])).max_in_flight is None  # type: ignore[arg-type]
    simulated = MeteredGrid(InMemoryGrid.__new__(InMemoryGrid))
    assert simulated.max_in_flight == grid_module.simulation_in_flight()
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may use
        assert grid_module.simulation_in_flight() == 16 * len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        MeteredGrid(inner, max_in_flight=0)  # type: ignore[arg-type]


def test_the_default_window_counts_cores_where_affinity_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # macOS and Windows have no sched_getaffinity: the machine's core count stands in.
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert grid_module.simulation_in_flight() == 48
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert grid_module.simulation_in_flight() == 16


def test_the_max_in_flight_key_sets_the_window_and_leaves_the_run_unchanged(
    federation, monkeypatch: pytest.MonkeyPatch  # type: ignore[no-untyped-def]
) -> None:
    from fl_clusters import server_app

    windows: list[int | None] = []

    class Recording(MeteredGrid):
        def __init__(self, grid, max_in_flight=None):  # type: ignore[no-untyped-def]
            super().__init__(grid, max_in_flight)
            windows.append(self.max_in_flight)

    monkeypatch.setattr(server_app, "MeteredGrid", Recording)
    job = {"strategy": "ifca", "num-rounds": 2, "num-clusters": 2, "seed": 3}
    one_at_a_time = federation({**job, "max-in-flight": 1}, num_clients=6)
    default = federation(job, num_clients=6)
    assert windows == [1, grid_module.simulation_in_flight()]
    for key in ("personalized_accuracy", "ari", "bytes_sent", "bytes_received"):
        assert one_at_a_time[key] == default[key], key
