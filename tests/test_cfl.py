"""CFL: split rules through the strategy's glue (no Ray), then real Flower simulations.

Every rotation group holds its own rotated copy of the digits (``copy-per-group``, as
IFCA's rotated MNIST does with MNIST): 20 clients of ~250 train samples each, where
sharing one copy leaves ~63.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    decide_cfl_split,
)
from fl_clusters.config import parse_run_config
from fl_clusters.strategies import ACFL, CFL
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import START, NodesOnly, SilentNodes
from tests.conftest import train_reply as _reply
from tests.conftest import two_layer_model as _model

ROTATION = {
    "cluster-structure": "rotation", "num-clusters": 4, "num-rounds": 10, "copy-per-group": True
}


ONE_DISTRIBUTION = {"cluster-structure": "none", "num-rounds": 15}


NUM_CLIENTS = 20


def test_cfl_and_acfl_recover_rotations_and_beat_fedavg(federation) -> None:
    cfl = federation({**ROTATION, "strategy": "cfl"})
    # The absolute phase-1 gate: this test is about the incentive clustering, which
    # the relative gate would start only after the norms level off (round 5 or later).
    acfl = federation({**ROTATION, "strategy": "acfl", "acfl-gate": "absolute",
                       "acfl-phase1-rounds": 9})
    fedavg = federation({**ROTATION, "strategy": "fedavg"})

    assert cfl["num_clusters_found"] == 4, cfl
    assert cfl["ari"] >= 0.95, cfl
    # Recursive: the first split makes two clusters, later splits the other two.
    assert len(cfl["split_rounds"]) == 3
    assert min(cfl["split_rounds"]) > parse_run_config({})["cfl-warmup-rounds"]
    rounds = [
        json.loads(line) for line in (cfl["_folder"] / "rounds.jsonl").read_text().splitlines()
    ]
    assert rounds[0]["train"]["num-clusters"] == 1
    assert rounds[-1]["train"]["num-clusters"] == 4

    # The similarity order keeps the trials far below trying every client in every cluster.
    assert 0 < acfl["trial_evaluations"] < NUM_CLIENTS * 4, acfl  # 22 measured
    # Trials reuse the local-only models: one training per node for all of phase 2
    # (before, every trial retrained each member: ~2 x 22 trainings here).
    assert acfl["trial_train_messages"] == NUM_CLIENTS, acfl
    # Phase 1 ends by the norm test after one FedAvg round (mean update norm < 0.4).
    assert acfl["clustering_round"] == 2
    # Measured ARI 1.0 at seeds 0, 1, 2: right candidates score -0.03 to +0.08, wrong
    # ones -0.43 to -0.92 against beta = -0.17.
    assert acfl["num_clusters_found"] == 4, acfl
    assert acfl["ari"] >= 0.95, acfl

    for clustered in (cfl, acfl):
        assert clustered["personalized_accuracy"] >= fedavg["personalized_accuracy"] + 0.1, (
            clustered["strategy"],
            clustered["personalized_accuracy"],
            fedavg["personalized_accuracy"],
        )


@pytest.mark.slow
def test_cfl_keeps_one_distribution_in_one_cluster(federation) -> None:
    cfl = federation({**ONE_DISTRIBUTION, "strategy": "cfl"})
    assert cfl["num_clusters_found"] == 1, cfl
    assert cfl["split_rounds"] == []


def test_run_config_builds_cfl_and_acfl_with_their_keys() -> None:
    settings = parse_run_config(
        {"strategy": "cfl", "cfl-eps1": 0.3, "cfl-eps2": 0.7, "cfl-split-threshold": 0.2,
         "cfl-min-silhouette": -1.0}
    )
    cfl = build_strategy({**settings, "min-nodes": 4})
    assert isinstance(cfl, CFL)
    assert (cfl.eps1, cfl.eps2, cfl.split_threshold, cfl.min_silhouette) == (0.3, 0.7, 0.2, -1.0)
    settings = parse_run_config({"strategy": "acfl", "acfl-beta": -0.5, "acfl-max-rejections": 2,
                                 "acfl-incentive-threshold": "noise", "acfl-noise-z": 2.0})
    acfl = build_strategy({**settings, "min-nodes": 4})
    assert isinstance(acfl, ACFL)
    assert (acfl.beta, acfl.max_rejections) == (-0.5, 2)
    assert (acfl.incentive_threshold, acfl.noise_z) == ("noise", 2.0)
    with pytest.raises(ValueError, match="acfl-incentive-threshold"):
        parse_run_config({"strategy": "acfl", "acfl-incentive-threshold": "loose"})
    with pytest.raises(ValueError, match="incentive_threshold must be one of 'beta', 'noise'"):
        ACFL(incentive_threshold="loose")
    assert acfl.summary_fields() == {
        "trial_evaluations": 0, "trial_messages": 0, "trial_train_messages": 0,
        "trial_failed_members": 0, "phase1_ended": False, "clustering_round": None,
        "num_clusters_found": 1, "placed_nodes": {}, "inner_aggregation": "mean",
        "inner_fallbacks": [],
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CFL(eps1=-0.1), "eps1"),
        (lambda: CFL(split_threshold=1.5), "split_threshold"),
        (lambda: CFL(min_silhouette=-2.0), "min_silhouette"),
        (lambda: CFL(warmup_rounds=-1), "warmup_rounds"),
        (lambda: ACFL(max_rejections=0), "max_rejections"),
        (lambda: ACFL(beta=float("nan")), "beta"),
        (lambda: ACFL(trial_epochs=0), "trial_epochs"),
        (lambda: ACFL(mean_norm_max=-1.0), "mean_norm_max"),
    ],
)
def test_bad_parameters_are_named(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


# ------------------------------------------------------------- CFL glue, no Ray
def _cfl_round(
    cfl: CFL, server_round: int, arrays: ArrayRecord, grid: NodesOnly, update: dict[int, float]
) -> tuple[list[Message], ArrayRecord]:
    """One CFL round where node n returns its start model plus ``update[n]`` along a direction.

    Nodes missing from ``update`` do not answer. Each update carries a little node-specific
    noise, so updates of one sign are similar but not identical.
    """
    requests = list(cfl.configure_train(server_round, arrays, ConfigRecord(), grid))  # type: ignore[arg-type]
    replies = []
    for request in requests:
        node = request.metadata.dst_node_id
        if node not in update:
            continue
        content = request.content
        start = (
            content.array_records[p.ARRAYS]
            if p.ARRAYS in content.array_records
            else p.unpack_clusters(content.array_records[p.CLUSTERS])[0]
        )
        noise = np.random.default_rng(node).normal(scale=0.05, size=15)
        direction = np.r_[1.0, np.zeros(14)] * update[node] + noise
        flat = np.concatenate([start[k].numpy().ravel() for k in start]) + direction
        trained = [flat[:12].reshape(3, 4), flat[12:]]
        model = p.numpy_to_record(list(start.keys()), [a.astype(np.float32) for a in trained])
        metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5, p.M_CLUSTER: 0})
        replies.append(Message(RecordDict({p.ARRAYS: model, p.METRICS: metrics}), reply_to=request))
    packed, _ = cfl.aggregate_train(server_round, replies)
    return requests, packed


def test_cfl_splits_opposed_updates_only_after_warmup(server_identity) -> None:
    nodes = list(range(1, 9))
    grid = NodesOnly(nodes)
    cfl = CFL(eps1=0.4, eps2=0.45, split_threshold=0.45, warmup_rounds=1, min_available_nodes=8)
    opposed = {n: 0.6 if n <= 4 else -0.6 for n in nodes}
    _, packed = _cfl_round(cfl, 1, START, grid, opposed)
    assert p.num_packed_clusters(packed) == 1 and cfl.split_rounds == []  # warm-up
    _, packed = _cfl_round(cfl, 2, packed, grid, opposed)
    assert cfl.split_rounds == [2]
    assert p.num_packed_clusters(packed) == 2
    assert {cfl.assignments[n] for n in (1, 2, 3, 4)} != {cfl.assignments[n] for n in (5, 6, 7)}
    assert len({cfl.assignments[n] for n in (1, 2, 3, 4)}) == 1
    # Each node now trains its own cluster's model, told which one it is (each
    # part's members move alike, so neither splits again).
    requests, _ = _cfl_round(cfl, 3, packed, grid, opposed)
    for request in requests:
        node = request.metadata.dst_node_id
        assert p.ARRAYS in request.content.array_records
        assert request.content.config_records[p.CONFIG][p.CFG_ASSIGNED] == cfl.assignments[node]


def test_cfl_keeps_one_cluster_for_aligned_updates(server_identity) -> None:
    nodes = list(range(1, 9))
    grid = NodesOnly(nodes)
    cfl = CFL(gate="absolute", eps1=10.0, eps2=0.0, split_threshold=0.45, warmup_rounds=0,
              min_available_nodes=8)
    packed = START
    for server_round in (1, 2, 3):
        _, packed = _cfl_round(cfl, server_round, packed, grid, dict.fromkeys(nodes, 0.6))
    # The norms qualify every round; only the high cross similarity blocks the split.
    assert cfl.split_rounds == []
    assert cfl.summary_fields()["num_clusters_found"] == 1


def test_cfl_releases_a_member_that_missed_its_clusters_split(server_identity) -> None:
    nodes = list(range(1, 9))
    grid = NodesOnly(nodes)
    cfl = CFL(eps1=0.4, eps2=0.45, split_threshold=0.45, warmup_rounds=0, min_available_nodes=8)
    _, packed = _cfl_round(cfl, 1, START, grid, dict.fromkeys(nodes, 0.1))
    opposed = {n: 0.6 if n <= 4 else -0.6 for n in nodes if n != 8}
    _, packed = _cfl_round(cfl, 2, packed, grid, opposed)
    assert cfl.split_rounds == [2]
    assert cfl.assignment_for(8) is None  # its update was unknown: not split arbitrarily
    # Round 3: node 8 has no cluster, so CFL tries to place it down the split tree
    # (tests/test_late_joiners.py); here it does not answer that training, so it
    # chooses among all clusters by loss.
    silent = SilentNodes(nodes)
    requests, _ = _cfl_round(cfl, 3, packed, silent, {})
    assert silent.placements == [8]
    by_node = {r.metadata.dst_node_id: r.content for r in requests}
    assert p.CLUSTERS in by_node[8].array_records
    assert p.ARRAYS in by_node[1].array_records


@pytest.mark.usefixtures("server_identity")
def test_cfl_never_splits_a_cluster_of_two() -> None:
    rng = np.random.default_rng(0)
    direction = rng.normal(size=50)
    two = np.stack([direction, -direction])
    decision = decide_cfl_split(two, eps1=10.0, eps2=0.0, gamma_max=0.5)
    assert not decision.split  # the pair is opposed (cross similarity -1), still no split
    three = np.stack([direction, -direction, -direction + 0.01 * rng.normal(size=50)])
    assert decide_cfl_split(three, eps1=10.0, eps2=0.0, gamma_max=0.5).split


@pytest.mark.usefixtures("server_identity")
def test_cfl_relative_gate_splits_where_absolute_norms_never_qualify() -> None:
    """Updates 100x smaller than the digits MLP's (a user's model): eps2 0.45 never fires.

    Round 1 (aligned updates of norm ~0.004) sets the reference; in round 2 the
    members pull apart (norm ~0.006 > 0.6 x 0.004) while their mean cancels.
    """
    nodes = list(range(1, 9))
    for gate, expected in (("absolute", []), ("relative", [2])):
        cfl = CFL(gate=gate, warmup_rounds=0, min_available_nodes=8)
        packed = p.pack_clusters([_model(0.0, 0.0)])
        for server_round, opposed in ((1, False), (2, True)):
            requests = list(cfl.configure_train(server_round, packed, ConfigRecord(),
                                                NodesOnly(nodes)))  # type: ignore[arg-type]
            replies = []
            for r in requests:
                node = r.metadata.dst_node_id
                sign = -1.0 if opposed and node > 4 else 1.0
                noise = np.random.default_rng(node).normal(scale=0.0005, size=4)
                size = 0.006 if opposed else 0.004
                head = size * sign * np.array([1.0, 0.0, 0.0, 0.0]) + noise
                replies.append(_reply(r, _model(0.0, head), 10, None))
            packed, _ = cfl.aggregate_train(server_round, replies)
            assert packed is not None
        assert cfl.split_rounds == expected, gate
