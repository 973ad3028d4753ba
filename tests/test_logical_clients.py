"""Clients that are not nodes: logical clients served by a pool of nodes, in blocks.

The unit checks read the block records and a pool node serving a block; the
federations run the ServerApp on a LoopbackGrid pool (no Ray), and one slow run on
Flower's simulation, with ``num-clients`` logical clients.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_clusters import protocol as p
from fl_clusters.block_messages import BLOCK, Block
from fl_clusters.checkpoint import CHECKPOINT_FILE
from fl_clusters.client.blocks import serve_block
from fl_clusters.client_app import build_client_app
from fl_clusters.client_states import ClientStates
from fl_clusters.config import parse_run_config
from fl_clusters.errors import ConfigurationError
from fl_clusters.fault_injection import FaultInjector, read_fault_log
from fl_clusters.grid import local_cores
from fl_clusters.logical_grid import LogicalClientGrid
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.results import load_models
from fl_clusters.server_app import run_federation
from tests.conftest import NodesOnly

pytestmark = pytest.mark.usefixtures("server_identity")

POOL = 3
COMPARED = ("ari", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "assignment_history")


def block_of(clients: list[int], shared: ArrayRecord) -> Block:
    contents = [RecordDict({p.ARRAYS: shared, p.CONFIG: ConfigRecord({"c": c})})
                for c in clients]
    return Block(clients, contents, [None] * len(clients), num_clients=10)


def test_a_block_carries_a_shared_record_once_and_reads_back() -> None:
    shared = ArrayRecord([np.arange(6.0)])
    block = block_of([4, 7, 9], shared)
    block.states[1] = RecordDict({"kept": MetricRecord({"x": 1.0})})
    records = block.to_records()
    assert len(records.array_records) == 1  # one model for the three clients
    back = Block.from_records(records)
    assert back.clients == [4, 7, 9] and back.num_clients == 10
    assert [c[p.CONFIG]["c"] for c in back.contents] == [4, 7, 9]  # type: ignore[index]
    np.testing.assert_array_equal(back.contents[2][p.ARRAYS].to_numpy_ndarrays()[0], np.arange(6.0))  # type: ignore[index]
    assert back.states[0] is None and back.states[1]["kept"]["x"] == 1.0  # type: ignore[index]


def test_a_malformed_block_is_refused() -> None:
    records = block_of([1, 2], ArrayRecord()).to_records()
    config = records.config_records[BLOCK]
    config["layout"] = json.dumps([[5, "content", "arrays", "block/0"]])
    with pytest.raises(ValueError, match="names no client"):
        Block.from_records(records)
    config["layout"] = json.dumps([[0, "content", "arrays", "block/9"]])
    with pytest.raises(ValueError, match="malformed block"):
        Block.from_records(records)


def test_a_pool_node_serves_each_client_as_its_own_node_and_one_failure_stays_its_own() -> None:
    seen: list[tuple[int, int, int]] = []

    def handler(message: Message, context: Context) -> Message:
        client = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        seen.append((client, int(context.node_config["num-partitions"]),  # type: ignore[arg-type]
                     message.metadata.dst_node_id))
        if client == 7:
            raise RuntimeError("client 7 broke")
        context.state["count"] = MetricRecord({"n": 1 + int(
            context.state.metric_records.get("count", MetricRecord({"n": 0}))["n"])})  # type: ignore[arg-type]
        return Message(RecordDict({p.METRICS: MetricRecord({"me": client})}), reply_to=message)

    block = block_of([4, 7, 9], ArrayRecord())
    block.states[2] = RecordDict({"count": MetricRecord({"n": 5})})
    incoming = Message(block.to_records(), dst_node_id=1000, message_type=p.TRAIN)
    node = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 3},
                   state=RecordDict(), run_config={})
    reply = Block.from_records(serve_block(incoming, node, handler).content)
    assert seen == [(4, 10, 4), (7, 10, 7), (9, 10, 9)]
    assert list(reply.errors) == [1] and "client 7 broke" in reply.errors[1][1]
    assert reply.contents[0][p.METRICS]["me"] == 4 and reply.contents[1] is None  # type: ignore[index]
    assert [s["count"]["n"] if s else None for s in reply.states] == [1, None, 6]  # type: ignore[index]
    assert len(node.state) == 0  # the pool node keeps nothing of its clients


class _AnswersForOthers:
    """A pool grid whose node answers a block for clients it was not sent."""

    def __init__(self) -> None:
        self.pushed: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return [1]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        self.pushed = list(messages)
        return [f"b{i}" for i in range(len(self.pushed))]

    def pull_messages(self, ids: Iterable[str]) -> list[Message]:
        replies = []
        for i, sent in enumerate(self.pushed):
            block = Block.from_records(sent.content)
            forged = Block([c + 1 for c in block.clients], block.contents, block.states)
            reply = Message(forged.to_records(), reply_to=sent)
            reply.metadata.__dict__["_reply_to_message_id"] = f"b{i}"
            replies.append(reply)
        return replies


def test_a_block_reply_naming_other_clients_fails_its_clients_only_as_errors() -> None:
    logical = LogicalClientGrid(_AnswersForOthers(), 10)  # type: ignore[arg-type]
    messages = [Message(RecordDict(), dst_node_id=c, message_type=p.TRAIN) for c in (2, 5)]
    replies = list(logical.send_and_receive(messages, timeout=5))
    assert sorted(r.metadata.src_node_id for r in replies) == [2, 5]
    assert all(r.has_error() and "malformed block reply" in r.error.reason for r in replies)
    assert logical.malformed_blocks == 1


def test_the_grid_keeps_each_clients_state_for_checkpoints() -> None:
    logical = LogicalClientGrid(NodesOnly([]), 4)  # type: ignore[arg-type]
    kept = RecordDict({"local": MetricRecord({"x": 2.0})})
    list(logical.send_and_receive(
        [Message(kept, dst_node_id=3, message_type=p.QUERY_RESTORE)], timeout=1))
    asked = [Message(RecordDict(), dst_node_id=c, message_type=p.QUERY_STATE) for c in (1, 3)]
    states = {r.metadata.src_node_id: r.content for r in logical.send_and_receive(asked)}
    assert len(states[1]) == 0 and states[3]["local"]["x"] == 2.0  # type: ignore[index]
    # No pool node: the clients' replies are errors, not a hang.
    [reply] = logical.send_and_receive([Message(RecordDict(), dst_node_id=2,
                                                message_type=p.TRAIN)], timeout=1)
    assert reply.has_error() and "no pool node" in reply.error.reason


def test_client_states_past_the_memory_budget_go_to_disk_and_come_back() -> None:
    model = ArrayRecord([np.arange(1000.0)])  # 8,000 bytes
    states = ClientStates(memory_bytes=20_000)
    for client in range(5):
        states.put(client, RecordDict({"local": model, "n": MetricRecord({"n": client})}))
    assert len(states) == 5 and states.on_disk == 3 and states.bytes_in_memory <= 20_000
    back = states.get(0)  # the oldest, read back from disk (and another one goes there)
    assert back is not None and back["n"]["n"] == 0  # type: ignore[index]
    np.testing.assert_array_equal(back["local"].to_numpy_ndarrays()[0], np.arange(1000.0))  # type: ignore[union-attr]
    assert states.on_disk == 3 and states.bytes_in_memory <= 20_000
    states.put(1, RecordDict())  # an empty state is no state
    assert 1 not in states and states.get(1) is None and len(states) == 4


class CountingPool(LoopbackGrid):
    """A LoopbackGrid pool that counts the messages pushed to it, per type."""

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: dict) -> None:
        super().__init__(client_app, num_nodes, run_config)
        self.pushes: list[Counter[str]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.pushes.append(Counter(m.metadata.message_type for m in messages))
        return super().push_messages(messages)


def logical_run(tmp_path: Path, **overrides: Any) -> tuple[dict[str, Any], CountingPool]:
    settings = parse_run_config({
        "strategy": "ifca", "num-clusters": 2, "num-clients": 48, "num-rounds": 4,
        "fraction-train": 0.5, "fraction-evaluate": 0.25, "local-steps": 5, "seed": 2,
        "plots": False, "results-dir": str(tmp_path / f"run{len(list(tmp_path.glob('*')))}"),
        **overrides,
    })
    pool = CountingPool(build_client_app(settings), POOL, settings)
    folder = run_federation(pool, settings)
    summary = json.loads((folder / "summary.json").read_text())
    summary["_folder"] = folder
    return summary, pool


def test_logical_clients_recover_their_groups_and_a_round_sends_a_message_per_pool_node(
    tmp_path: Path,
) -> None:
    summary, pool = logical_run(tmp_path)
    assert summary["ari"] == pytest.approx(1.0)
    assert summary["report_asked"] == summary["report_of"] == 48
    assert len(summary["per_client_accuracy"]) == 48
    # 24 train messages a round reach the pool as one block per pool node that
    # computes at once (this machine's cores).
    trains = [c[p.TRAIN] for c in pool.pushes if p.TRAIN in c]
    assert trains == [min(POOL, local_cores())] * 4
    assert all(sum(c.values()) <= POOL for c in pool.pushes)
    # The strategy's bytes are its messages to clients (4 rounds of 24 trained).
    assert summary["bytes_sent"] > 0 and not summary["lost_nodes"]


def test_same_seed_same_logical_run_and_a_sampled_report(tmp_path: Path) -> None:
    first, _ = logical_run(tmp_path, **{"report-clients": 10})
    again, _ = logical_run(tmp_path, **{"report-clients": 10})
    assert first["report_asked"] == 10 and first["report_of"] == 48
    assert len(first["per_client_accuracy"]) == 10
    for field in COMPARED:
        assert first[field] == again[field], field
    models = [load_models(run["_folder"]) for run in (first, again)]
    for key in models[0]:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)


@pytest.mark.parametrize("strategy", [
    {"strategy": "ifca"},
    # Every kept model goes to disk and back.
    {"strategy": "fedsoft", "client-state-memory-mb": 0.0},
], ids=lambda s: s["strategy"])
def test_a_resumed_logical_run_ends_like_the_uninterrupted_one(
    tmp_path: Path, strategy: dict[str, Any]
) -> None:
    """FedSoft's clients keep a model between rounds: the grid keeps it, by client id,
    and the checkpoint carries it."""
    settings = {**strategy, "num-clients": 16, "fraction-train": 0.5, "fraction-evaluate": 0.5}
    stopped, _ = logical_run(tmp_path, **settings, **{"num-rounds": 2, "checkpoint-every": 2})
    assert (stopped["_folder"] / CHECKPOINT_FILE).is_file()
    resumed, _ = logical_run(tmp_path, **settings, **{"resume-from": str(stopped["_folder"])})
    whole, _ = logical_run(tmp_path, **settings)
    assert resumed["resumed_after_round"] == 2
    for field in COMPARED:
        assert resumed[field] == whole[field], field
    models = [load_models(run["_folder"]) for run in (resumed, whole)]
    for key in models[0]:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)


def test_faulty_logical_clients_lose_only_their_own_replies(tmp_path: Path) -> None:
    """30 % of train and evaluate replies fail (raised errors, malformed replies): in a
    block each fault is one client's, the run goes on and ends near the clean one."""
    settings = {"num-clients": 24, "fraction-train": 1.0, "fraction-evaluate": 1.0,
                "num-rounds": 4}
    clean, _ = logical_run(tmp_path, **settings)
    chaos_settings = parse_run_config({
        "strategy": "ifca", "num-clusters": 2, "local-steps": 5, "seed": 2, "plots": False,
        "results-dir": str(tmp_path / "chaos"), **settings})
    log = tmp_path / "faults"
    log.mkdir()
    faults = FaultInjector(rate=0.3, seed=0, log_dir=str(log))
    pool = CountingPool(build_client_app(chaos_settings, mods=[faults]), POOL, chaos_settings)
    folder = run_federation(pool, chaos_settings)
    chaos = json.loads((folder / "summary.json").read_text())
    injected = read_fault_log(log)
    # The injector saw each client's own message (a pool node's would name 3 nodes).
    assert len({fault["node"] for fault in injected}) > 2 * POOL
    assert 0 < chaos["rejected_replies"] <= len(injected)
    assert len(chaos["per_client_accuracy"]) == 24
    assert chaos["ari"] == clean["ari"] == pytest.approx(1.0)
    assert abs(chaos["personalized_accuracy"] - clean["personalized_accuracy"]) <= 0.05


def test_logical_clients_are_refused_outside_a_simulation(tmp_path: Path) -> None:
    settings = parse_run_config({"num-clients": 10, "results-dir": str(tmp_path)})
    with pytest.raises(ConfigurationError, match=r"num-clients.*simulations only"):
        run_federation(NodesOnly([1, 2]), settings)  # type: ignore[arg-type]


@pytest.mark.slow
def test_logical_clients_on_flowers_simulation(federation) -> None:  # type: ignore[no-untyped-def]
    summary = federation({"strategy": "ifca", "num-clusters": 2, "num-clients": 60,
                          "num-rounds": 4, "fraction-train": 0.5, "fraction-evaluate": 0.25,
                          "seed": 1, "min-nodes": 2, "plots": False}, num_clients=POOL)
    assert summary["ari"] == pytest.approx(1.0)
    assert summary["report_of"] == 60 and not summary["lost_nodes"]
