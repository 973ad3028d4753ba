"""Attack clients of a simulation: who attacks, what each kind sends, the refusals, the summary.

The rule that names the attackers is one function of the run config, called by
every node and by the server; each kind changes an attacker's reply as declared
(fl_clusters/attacks.py); an attack never runs outside a simulation; and a run
with attackers records them, and what they did, in summary.json.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_clusters import attacks
from fl_clusters import protocol as p
from fl_clusters.attack_scores import attack_fields, membership
from fl_clusters.attacks import Attack, attacker_partitions, node_role, settings_attackers
from fl_clusters.client.backdoor import TRIGGER_PIXELS, backdoor_success, stamp_trigger
from fl_clusters.client.node_data import learner_for
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.data.groups import client_groups
from fl_clusters.errors import ConfigurationError, FederationProblem
from fl_clusters.grid import MeteredGrid
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.models import model_to_arrays
from fl_clusters.server_app import initial_arrays, run_federation
from fl_clusters.testing import TINY_JOB, in_process_server, loopback_run
from tests.conftest import ROOT

NUM_NODES = 8
# The end-to-end job: 8 digits clients in 2 rotation groups, 2 cluster models.
JOB = {"cluster-structure": "rotation", "num-groups": 2, "num-clusters": 2, "num-rounds": 2}


def settings_of(**keys: Any) -> dict[str, Any]:
    return parse_run_config({**TINY_JOB, "min-nodes": NUM_NODES, **keys})


def context_of(settings: dict[str, Any], partition: int, num: int = NUM_NODES) -> Context:
    return Context(run_id=1, node_id=1000 + partition, state=RecordDict(), run_config=settings,
                   node_config={"partition-id": partition, "num-partitions": num})


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes called outside a grid count as simulated (the unit tests' nodes)."""
    monkeypatch.setattr(attacks, "in_simulation", lambda: True)


@pytest.fixture
def server() -> Iterator[None]:
    with in_process_server():
        yield


# ------------------------------------------------------------------ who attacks
@pytest.mark.parametrize("num", [5, 8, 20, 33])
@pytest.mark.parametrize("share", [0.1, 0.2, 0.25, 0.3, 0.5, 1.0])
def test_exactly_the_rounded_share_attacks(num: int, share: float) -> None:
    chosen = attacker_partitions(seed=3, share=share, num_partitions=num)
    assert len(chosen) == math.floor(share * num + 0.5)
    assert chosen == sorted(set(chosen)) and all(0 <= i < num for i in chosen)


def test_the_rule_is_deterministic_and_follows_the_seed() -> None:
    runs = [attacker_partitions(7, 0.3, 20) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert len({tuple(attacker_partitions(seed, 0.3, 20)) for seed in range(10)}) > 1


@pytest.mark.parametrize("sizes", ["", "0.5,0.3,0.2"])
def test_attack_group_draws_from_that_groups_partitions_only(sizes: str) -> None:
    settings = settings_of(**{"num-groups": 3, "cluster-structure": "rotation",
                              "group-sizes": sizes, "attack": "scale", "attack-share": 0.5,
                              "attack-group": 1})
    groups = client_groups("rotation", 20, 3, None if not sizes else (0.5, 0.3, 0.2))
    members = [i for i, g in enumerate(groups) if g == 1]
    chosen = settings_attackers(settings, 20)
    assert set(chosen) <= set(members)
    assert len(chosen) == math.floor(0.5 * len(members) + 0.5)


def test_every_node_and_the_server_name_the_same_attackers(simulated: None) -> None:
    settings = settings_of(attack="sign-flip", **{"attack-share": 0.25})
    roles = [node_role(context_of(settings, i)) for i in range(NUM_NODES)]
    attacking = [i for i, role in enumerate(roles) if role is not None and role.attack]
    assert attacking == settings_attackers(settings, NUM_NODES)
    assert len(attacking) == 2
    assert node_role(context_of(settings_of(), 0)) is None  # no attack: no role at all


# ------------------------------------------------------------- what each sends
def record(values: list[np.ndarray]) -> ArrayRecord:
    return p.numpy_to_record([f"a{i}" for i in range(len(values))], values)


START = record([np.ones((2, 3), np.float32), np.zeros(4, np.float32), np.array([5], np.int64)])
TRAINED = record([np.full((2, 3), 1.5, np.float32), np.arange(4, dtype=np.float32),
                  np.array([7], np.int64)])
CONFIG = ConfigRecord({p.CFG_ROUND: 3, p.CFG_LR: 0.1, p.CFG_STEPS: 5})


def arrays(rec: ArrayRecord) -> list[np.ndarray]:
    return [a.numpy() for a in rec.values()]


def attack(kind: str, scale: float = 4.0, partition: int = 0) -> Attack:
    return Attack(kind, scale, target=0, seed=11, partition=partition)


def test_sign_flip_negates_and_scales_the_update() -> None:
    got = arrays(attack("sign-flip").poison(START, TRAINED, CONFIG))
    for new, start, trained in zip(got[:2], arrays(START)[:2], arrays(TRAINED)[:2], strict=True):
        np.testing.assert_allclose(new, start - 4.0 * (trained - start))
    assert got[2].tolist() == [7] and got[0].dtype == np.float32  # counters stay as trained
    gradient = arrays(attack("sign-flip").poison(None, TRAINED, CONFIG))
    np.testing.assert_allclose(gradient[1], -4.0 * np.arange(4))


def test_scale_replaces_the_model_with_the_boosted_update() -> None:
    got = arrays(attack("scale").poison(START, TRAINED, CONFIG))
    np.testing.assert_allclose(got[0], 1 + 4.0 * 0.5)
    np.testing.assert_allclose(got[1], 4.0 * np.arange(4))


def test_sybils_of_a_round_send_identical_arrays_whatever_they_trained() -> None:
    other = record([np.full((2, 3), -3.0, np.float32), np.ones(4, np.float32),
                    np.array([9], np.int64)])
    first = attack("sybil", partition=1).poison(START, TRAINED, CONFIG)
    second = attack("sybil", partition=6).poison(START, other, CONFIG)
    for a, b in zip(arrays(first), arrays(second), strict=True):
        assert np.array_equal(a, b)
    update = np.concatenate([(a - s).ravel() for a, s in
                             zip(arrays(first)[:2], arrays(START)[:2], strict=True)])
    assert np.linalg.norm(update) == pytest.approx(4.0 * 0.1 * 5, rel=1e-5)  # scale * lr * tau
    assert arrays(first)[2].tolist() == [5]  # counters: the start's, the same for every sybil
    next_round = ConfigRecord({**CONFIG, p.CFG_ROUND: 4})
    assert not np.array_equal(arrays(attack("sybil").poison(START, TRAINED, next_round))[0],
                              arrays(first)[0])


def test_label_flip_trains_on_mirrored_labels_and_sends_what_it_trained() -> None:
    settings = settings_of()
    learner = learner_for(context_of(settings, 2), settings)
    flipped = attack("label-flip", partition=2).trainer(learner)
    x, y = learner.splits["train"].tensors  # type: ignore[attr-defined]
    fx, fy = flipped.splits["train"].tensors  # type: ignore[attr-defined]
    assert torch.equal(fx, x) and torch.equal(fy, 9 - y)
    assert attack("label-flip").poison(START, TRAINED, CONFIG) is TRAINED
    assert attack("sign-flip").trainer(learner) is learner


def test_backdoor_stamps_half_its_inputs_and_relabels_them_to_the_target() -> None:
    settings = settings_of()
    learner = learner_for(context_of(settings, 3), settings)
    poisoned = Attack("backdoor", 4.0, target=7, seed=11, partition=3).trainer(learner)
    x, y = learner.splits["train"].tensors  # type: ignore[attr-defined]
    px, py = poisoned.splits["train"].tensors  # type: ignore[attr-defined]
    changed = (px != x).flatten(1).any(dim=1) | (py != y)
    patch = px[..., -TRIGGER_PIXELS:, -TRIGGER_PIXELS:]
    stamped = (patch == x.max()).flatten(1).all(dim=1)
    assert int(stamped.sum()) == math.floor(0.5 * len(y) + 0.5)
    assert bool((py[stamped] == 7).all()) and not bool(changed[~stamped].any())
    assert torch.equal(px[~stamped], x[~stamped])
    boosted = arrays(attack("backdoor").poison(START, TRAINED, CONFIG))
    np.testing.assert_allclose(boosted[1], 4.0 * np.arange(4))


def test_backdoor_success_is_the_share_of_non_target_inputs_sent_to_the_target() -> None:
    settings = settings_of()
    learner = learner_for(context_of(settings, 1), settings)
    model = learner.model
    always = model_to_arrays(model)
    last = [name for name in always if name.endswith("bias")][-1]
    bias = always[last].numpy().copy()
    bias[4] = 1e6  # every input is predicted as class 4
    always[last] = Array(bias)
    rate, count = backdoor_success(learner, always, target=4)  # type: ignore[misc]
    _, y = learner.splits["test"].tensors  # type: ignore[attr-defined]
    assert rate == 1.0 and count == int((y != 4).sum())
    assert backdoor_success(learner, always, target=5)[0] == 0.0  # type: ignore[index]
    assert stamp_trigger(torch.zeros(2, 1, 8, 8), 1.0).sum() == 2 * TRIGGER_PIXELS**2


def replies_to_sybils(settings: dict[str, Any]) -> dict[int, ArrayRecord]:
    """Every node's reply model to one train message with the same start model."""
    grid = LoopbackGrid(build_client_app(settings), NUM_NODES, settings)
    start = initial_arrays(settings)
    config = ConfigRecord({p.CFG_ROUND: 1, p.CFG_LR: 0.1, p.CFG_STEPS: 2, p.CFG_BATCH: 8})
    messages = [Message(RecordDict({p.ARRAYS: start, p.CONFIG: config}), dst_node_id=node,
                        message_type=p.TRAIN) for node in grid.contexts]
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return {r.metadata.src_node_id - 1000: r.content.array_records[p.ARRAYS] for r in replies}


def test_the_apps_sybils_reply_the_same_model_and_the_honest_nodes_their_own(
    server: None,
) -> None:
    settings = settings_of(attack="sybil", **{"attack-share": 0.5})
    sybils = settings_attackers(settings, NUM_NODES)
    models = replies_to_sybils(settings)
    first = arrays(models[sybils[0]])
    assert all(all(np.array_equal(a, b) for a, b in zip(first, arrays(models[i]), strict=True))
               for i in sybils)
    honest = [i for i in range(NUM_NODES) if i not in sybils]
    assert not np.array_equal(arrays(models[honest[0]])[0], arrays(models[honest[1]])[0])
    assert not np.array_equal(arrays(models[honest[0]])[0], first[0])


# ------------------------------------------------------------------- refusals
@pytest.mark.parametrize(("keys", "named"), [
    ({"attack": "sign-flip"}, "'attack'='sign-flip' and 'attack-share'=0.0"),
    ({"attack-share": 0.2}, "'attack'='none' and 'attack-share'=0.2"),
    ({"attack": "scale", "attack-share": 0.2, "attack-group": 2, "num-groups": 2},
     "'attack-group'=2 names no group"),
    ({"attack": "backdoor", "attack-share": 0.2, "attack-target": 10}, "'attack-target'=10"),
    ({"attack": "flood", "attack-share": 0.2}, "'attack' must be one of 'none', 'label-flip'"),
])
def test_attack_keys_that_do_not_go_together_are_refused(keys: dict[str, Any],
                                                         named: str) -> None:
    with pytest.raises(ConfigurationError, match="run-config key") as error:
        parse_run_config(keys)
    assert named in str(error.value)


def test_a_node_outside_a_simulation_refuses_an_attack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, attacks.RAY_ACTOR_MODULE, raising=False)
    settings = settings_of(attack="scale", **{"attack-share": 0.5})
    assert not attacks.in_simulation()
    with pytest.raises(FederationProblem, match=r"for simulations only .* set attack='none'"):
        node_role(context_of(settings, 0))
    assert node_role(context_of(settings_of(), 0)) is None  # no attack: nothing to refuse


def test_the_apps_of_a_deployment_do_not_pass_for_a_simulation() -> None:
    # What a deployed ClientApp process imports must not load the module the
    # simulation check looks for, or every deployed node would count as simulated.
    code = ("import sys, fl_clusters.apps, fl_clusters.client_app, fl_clusters.server_app; "
            "from fl_clusters.attacks import RAY_ACTOR_MODULE, in_simulation; "
            "sys.exit(int(RAY_ACTOR_MODULE in sys.modules or in_simulation()))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_deployed_grid_or_deployed_nodes_stop_the_run_before_round_1(
    tmp_path: Path, server: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = settings_of(attack="sign-flip", **{"attack-share": 0.25,
                                                  "results-dir": str(tmp_path)})
    app = build_client_app(settings)
    # A grid that is no simulation's (the ServerApp of a deployment gets Flower's GrpcGrid).
    with pytest.raises(ConfigurationError, match="this ServerApp is deployed"):
        run_federation(MeteredGrid(LoopbackGrid(app, NUM_NODES, settings)), settings)
    # Nodes that are no simulation's: the handshake stops the run.
    monkeypatch.setattr(attacks, "in_simulation", lambda: False)
    with pytest.raises(ConfigurationError, match=r"no node can take part.*this ClientApp is "
                       r"deployed"):
        run_federation(LoopbackGrid(app, NUM_NODES, settings), settings)
    assert not list(tmp_path.iterdir())


# -------------------------------------------------------------------- summary
def test_membership_counts_attackers_and_honest_clients_per_cluster() -> None:
    attacker = np.array([True, True, False, False, False, True])
    assigned = np.array([0, 1, 1, 2, 2, 0])
    found = membership(attacker, assigned)
    assert found["clusters"] == [{"cluster": 0, "attackers": 2, "honest": 0},
                                 {"cluster": 1, "attackers": 1, "honest": 1},
                                 {"cluster": 2, "attackers": 0, "honest": 2}]
    assert found["attackers_isolated"] == pytest.approx(2 / 3)
    assert found["honest_clients_with_attackers"] == pytest.approx(1 / 3)


def test_honest_backdoor_success_is_weighted_by_the_inputs_measured() -> None:
    settings = settings_of(attack="backdoor", **{"attack-share": 0.25})
    bad = settings_attackers(settings, 4)
    rows = [{"partition-id": i, "num-partitions": 4, "assigned": 0, "num-test": 10,
             "attacker": int(i in bad), p.M_BACKDOOR_SUCCESS: [0.1 * (i + 1)],
             "backdoor-inputs": i + 1} for i in range(4)]
    section = attack_fields(settings, rows, [0.5, 0.6, 0.7, 0.8])["attack"]
    honest = [i for i in range(4) if i not in bad]
    expected = np.average([0.1 * (i + 1) for i in honest], weights=[i + 1 for i in honest])
    assert section["honest_backdoor_success"] == pytest.approx(expected)
    assert section["attacker_personalized_accuracy"] == pytest.approx(
        np.mean([0.5 + 0.1 * i for i in bad]))
    assert attack_fields(settings_of(), rows, [0.5] * 4) == {"attack": None}


def test_a_sign_flip_run_records_its_attackers_and_the_honest_accuracy(
    tmp_path: Path, server: None,
) -> None:
    summary = loopback_run({**JOB, "attack": "sign-flip", "attack-share": 0.25},
                           tmp_path, num_clients=NUM_NODES)
    section = summary["attack"]
    settings = settings_of(**JOB, attack="sign-flip", **{"attack-share": 0.25})
    assert section["attackers"] == settings_attackers(settings, NUM_NODES)
    assert len(section["attackers"]) == 2 and section["num_partitions"] == NUM_NODES
    assert (section["kind"], section["share"], section["group"], section["scale"]) == (
        "sign-flip", 0.25, -1, 10.0)
    rows = np.genfromtxt(summary["_folder"] / "assignments.csv", delimiter=",", names=True)
    honest = ~np.isin(rows["partition_id"], section["attackers"])
    # Every client's test split of the tiny job has the same size: a plain mean.
    assert section["honest_personalized_accuracy"] == pytest.approx(
        float(np.mean(rows["personal_accuracy"][honest])), abs=1e-6)
    assert section["honest_backdoor_success"] is None
    counted = section["clusters"]
    assert sum(c["attackers"] for c in counted) == 2
    assert sum(c["honest"] for c in counted) == NUM_NODES - 2
    clean = loopback_run(JOB, tmp_path, num_clients=NUM_NODES)
    assert clean["attack"] is None


def test_a_backdoor_run_scores_the_trigger_on_the_honest_clients(
    tmp_path: Path, server: None,
) -> None:
    summary = loopback_run({**JOB, "strategy": "fedavg", "attack": "backdoor",
                            "attack-share": 0.25, "attack-target": 3}, tmp_path,
                           num_clients=NUM_NODES)
    assert 0.0 <= summary["attack"]["honest_backdoor_success"] <= 1.0
    rounds = (summary["_folder"] / "rounds.jsonl").read_text()
    assert f'"{p.M_BACKDOOR_SUCCESS}"' in rounds  # evaluate replies carry it; FedAvg averages


def test_the_nodes_of_a_ray_simulation_attack(federation: Any) -> None:
    # Flower's Ray actors pass the simulation check: the run gets past the handshake,
    # where a node that took itself for deployed would stop it.
    keys = {**JOB, "num-rounds": 1, "local-steps": 2, "plots": False, "attack": "sybil",
            "attack-share": 0.5}
    summary = federation(keys, num_clients=4)
    assert summary["attack"]["attackers"] == settings_attackers(parse_run_config(keys), 4)
    assert len(summary["attack"]["attackers"]) == 2
