"""CFL's split gate under the user's own optimizer, and the gate lines in the log.

The quickstart-shaped federation is a user's app as Flower's quickstart-pytorch
writes it: 6 clients in two groups whose labels conflict (odd clients name every
digit five further along), the app's own ``train()`` with its own optimizer
(SGD with momentum 0.9, or Adam) and its own number of local epochs, wrapped by
:class:`~fl_clusters.ClusteredClient`. Momentum and Adam make update norms grow
after the first rounds, which kept a gate on the norms of the first rounds
closed for a whole run.
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_clusters import ClusteredClient
from fl_clusters import protocol as p
from fl_clusters.clustering import (
    UpdateHierarchy,
    coherence_split_gate,
    decide_cfl_split,
    update_coherence,
)
from fl_clusters.models import MLP
from fl_clusters.strategies import ACFL, CFL
from tests.conftest import START, Federation, NodesOnly

QUICKSTART_CLIENTS = 6
TESTS = Path(__file__).resolve().parent


def quickstart_net() -> nn.Module:
    """The user's network: the MLP the ServerApp starts digits runs from."""
    return MLP((1, 8, 8), 10)


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_digits(return_X_y=True)
    return torch.tensor(images / 16.0, dtype=torch.float32), torch.tensor(labels)


def quickstart_loaders(partition: int) -> tuple[DataLoader, DataLoader]:
    """This client's (train, test) loaders; odd clients shift every label by 5."""
    images, labels = _digits()
    order = np.random.default_rng(0).permutation(len(labels))
    part = order[partition::QUICKSTART_CLIENTS]
    shifted = (labels[part] + 5 * (partition % 2)) % 10
    cut = int(0.8 * len(part))
    train = TensorDataset(images[part[:cut]], shifted[:cut])
    test = TensorDataset(images[part[cut:]], shifted[cut:])
    generator = torch.Generator().manual_seed(partition)
    return DataLoader(train, batch_size=32, shuffle=True, generator=generator), DataLoader(test)


def quickstart_client_app(optimizer: str, local_epochs: int) -> ClientApp:
    """A user's FedAvg-style ClientApp with its own optimizer, wrapped for clustering."""
    app = ClientApp()

    def loaders(context: Context) -> tuple[DataLoader, DataLoader]:
        return quickstart_loaders(int(context.node_config["partition-id"]))

    def report(context: Context) -> dict[str, int]:  # ground truth, for the summary's ARI
        return {"true-cluster": int(context.node_config["partition-id"]) % 2}

    clustered = ClusteredClient(app, quickstart_net, loaders, metadata_fn=report)

    @app.train()
    @clustered.train
    def train(msg: Message, context: Context) -> Message:
        net = quickstart_net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        trainloader, _ = loaders(context)
        if optimizer == "adam":
            opt: torch.optim.Optimizer = torch.optim.Adam(net.parameters(), lr=0.003)
        else:
            opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        losses = []
        for _ in range(local_epochs):
            for x, y in trainloader:
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                opt.step()
                losses.append(float(loss))
        metrics = MetricRecord({"train_loss": float(np.mean(losses)),
                                "num-examples": len(trainloader.dataset)})
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    @app.evaluate()
    @clustered.evaluate
    def evaluate(msg: Message, context: Context) -> Message:
        net = quickstart_net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        _, testloader = loaders(context)
        with torch.no_grad():
            pairs = [(nn.functional.cross_entropy(net(x), y, reduction="sum"),
                      (net(x).argmax(1) == y).sum()) for x, y in testloader]
        count = len(testloader.dataset)
        metrics = MetricRecord({"eval_loss": float(sum(p[0] for p in pairs)) / count,
                                "eval_acc": float(sum(p[1] for p in pairs)) / count,
                                "num-examples": count})
        return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

    return app


@pytest.fixture
def tests_on_ray_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers unpickle the ClientApp above by importing this module."""
    previous = os.environ.get("PYTHONPATH")
    paths = [str(TESTS), str(TESTS.parent), *filter(None, [previous])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


@pytest.mark.slow
@pytest.mark.parametrize(("optimizer", "local_epochs"), [("momentum", 1), ("momentum", 5),
                                                         ("adam", 1), ("adam", 5)])
def test_cfl_defaults_split_a_quickstart_trained_with_the_users_optimizer(
    optimizer: str, local_epochs: int, federation: Federation, tests_on_ray_path: None
) -> None:
    # Measured: the first split in round 3 (the first after the warm-up) in each
    # case, |mean|/avg norm 0.33-0.61 there; after it each group's own 3 clients
    # move alike or their updates form no groups (silhouette <= 0.18) and stay
    # together.
    summary = federation({"strategy": "cfl", "num-rounds": 5}, num_clients=QUICKSTART_CLIENTS,
                         client_app=quickstart_client_app(optimizer, local_epochs))
    assert summary["split_rounds"] == [3], summary
    assert summary["ari"] == 1.0, summary


# ------------------------------------------------------------ the gate, no Ray
def test_coherence_is_free_of_any_common_scale() -> None:
    rng = np.random.default_rng(0)
    updates = rng.normal(size=(6, 40)) + np.r_[3.0, np.zeros(39)]
    for scale in (1e-3, 1.0, 11.0, 1e3):
        assert update_coherence(updates * scale) == pytest.approx(update_coherence(updates))
    assert update_coherence(np.ones((4, 5))) == pytest.approx(1.0)
    assert update_coherence(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(0.0)
    assert update_coherence(np.zeros((3, 4))) == 0.0


def test_gate_opens_when_norms_grow_as_under_momentum() -> None:
    # The run: largest norm 1.2-1.4 in the first rounds, 2.5-11 after.
    # A gate on the first rounds' norms (mean < 0.8 R) never opened; the same
    # round's coherence does not see the growth.
    reference = 1.4
    for max_norm in (2.5, 6.0, 11.0):
        mean_norm = 0.5 * max_norm  # half the members' moves cancel
        assert mean_norm > 0.8 * reference  # the old gate stayed closed
        assert coherence_split_gate(0.5, max_norm, reference, 0.8, 0.6)
    # Members that still move alike keep it closed, whatever their scale.
    assert not coherence_split_gate(0.93, 11.0, reference, 0.8, 0.6)
    # So do members that all stopped moving.
    assert not coherence_split_gate(0.3, 0.5, reference, 0.8, 0.6)
    with pytest.raises(ValueError, match="mean_ratio"):
        coherence_split_gate(0.5, 1.0, 1.0, 1.5, 0.6)


def _round(
    cfl: CFL, server_round: int, arrays: ArrayRecord, grid: NodesOnly, moves: dict[int, np.ndarray]
) -> ArrayRecord:
    """One CFL round where node n returns the model it was sent plus ``moves[n]``."""
    replies = []
    for request in cfl.configure_train(server_round, arrays, ConfigRecord(), grid):  # type: ignore[arg-type]
        node = request.metadata.dst_node_id
        content = request.content
        start = (content.array_records[p.ARRAYS] if p.ARRAYS in content.array_records
                 else p.unpack_clusters(content.array_records[p.CLUSTERS])[0])
        flat = np.concatenate([start[k].numpy().ravel() for k in start]) + moves[node]
        model = p.numpy_to_record(list(start.keys()), [flat[:12].reshape(3, 4).astype(np.float32),
                                                       flat[12:].astype(np.float32)])
        metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5})
        replies.append(Message(RecordDict({p.ARRAYS: model, p.METRICS: metrics}),
                               reply_to=request))
    packed, _ = cfl.aggregate_train(server_round, replies)
    assert packed is not None
    return packed


def _momentum_like_moves(
    server_round: int, common: float, scales: dict[int, float] | None = None
) -> dict[int, np.ndarray]:
    """Two groups of 3 nodes; every move scaled by the round's ``scales`` (growth by default)."""
    growth = (scales or {1: 1.0, 2: 1.2, 3: 3.0, 4: 6.0, 5: 11.0})[server_round]
    moves = {}
    for node in range(1, 7):
        rng = np.random.default_rng(100 * server_round + node)
        move = np.zeros(15)
        move[0] = common
        move[1 if node <= 3 else 2] = 1.0  # each group's own direction
        moves[node] = growth * (move + rng.normal(scale=0.05, size=15))
    return moves


def test_cfl_splits_two_groups_whose_updates_grow(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    grid = NodesOnly(list(range(1, 7)))
    cfl = CFL(min_available_nodes=6)
    packed = START
    with caplog.at_level(logging.INFO, logger="flwr"):
        for server_round in (1, 2, 3):
            packed = _round(cfl, server_round, packed, grid,
                            _momentum_like_moves(server_round, common=0.3))
    assert cfl.split_rounds == [3]
    assert [e["split"] for e in cfl.summary_fields()["gate_history"]] == [False, False, True]
    groups = [{cfl.assignments[n] for n in (1, 2, 3)}, {cfl.assignments[n] for n in (4, 5, 6)}]
    assert all(len(g) == 1 for g in groups) and groups[0] != groups[1]
    # One line a round says what the gate compared and what it decided.
    lines = [r.getMessage() for r in caplog.records if "CFL round" in r.getMessage()]
    assert len(lines) == 3
    assert "warm-up" in lines[0] and "gate open" in lines[2] and "SPLIT into 3 + 3" in lines[2]


# Adam's steps and those of several local epochs fall after the first rounds.
SHRINKING = {1: 1.0, 2: 0.8, 3: 0.5}


def test_cfl_splits_two_groups_whose_updates_shrink(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    largest = {r: max(np.linalg.norm(m) for m in _momentum_like_moves(r, 0.3, SHRINKING).values())
               for r in SHRINKING}
    # A reference from the first rounds' norms (max_ratio 0.6) closes the gate in
    # round 3 although the groups still pull apart.
    assert largest[3] < 0.6 * max(largest[1], largest[2])
    grid = NodesOnly(list(range(1, 7)))
    history = CFL(min_available_nodes=6, max_ratio=0.6)
    cfl = CFL(min_available_nodes=6)
    packed_history = packed = START
    with caplog.at_level(logging.INFO, logger="flwr"):
        for server_round in SHRINKING:
            moves = _momentum_like_moves(server_round, 0.3, SHRINKING)
            packed_history = _round(history, server_round, packed_history, grid, moves)
            packed = _round(cfl, server_round, packed, grid, moves)
    assert history.split_rounds == []
    assert cfl.split_rounds == [3]
    groups = [{cfl.assignments[n] for n in (1, 2, 3)}, {cfl.assignments[n] for n in (4, 5, 6)}]
    assert all(len(g) == 1 for g in groups) and groups[0] != groups[1]
    last = [r.getMessage() for r in caplog.records if "CFL round 3" in r.getMessage()][-1]
    assert "gate open" in last and "x early" not in last and "SPLIT into 3 + 3" in last


@pytest.mark.parametrize("members", [3, 6, 20])
def test_noise_of_one_group_opens_the_gate_but_does_not_split(members: int) -> None:
    # A converged group: each member's update is its sample noise around a
    # small common step, which cancels in the mean (coherence ~0.4-0.65, below
    # the gate's 0.8) while the norms shrink. The directions hold no groups.
    cfl = CFL()
    rng = np.random.default_rng(members)
    common = rng.normal(size=2000)
    for server_round, scale in ((5, 1e-2), (10, 1e-4)):
        noise = np.stack([scale * (common + rng.normal(scale=2.5, size=2000))
                          for _ in range(members)])
        gate_open, text = cfl._gate(server_round, noise)
        assert gate_open, text
        decision = decide_cfl_split(noise, cfl.eps1, cfl.eps2, cfl.split_threshold,
                                    norms_qualify=gate_open, min_structure=cfl.min_silhouette)
        assert not decision.split and decision.refusal.startswith("group silhouette"), decision
        # Two groups in the same space and at the same scale do split.
        groups = noise + scale * 6.0 * np.r_[np.ones(members // 2),
                                             -np.ones(members - members // 2)][:, None] * common
        decision = decide_cfl_split(groups, cfl.eps1, cfl.eps2, cfl.split_threshold,
                                    norms_qualify=cfl._gate(server_round, groups)[0],
                                    min_structure=cfl.min_silhouette)
        assert decision.split, decision


def test_cfl_keeps_one_cluster_while_growing_updates_agree(
    server_identity: None, caplog: pytest.LogCaptureFixture
) -> None:
    grid = NodesOnly(list(range(1, 7)))
    cfl = CFL(min_available_nodes=6, warmup_rounds=1)
    packed = START
    with caplog.at_level(logging.INFO, logger="flwr"):
        for server_round in (1, 2, 3, 4, 5):
            # A common direction 3x each group's own: the joint objective still descends.
            packed = _round(cfl, server_round, packed, grid,
                            _momentum_like_moves(server_round, common=3.0))
    assert cfl.split_rounds == []
    last = next(r.getMessage() for r in caplog.records if "CFL round 5" in r.getMessage())
    assert "gate closed" in last and "no split: gate closed" in last
    # The summary keeps every cluster-round's stationarity test: false (coherence at
    # least the 0.8 ratio) in every round here.
    history = cfl.summary_fields()["gate_history"]
    assert [entry["round"] for entry in history] == [1, 2, 3, 4, 5]
    assert all(not e["gate_open"] and e["coherence"] >= 0.8 and not e["split"] for e in history)


def test_a_cluster_that_does_not_split_says_which_test_refused() -> None:
    rng = np.random.default_rng(0)
    direction = rng.normal(size=30)
    two_groups = np.stack([direction + 0.1 * rng.normal(size=30) for _ in range(3)]
                          + [-direction + 0.1 * rng.normal(size=30) for _ in range(3)])
    split = decide_cfl_split(two_groups, 0.0, 0.0, 0.45, norms_qualify=True, min_structure=0.4)
    assert split.split and split.refusal == ""
    closed = decide_cfl_split(two_groups, 0.0, 0.0, 0.45, norms_qualify=False, min_structure=0.4)
    assert closed.refusal == "gate closed"
    # The silhouette is not computed once another test refused: the log says which.
    assert np.isnan(closed.structure_score)
    pair = decide_cfl_split(two_groups[[0, 3]], 0.0, 0.0, 0.45, norms_qualify=True)
    assert pair.refusal == "2 trained members, a split needs 3"
    alike = decide_cfl_split(np.abs(two_groups), 0.0, 0.0, 0.45, norms_qualify=True)
    assert alike.refusal.startswith("cross similarity") and ">= 0.45" in alike.refusal
    noise = rng.normal(size=(8, 30))
    loose = decide_cfl_split(noise, 0.0, 0.0, 1.0, norms_qualify=True, min_structure=0.9)
    assert loose.refusal.startswith("group silhouette") and "< 0.9" in loose.refusal


def test_fl_hc_says_why_it_cut_where_it_did() -> None:
    rng = np.random.default_rng(0)
    one = rng.normal(size=(20, 200))  # one distribution: merge heights close together
    assert UpdateHierarchy().fit(one).describe_cut().endswith("< min gap 1.6: no cut, one cluster")
    groups = np.r_[one[:10] * 0.01 + 5.0, one[10:] * 0.01 - 5.0]
    text = UpdateHierarchy().fit(groups).describe_cut()
    assert ">= min gap 1.6: cut at" in text


def test_acfl_phase_1_gate_says_what_it_compared() -> None:
    acfl = ACFL(converge_window=2, converge_tolerance=0.1)
    acfl._phase1_norms = [0.4, 0.45]
    assert "2 of the 4 rounds of norms the test compares" in acfl._phase1_gate(0.45, 0.6)[1]
    acfl._phase1_norms = [0.4, 0.45, 0.43, 0.41]
    converged, text = acfl._phase1_gate(0.41, 0.6)
    assert converged
    assert "last 2 rounds 0.42 against 0.425 before: change 1.2% <= 10%" in text
    absolute = ACFL(gate="absolute", mean_norm_max=0.4, max_norm_min=0.0)
    assert absolute._phase1_gate(0.45, 0.6) == (
        False, "mean update norm 0.45 >= 0.4, max 0.6 > 0")
