"""End to end: clients that crash, stall, or send NaN, Inf, wrong shapes or missing keys.

A Flower client mod corrupts about a quarter of the train and evaluate replies,
chosen by a hash of (node key, round, message type) so every run injects the same
faults. Every strategy's run must finish, score every client, and count what it
rejected.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.client.task import node_key
from fl_clusters.client_app import build_client_app
from tests.conftest import Federation

ROUND_TIMEOUT = 20.0
FAULTS = ("crash", "inf-examples", "nan-model", "wrong-shape", "missing-key")


def _fault(context: Context, msg: Message) -> str | None:
    """The fault this node injects into this message, or ``None`` (about 75 %)."""
    config = msg.content.config_records.get(p.CONFIG)
    server_round = int(config.get(p.CFG_ROUND, 0)) if config is not None else 0  # type: ignore[arg-type]
    text = f"{node_key(context)}/{server_round}/{msg.metadata.message_type}"
    draw = zlib.crc32(text.encode()) % 100
    return FAULTS[draw % len(FAULTS)] if draw < 25 else None


def _corrupt(reply: Message, fault: str) -> Message:
    metrics = MetricRecord(dict(reply.content.metric_records[p.METRICS]))
    content = RecordDict({p.METRICS: metrics})
    arrays = reply.content.array_records.get(p.ARRAYS)
    if arrays is not None:
        names = list(arrays.keys())
        values = [a.numpy().copy() for a in arrays.values()]
        if fault == "nan-model":
            values[0].flat[0] = np.nan
        elif fault == "wrong-shape":
            values[-1] = np.zeros(values[-1].size + 1, dtype=values[-1].dtype)
        content[p.ARRAYS] = p.numpy_to_record(names, values)
    if fault == "inf-examples":
        metrics[p.M_NUM_EXAMPLES] = float("inf")
    elif fault == "missing-key" or (fault in ("nan-model", "wrong-shape") and arrays is None):
        for key in (p.M_TRAIN_LOSS, p.M_ACCURACY):
            if key in metrics:
                del metrics[key]
    reply.content = content
    return reply


def fault_mod(stall_node: int | None) -> Callable[..., Message]:
    """A client mod injecting :data:`FAULTS`; ``stall_node`` also stalls once past the timeout."""

    def mod(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
        kind = msg.metadata.message_type
        if kind not in (MessageType.TRAIN, MessageType.EVALUATE):
            return call_next(msg, context)
        config = msg.content.config_records.get(p.CONFIG)
        if (stall_node is not None and node_key(context) == stall_node and config is not None
                and int(config.get(p.CFG_ROUND, 0)) == 2 and kind == MessageType.TRAIN):  # type: ignore[arg-type]
            time.sleep(ROUND_TIMEOUT + 5)  # the server must go on without this reply
        fault = _fault(context, msg)
        if fault == "crash":
            raise RuntimeError("injected crash")
        reply = call_next(msg, context)
        return reply if fault is None or reply.has_error() else _corrupt(reply, fault)

    return mod


STRATEGIES: dict[str, dict[str, Any]] = {
    "ifca": {"strategy": "ifca", "num-clusters": 4},
    "cfl": {"strategy": "cfl"},
    "acfl": {"strategy": "acfl", "acfl-phase1-rounds": 2},
    "fedsoft": {"strategy": "fedsoft", "num-clusters": 2, "cluster-structure": "rotation-mixture",
                "num-groups": 2},
    "fldc": {"strategy": "fldc", "fldc-min-pts": 2},
    "flhc": {"strategy": "flhc", "flhc-warmup-rounds": 1},
    "wecfl": {"strategy": "wecfl", "num-clusters": 4},
    "local": {"strategy": "local"},
    "fedem": {"strategy": "fedem", "num-clusters": 2,
              "cluster-structure": "label-permutation-mixture", "num-groups": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_finishes_through_injected_faults(
    federation: Federation, name: str
) -> None:
    settings = {**STRATEGIES[name], "num-rounds": 4, "round-timeout": ROUND_TIMEOUT,
                "max-failed-rounds": 4}
    stall = 3 if name == "ifca" else None  # one stall is enough to prove the timeout
    app = build_client_app(settings, mods=[fault_mod(stall)])
    summary = federation(settings, num_clients=12, client_app=app)
    assert summary["num_clients"] == 12  # the final report is not corrupted
    assert summary["rejected_replies"] >= 4, summary["rejected_replies"]
    assert np.isfinite(summary["personalized_accuracy"])
    if stall is not None:
        assert summary["unanswered_messages"] >= 1
    # Every cluster model that was written is finite.
    models = np.load(summary["_folder"] / "models.npz")
    assert all(np.all(np.isfinite(models[key])) for key in models.files)


def test_the_injected_faults_are_a_quarter_and_repeat(server_identity: None) -> None:
    ctx = [Context(run_id=1, node_id=n, node_config={"partition-id": n}, state=RecordDict(),
                   run_config={}) for n in range(12)]
    messages = [Message(RecordDict({p.CONFIG: ConfigRecord({p.CFG_ROUND: r})}), dst_node_id=1,
                        message_type=MessageType.TRAIN) for r in range(1, 11)]
    faults = [_fault(c, m) for c in ctx for m in messages]
    share = sum(f is not None for f in faults) / len(faults)
    assert 0.15 <= share <= 0.35, share
    assert faults == [_fault(c, m) for c in ctx for m in messages]
    assert set(faults) == {None, *FAULTS}
