"""A round messages the nodes it samples, not the federation (issue 46).

Every message the ServerApp sends is counted per round and node on an
in-process federation (:class:`~fl_clusters.loopback.LoopbackGrid`): with
``fraction-train`` and ``fraction-evaluate`` below 1, every round reaches only
the nodes drawn to train and those drawn to evaluate (in fl-clusters' own app the
last round too: the final report scores every node), and the handshake and the
final report ask every node once; a strategy in the user's own ServerApp
evaluates every node in its last round. A process keeps learners and partitions
for the nodes it served last only, and the handshake builds none.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message, MessageType

from fl_clusters import protocol as p
from fl_clusters.client import node_data
from fl_clusters.data import ClientData, client_data, partition
from fl_clusters.learner import TorchLearner
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.testing import in_process_server, loopback_run, message_round
from tests.test_golden import pinned

NUM_NODES = 20
NUM_ROUNDS = 3
# 4 nodes train and 5 evaluate a round.
SAMPLED = {"fraction-train": 0.2, "fraction-evaluate": 0.25, "num-rounds": NUM_ROUNDS}


class CountingGrid(LoopbackGrid):
    """A loopback grid that records (message type, round, node) of every message sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, int, int]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.sent += [(m.metadata.message_type, message_round(m), m.metadata.dst_node_id)
                      for m in messages]
        return super().push_messages(messages)


def counted_run(strategy: dict[str, Any], tmp_path: Path) -> tuple[CountingGrid, dict[str, Any]]:
    grids: list[CountingGrid] = []

    def grid(*args: Any) -> CountingGrid:
        grids.append(CountingGrid(*args))
        return grids[0]

    with in_process_server():
        summary = loopback_run({**SAMPLED, **strategy}, tmp_path, grid_class=grid,  # type: ignore[arg-type]
                               num_clients=NUM_NODES)
    return grids[0], summary


@pytest.mark.parametrize("strategy", [
    {"strategy": "fedavg"},
    {"strategy": "ifca", "ifca-init-steps": 5},
], ids=["fedavg", "ifca"])
def test_a_round_messages_only_its_training_and_evaluation_samples(
    strategy: dict[str, Any], tmp_path: Path
) -> None:
    grid, summary = counted_run(strategy, tmp_path)
    per_round: dict[int, list[tuple[str, int]]] = {}
    for kind, server_round, node in grid.sent:
        per_round.setdefault(server_round, []).append((kind, node))
    assert sorted(per_round) == [0, *range(1, NUM_ROUNDS + 1)]
    # Round 0: the handshake and the final report, each to every node once.
    start_and_report = Counter(kind for kind, _ in per_round[0])
    assert start_and_report == {p.QUERY_IDENTITY: NUM_NODES, p.QUERY_REPORT: NUM_NODES}
    evaluated = []
    for server_round in range(1, NUM_ROUNDS + 1):
        sent = per_round[server_round]
        train = [node for kind, node in sent if kind == MessageType.TRAIN]
        evaluate = [node for kind, node in sent if kind == MessageType.EVALUATE]
        # Nothing else goes out in a round, and no node gets a message twice per stage.
        assert len(train) + len(evaluate) == len(sent)
        assert len(set(train)) == len(train) == 4
        assert len(set(evaluate)) == len(evaluate) == 5
        evaluated.append(set(evaluate))
    # The samples are drawn anew: not the same five nodes every round.
    assert evaluated[0] != evaluated[1]
    assert summary["num_clients"] == NUM_NODES


@pytest.mark.parametrize("name", ["ifca", "fedavg"])
def test_in_the_users_own_serverapp_the_last_round_evaluates_every_node(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fl_clusters.config import parse_run_config
    from fl_clusters.strategies.kit import base
    from fl_clusters.strategy_builder import build_strategy

    # What Strategy.start runs first; the handshake itself is not what is tested.
    monkeypatch.setattr(base, "sample_nodes", lambda *args: ([], []))
    monkeypatch.setattr(base.ClusteredStrategy, "learn_node_keys", lambda *args: None)
    monkeypatch.setattr(base.ClusteredStrategy, "meet_nodes", lambda *args: None)
    strategy = build_strategy(parse_run_config({"strategy": name, "fraction-evaluate": 0.25}))
    strategy.prepare(None, 60.0, 3)  # type: ignore[arg-type]
    shares = [strategy.evaluated_share(r, 0.25) for r in (1, 2, 3)]
    assert shares == [0.25, 0.25, 1.0]
    assert strategy.evaluated_share(3, 0.0) == 0.0


def test_fraction_evaluate_is_a_run_config_key_with_todays_default() -> None:
    from fl_clusters.config import parse_run_config
    from fl_clusters.errors import ConfigurationError
    from fl_clusters.strategy_builder import build_strategy

    assert parse_run_config({})["fraction-evaluate"] == 1.0
    for name in ("ifca", "fedavg", "cfl"):
        built = build_strategy(parse_run_config({"strategy": name, "fraction-evaluate": 0.1}))
        assert built.fraction_evaluate == 0.1  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError,
                       match=r"'fraction-evaluate' must be a number in \[0, 1\]"):
        parse_run_config({"fraction-evaluate": 1.5})


class BuildCountingGrid(LoopbackGrid):
    """A loopback grid that records how many learners and partitions each message built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.built: list[tuple[str, int, int]] = []  # (message type, learners, partitions)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            learners, partitions = len(LEARNERS_BUILT), len(PARTITIONS_BUILT)
            ids += super().push_messages([message])
            self.built.append((message.metadata.message_type,
                               len(LEARNERS_BUILT) - learners, len(PARTITIONS_BUILT) - partitions))
        return ids


LEARNERS_BUILT: list[int] = []
PARTITIONS_BUILT: list[int] = []


def test_a_process_keeps_no_learner_or_partition_for_the_nodes_it_does_not_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    num_nodes = 60
    assert num_nodes > node_data.NODES_KEPT
    LEARNERS_BUILT.clear()
    PARTITIONS_BUILT.clear()

    class CountedLearner(TorchLearner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            LEARNERS_BUILT.append(1)
            super().__init__(*args, **kwargs)

    def counted_materialize(*args: Any) -> ClientData:
        PARTITIONS_BUILT.append(1)
        return client_data.materialize(*args)

    monkeypatch.setattr(node_data, "TorchLearner", CountedLearner)
    monkeypatch.setattr(partition, "materialize", counted_materialize)
    grids: list[BuildCountingGrid] = []

    def grid(*args: Any) -> BuildCountingGrid:
        grids.append(BuildCountingGrid(*args))
        return grids[0]

    with in_process_server():
        summary = loopback_run({"strategy": "fedavg", "num-rounds": 2, "fraction-train": 0.05,
                                "fraction-evaluate": 0.05, "validation-fraction": 0.0},
                               tmp_path, grid_class=grid, num_clients=num_nodes)  # type: ignore[arg-type]
    assert summary["num_clients"] == num_nodes
    handshake = [(learners, parts) for kind, learners, parts in grids[0].built
                 if kind == p.QUERY_IDENTITY]
    # The handshake checks every node's data from the plan and builds nothing for it.
    assert len(handshake) == num_nodes and set(handshake) == {(0, 0)}
    # The run served every node (the last evaluation, the report), yet the process
    # holds the learners and partitions of only the nodes it served last.
    gc.collect()
    live = Counter(type(o) for o in gc.get_objects())
    assert len(LEARNERS_BUILT) >= num_nodes
    assert live[CountedLearner] <= node_data.NODES_KEPT
    assert live[ClientData] <= node_data.NODES_KEPT


@pytest.mark.parametrize("strategy", [
    {"strategy": "fedsoft", "num-clusters": 2},
    {"strategy": "fedem", "num-clusters": 2},
], ids=["fedsoft", "fedem"])
def test_a_learner_built_again_for_every_message_gives_the_same_run(
    strategy: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FedSoft's and FedEM's nodes keep models and mixture weights between rounds:
    # in context.state, not in the learner, so a process that keeps one learner
    # (every message builds its node's again) computes the same run.
    with in_process_server():
        kept = loopback_run(strategy, tmp_path / "kept")
        for name in ("_client_data", "_cached_learner"):
            build = getattr(node_data, name).__wrapped__
            monkeypatch.setattr(node_data, name, lru_cache(maxsize=1)(build))
        rebuilt = loopback_run(strategy, tmp_path / "rebuilt")
    assert node_data._cached_learner.cache_info().misses > 6 * 3
    assert pinned(rebuilt) == pinned(kept)


def test_start_up_logs_its_phases_and_the_scale_benchmark_reads_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from benchmarks.federation_runs import RoundMarks

    with caplog.at_level("INFO", logger="flwr"):
        counted_run({"strategy": "fedavg"}, tmp_path)
    marks = RoundMarks()
    for record in caplog.records:
        marks.note(record.getMessage(), 0.0)
    assert set(marks.startup_phases) == {"nodes_connected_s", "handshake_s"}
    assert all(seconds >= 0.0 for seconds in marks.startup_phases.values())
    assert f"start-up: handshake with {NUM_NODES} nodes took" in caplog.text


def test_flowers_dispatcher_keeps_a_delivered_instruction_and_checks_it_every_tick() -> None:
    """What docs/performance.md's account of start-up rests on, in Flower 1.41's own
    state: a tick delivers each stored instruction once, the instruction stays stored
    after it (until its reply is pulled), and later ticks deliver nothing from it."""
    from benchmarks.flower_dispatcher import dispatcher_state, dispatcher_tick, measure

    state, nodes = dispatcher_state(num_nodes=40, stored=6)
    assert dispatcher_tick(state, nodes)[1] == 6
    assert dispatcher_tick(state, nodes)[1] == 0
    assert len(state.message_ins_store) == 6  # type: ignore[attr-defined]
    row = measure(num_nodes=40, stored=6, ticks=2)
    assert (row["delivered_first_tick"], row["delivered_later_ticks"], row["still_stored"]) \
        == (6, 0, 6)
    assert row["check_us"] > 0
