"""End to end: clients that crash, stall, or send NaN, Inf, wrong shapes or missing keys.

A Flower client mod (:class:`fl_clusters.fault_injection.FaultInjector`) corrupts about a
quarter of the train and evaluate replies, chosen by a hash of (node key, round,
message type) so every run injects the same faults. Every strategy's run must
finish, score every client, and count what it rejected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from fl_clusters import protocol as p
from fl_clusters.client.task import node_key
from fl_clusters.client_app import build_client_app
from fl_clusters.fault_injection import REPLY_FAULTS, FaultInjector
from tests.conftest import Federation

ROUND_TIMEOUT = 20.0
# A quarter of the replies fail, at equal odds among a crash and the malformed replies.
FAULTS = FaultInjector(rate=0.25)


def stall_once(node: int) -> Callable[..., Message]:
    """A client mod: node ``node`` stalls past the timeout in round 2's training."""

    def mod(msg: Message, context: Context, call_next: Callable[..., Message]) -> Message:
        config = msg.content.config_records.get(p.CONFIG)
        if (node_key(context) == node and msg.metadata.message_type == MessageType.TRAIN
                and config is not None and int(config.get(p.CFG_ROUND, 0)) == 2):  # type: ignore[arg-type]
            time.sleep(ROUND_TIMEOUT + 5)  # the server must go on without this reply
        return call_next(msg, context)

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
    mods = [FAULTS] if stall is None else [stall_once(stall), FAULTS]
    app = build_client_app(settings, mods=mods)
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
    faults = [FAULTS.fault(c, m) for c in ctx for m in messages]
    share = sum(f is not None for f in faults) / len(faults)
    assert 0.15 <= share <= 0.35, share
    assert faults == [FAULTS.fault(c, m) for c in ctx for m in messages]
    assert set(faults) == {None, *REPLY_FAULTS}
