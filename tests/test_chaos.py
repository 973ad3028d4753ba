"""Chaos: replies that fail at random and a server killed mid-run change little.

A unit check of the fault draw, and one end-to-end run at test scale of what
benchmarks/chaos.py measures: 20 clients, 30 % of the train and evaluate replies
fail (a raised exception, a stall past the round timeout, four malformed
replies), the simulation process is killed with SIGKILL after round 5 and
resumed from its round-4 checkpoint.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fl_clusters.chaos import run_chaos
from fl_clusters.fault_injection import FAULTS, REPLY_FAULTS, STALL, FaultInjector, draw_fault

NUM_CLIENTS = 20
ROUND_TIMEOUT = 40.0  # a busy machine's cold start must not be taken for a fault
# 8 rounds: by then the clean run's accuracy has settled (after 4 rounds it still
# rises a point a round, and the chaotic run, which loses 30 % of its updates, was
# 1.9 points behind).
SETTINGS = {"seed": 0, "num-rounds": 8, "checkpoint-every": 4, "round-timeout": ROUND_TIMEOUT,
            "min-nodes": NUM_CLIENTS, "plots": False}
# Fault seed 37 stalls a client in one phase of these 8 rounds (round 2's evaluation,
# before the checkpoint): every phase with a stall waits the whole round timeout.
FAULT_SEED = 37


def test_the_draw_has_the_asked_shares_and_repeats() -> None:
    messages = [(key, server_round, kind) for key in range(40) for server_round in range(1, 26)
                for kind in ("train", "evaluate")]
    drawn = [draw_fault(*m, rate=0.3, seed=0, stall_rate=0.02) for m in messages]
    counts = Counter(drawn)
    assert 0.25 <= 1 - counts[None] / len(drawn) <= 0.35, counts
    assert 0.01 <= counts[STALL] / len(drawn) <= 0.03, counts
    assert set(counts) == {None, *FAULTS}
    others = [counts[kind] for kind in REPLY_FAULTS]
    assert max(others) <= 1.5 * min(others), counts
    assert drawn == [draw_fault(*m, rate=0.3, seed=0, stall_rate=0.02) for m in messages]
    assert drawn != [draw_fault(*m, rate=0.3, seed=1, stall_rate=0.02) for m in messages]


@pytest.mark.parametrize(("arguments", "message"), [
    ({"rate": 0.305}, "rate=0.305 is not a whole percent"),
    ({"rate": 0.1, "stall_rate": 0.2, "stall_s": 1.0}, "stall_rate=0.2 exceeds rate=0.1"),
    ({"rate": 0.1, "stall_rate": 0.1}, "needs stall_s > 0"),
    ({"rate": 0.1, "kinds": ("crash", "explode")}, "must be a non-empty subset"),
])
def test_a_fault_injector_that_cannot_work_is_refused(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultInjector(**arguments)


@pytest.mark.slow
def test_a_run_with_failing_replies_killed_and_resumed_ends_like_the_clean_run(
    tmp_path: Path, no_ray_in_this_process: None
) -> None:
    faults = FaultInjector(rate=0.3, seed=FAULT_SEED, stall_rate=0.01,
                           stall_s=ROUND_TIMEOUT + 5)
    result = run_chaos(SETTINGS, NUM_CLIENTS, faults, kill_after_round=5, folder=tmp_path,
                       client_cpus=1.0)
    clean, chaos = result["clean"], result["chaos"]
    # Killed mid-run, after round 5; resumed from round 4's checkpoint, so round 5 ran twice.
    assert chaos["last_round_before_kill"] == 5
    assert chaos["resumed_after_round"] == 4
    assert sum(chaos["faults_lost"].values()) >= 1  # the lost round 5 had faults too
    for run in (clean, chaos):
        assert run["rounds_recorded"] == 8
        assert run["num_clients"] == NUM_CLIENTS and run["unreported_nodes"] == 0
        assert run["models_saved"] == run["num_cluster_models"] == 4
        assert run["models_finite"]
    # Every kind was injected in the rounds the result is made of; what arrived was
    # rejected (a faulty reply that came after the timeout counts as unanswered).
    injected = chaos["faults_injected"]
    assert all(injected[kind] >= 1 for kind in FAULTS), injected
    assert clean["rejected_replies"] == 0
    assert 0 < chaos["rejected_replies"] <= sum(injected[kind] for kind in REPLY_FAULTS)
    assert chaos["unanswered_messages"] >= injected[STALL]
    assert abs(chaos["personalized_accuracy"] - clean["personalized_accuracy"]) <= 0.01
