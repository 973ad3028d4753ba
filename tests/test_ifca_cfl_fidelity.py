"""IFCA and CFL against their papers (issues 13 and 16), through the strategies' glue, no Ray.

Every test drives ``configure_train``/``aggregate_train`` with hand-made replies, so
each checks one rule exactly; each failed on the code before the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    coherence_split_gate,
    decide_cfl_split,
    has_converged,
    output_layer_profiles,
    unit_rows,
    update_coherence,
    widest_group,
)
from fl_clusters.config import parse_group_sizes
from fl_clusters.strategies import ACFL, CFL, IFCA

NAMES = ["body.weight", "head.weight"]


@pytest.fixture(autouse=True)
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run identity Flower gives a ServerApp process; Message() needs it."""
    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


class NodesOnly:
    """Just enough of a Grid for configure_train: a fixed list of nodes."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


def _model(body: float, head: np.ndarray | float) -> ArrayRecord:
    return p.numpy_to_record(
        NAMES,
        [np.full((2, 3), body, np.float32), np.broadcast_to(head, (4,)).astype(np.float32)],
    )


def _reply(request: Message, arrays: ArrayRecord, examples: int, cluster: int | None) -> Message:
    metrics = MetricRecord({p.M_NUM_EXAMPLES: examples, p.M_TRAIN_LOSS: 0.5})
    if cluster is not None:
        metrics[p.M_CLUSTER] = cluster
    return Message(RecordDict({p.ARRAYS: arrays, p.METRICS: metrics}), reply_to=request)


# ------------------------------------------------------------------ IFCA option I
def _gradient_round(ifca: IFCA, packed: ArrayRecord, chosen: dict[int, int],
                    examples: dict[int, int]) -> list[ArrayRecord]:
    """One gradient round: node n picks ``chosen[n]`` and returns a gradient of all ones."""
    requests = list(ifca.configure_train(1, packed, ConfigRecord({p.CFG_LR: 0.01}),
                                         NodesOnly(list(chosen))))  # type: ignore[arg-type]
    replies = [
        _reply(r, _model(1.0, 1.0), examples[r.metadata.dst_node_id],
               chosen[r.metadata.dst_node_id])
        for r in requests
    ]
    new, _ = ifca.aggregate_train(1, replies)
    assert new is not None
    return p.unpack_clusters(new)


def test_ifca_gradient_mode_steps_with_its_own_gamma_not_the_client_lr() -> None:
    ifca = IFCA(2, mode="gradient", server_lr=0.5, init="random", min_available_nodes=2)
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 0.0)])
    models = _gradient_round(ifca, packed, {1: 0, 2: 0}, {1: 10, 2: 10})
    # theta - gamma * mean gradient = 0 - 0.5 * 1; the client lr 0.01 would give -0.01.
    np.testing.assert_allclose(models[0]["head.weight"].numpy(), -0.5)
    np.testing.assert_allclose(models[1]["head.weight"].numpy(), 0.0)  # nobody chose it


def test_ifca_paper_gradient_update_divides_the_cluster_sum_by_all_clients() -> None:
    ifca = IFCA(2, mode="gradient", server_lr=0.6, aggregation="paper", init="random")
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 0.0)])
    models = _gradient_round(ifca, packed, {1: 0, 2: 1, 3: 1}, {1: 10, 2: 10, 3: 10})
    # theta_j - gamma / m * sum over S_j, m = 3 answering clients.
    np.testing.assert_allclose(models[0]["head.weight"].numpy(), -0.6 * 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(models[1]["head.weight"].numpy(), -0.6 * 2 / 3, rtol=1e-6)


def test_ifca_paper_model_averaging_ignores_example_counts() -> None:
    for aggregation, expected in (("weighted", (1 * 1 + 3 * 3) / 4), ("paper", 2.0)):
        ifca = IFCA(1, aggregation=aggregation, init="random")
        requests = list(ifca.configure_train(
            1, p.pack_clusters([_model(0.0, 0.0)]), ConfigRecord(), NodesOnly([1, 2]),  # type: ignore[arg-type]
        ))
        replies = [_reply(r, _model(v, v), v, 0) for r, v in zip(requests, (1, 3), strict=True)]
        new, _ = ifca.aggregate_train(1, replies)
        assert new is not None
        np.testing.assert_allclose(p.unpack_clusters(new)[0]["head.weight"].numpy(), expected)


# ----------------------------------------------------------- IFCA initialization
def test_ifca_keeps_the_users_pretrained_body_and_draws_only_heads() -> None:
    pretrained = _model(7.0, np.arange(4.0))
    ifca = IFCA(3, head_layers=1, init="random")
    models = p.unpack_clusters(ifca.initialize(pretrained))
    for model in models:
        np.testing.assert_array_equal(model["body.weight"].numpy(), 7.0)
    heads = [m["head.weight"].numpy() for m in models]
    assert not np.allclose(heads[0], heads[1]) and not np.allclose(heads[1], heads[2])


class RestartGrid(NodesOnly):
    """Answers IFCA's restart query like a client whose losses are given per restart."""

    def __init__(self, nodes: list[int], losses: dict[int, list[float]]) -> None:
        super().__init__(nodes)
        self.losses = losses
        self.sent: list[Message] = []

    def send_and_receive(self, messages, *, timeout=None):  # type: ignore[no-untyped-def]
        self.sent += list(messages)
        return [
            Message(RecordDict({p.METRICS: MetricRecord({
                p.M_CLUSTER_LOSSES: self.losses[m.metadata.dst_node_id], p.M_NUM_EXAMPLES: 5,
            })}), reply_to=m)
            for m in self.sent
        ]


def test_ifca_restarts_are_scored_in_one_query_that_carries_one_model() -> None:
    # Issue 18: candidates travel as seeds; each node draws them itself.
    ifca = IFCA(2, head_layers=1, init="random", restarts=3, min_available_nodes=4, seed=5)
    start = _model(7.0, np.arange(4.0))
    # Rows: restart 0 puts every node in cluster 0, restart 1 splits them 2/2,
    # restart 2 splits 3/1: restart 1 is the most balanced.
    losses = {n: [0.1, 0.9, *((0.1, 0.9) if n < 3 else (0.9, 0.1)), 0.1 if n < 4 else 0.9,
                  0.9 if n < 4 else 0.1] for n in (1, 2, 3, 4)}
    grid = RestartGrid([1, 2, 3, 4], losses)
    chosen = ifca.initialize(start, grid)  # type: ignore[arg-type]
    assert len(grid.sent) == 4  # one message per node, not one per restart
    for message in grid.sent:
        assert list(message.content.array_records) == [p.ARRAYS]  # one model only
        config = message.content.config_records[p.CONFIG]
        assert list(config[p.CFG_RESTART_SEEDS]) == [5, 6, 7]  # type: ignore[arg-type]
        assert config[p.CFG_NUM_CLUSTERS] == 2 and config[p.CFG_HEAD_LAYERS] == 1
    expected = p.draw_clusters(start, 2, 1, 6)
    for key in expected:
        np.testing.assert_array_equal(chosen[key].numpy(), expected[key].numpy())


def test_a_client_scores_the_candidates_the_server_draws() -> None:
    import torch
    from torch.utils.data import TensorDataset

    from fl_clusters.client_app import _cluster_losses
    from fl_clusters.learner import TorchLearner
    from fl_clusters.models import build_model, model_to_arrays

    torch.manual_seed(0)
    x, y = torch.randn(12, 1, 8, 8), torch.randint(0, 10, (12,))
    learner = TorchLearner(build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y),
                           TensorDataset(x, y))
    start = model_to_arrays(build_model("mlp", (1, 8, 8), 10, seed=1))
    config = ConfigRecord({p.CFG_RESTART_SEEDS: [3, 4], p.CFG_NUM_CLUSTERS: 2,
                           p.CFG_HEAD_LAYERS: 0})
    query = Message(RecordDict({p.ARRAYS: start, p.CONFIG: config}), dst_node_id=1,
                    message_type=p.QUERY_CLUSTER_LOSSES)
    reply = _cluster_losses(learner, query)
    losses = list(reply.content.metric_records[p.METRICS][p.M_CLUSTER_LOSSES])  # type: ignore[arg-type]
    expected = [
        float(learner.per_sample_losses(model, "train").mean())
        for seed in (3, 4) for model in p.unpack_clusters(p.draw_clusters(start, 2, 0, seed))
    ]
    assert losses == pytest.approx(expected) and len(set(losses)) == 4


def _two_layer(body: float, head: np.ndarray) -> ArrayRecord:
    return p.numpy_to_record(
        NAMES, [np.full((2, 3), body, np.float32), np.asarray(head, np.float32)]
    )


def test_ifca_local_kmeans_start_groups_the_first_local_updates() -> None:
    ifca = IFCA(2, head_layers=1, init_steps=7, min_available_nodes=6)
    start = _two_layer(0.0, np.zeros((2, 2)))
    requests = list(ifca.configure_train(1, start, ConfigRecord(), NodesOnly(list(range(1, 7)))))  # type: ignore[arg-type]
    # One model goes out per node (issue 18: not k models times restarts).
    assert all(p.ARRAYS in r.content.array_records for r in requests)
    assert all(p.CLUSTERS not in r.content.array_records for r in requests)
    assert all(r.content.config_records[p.CONFIG][p.CFG_STEPS] == 7 for r in requests)
    # Two label permutations: nodes 1-3 map feature i to label i, nodes 4-6 swap them;
    # the update sizes differ (label frequencies) and must not matter.
    identity, swapped = np.eye(2), np.eye(2)[::-1]
    scale = {1: 1.0, 2: 3.0, 3: 0.5, 4: 1.0, 5: 0.3, 6: 2.0}
    replies = [
        _reply(r, _two_layer(0.5, scale[n] * (identity if n <= 3 else swapped)), 10, None)
        for r in requests
        for n in [r.metadata.dst_node_id]
    ]
    packed, metrics = ifca.aggregate_train(1, replies)
    assert packed is not None and metrics is not None
    assert sorted(metrics["cluster-sizes"]) == [3, 3]  # type: ignore[arg-type]
    groups = ifca.summary_fields()["init_groups"]
    assert len({groups[str(n)] for n in (1, 2, 3)}) == 1
    assert {groups[str(n)] for n in (1, 2, 3)} != {groups[str(n)] for n in (4, 5, 6)}
    models = p.unpack_clusters(packed)
    heads = sorted(m["head.weight"].numpy()[0, 0] for m in models)
    np.testing.assert_allclose(heads, [0.0, (1.0 + 3.0 + 0.5) / 3], rtol=1e-6)
    np.testing.assert_allclose(models[0]["body.weight"].numpy(), 0.5)  # body: FedAvg of all


def test_output_layer_profiles_drop_scale_and_the_common_row() -> None:
    rng = np.random.default_rng(0)
    update = rng.normal(size=(4, 3))
    common = np.ones((4, 1)) * rng.normal(size=(1, 3))
    profiles = output_layer_profiles(np.stack([update, 5.0 * update + common]))
    np.testing.assert_allclose(profiles[0], profiles[1], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(profiles, axis=1), 1.0)
    with pytest.raises(ValueError, match="N, R, C"):
        output_layer_profiles(np.ones((2, 3)))


def test_ifca_local_kmeans_needs_one_sampled_node_per_cluster() -> None:
    ifca = IFCA(4, min_available_nodes=2)
    with pytest.raises(ValueError, match=r"2 sampled nodes for 4 clusters.*ifca-init='random'"):
        ifca.configure_train(1, _model(0.0, 0.0), ConfigRecord(), NodesOnly([1, 2]))  # type: ignore[arg-type]


def test_ifca_local_kmeans_repeats_when_too_few_replies_came_back() -> None:
    ifca = IFCA(4, min_available_nodes=2)
    model = _model(0.0, 0.0)
    requests = list(ifca.configure_train(1, model, ConfigRecord(), NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
    # Two of four nodes answer: no k-means over 2 models for 4 clusters, no crash.
    assert ifca.aggregate_train(1, [_reply(r, _model(1.0, 1.0), 10, None)
                                    for r in requests[:2]]) == (None, None)
    # Flower passes the unchanged model on: the next round is the warm start again.
    again = list(ifca.configure_train(2, model, ConfigRecord(), NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
    assert all(p.ARRAYS in m.content.array_records for m in again)


def test_ifca_reseeds_a_cluster_nobody_chose_by_splitting_the_widest_one() -> None:
    ifca = IFCA(2, init="random", reseed_after=2, min_available_nodes=4)
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 5.0)])
    sign = {1: 1.0, 2: 1.0, 3: -1.0, 4: -1.0}
    for server_round in (1, 2):
        requests = list(ifca.configure_train(server_round, packed, ConfigRecord(),
                                             NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
        start = p.unpack_clusters(packed)[0]
        replies = [
            _reply(r, _model(0.0, start["head.weight"].numpy()
                             + sign[r.metadata.dst_node_id] * np.array([1, 0, 0, 0])), 10, 0)
            for r in requests
        ]
        packed, _ = ifca.aggregate_train(server_round, replies)
        assert packed is not None
    assert ifca.summary_fields()["num_reseeds"] == 1
    assert ifca.reseeds == [(2, 1, 0)]
    heads = sorted(float(m["head.weight"].numpy()[0]) for m in p.unpack_clusters(packed))
    np.testing.assert_allclose(heads, [-1.0, 1.0])  # the two sides of cluster 0's members


def test_ifca_never_reseeds_when_disabled() -> None:
    ifca = IFCA(2, init="random", reseed_after=0)
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 5.0)])
    for server_round in range(1, 5):
        requests = list(ifca.configure_train(server_round, packed, ConfigRecord(),
                                             NodesOnly([1, 2, 3])))  # type: ignore[arg-type]
        replies = [_reply(r, _model(0.0, float(r.metadata.dst_node_id)), 10, 0) for r in requests]
        packed, _ = ifca.aggregate_train(server_round, replies)
    assert ifca.reseeds == []
    np.testing.assert_allclose(p.unpack_clusters(packed)[1]["head.weight"].numpy(), 5.0)


# ------------------------------------------------------------------------ CFL
def test_cfl_never_splits_a_cluster_of_two() -> None:
    rng = np.random.default_rng(0)
    direction = rng.normal(size=50)
    two = np.stack([direction, -direction])
    decision = decide_cfl_split(two, eps1=10.0, eps2=0.0, gamma_max=0.5)
    assert not decision.split  # the pair is opposed (cross similarity -1), still no split
    three = np.stack([direction, -direction, -direction + 0.01 * rng.normal(size=50)])
    assert decide_cfl_split(three, eps1=10.0, eps2=0.0, gamma_max=0.5).split


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


# ------------------------------------------------------------ pure gate math
def test_coherence_split_gate_is_scale_free() -> None:
    rng = np.random.default_rng(0)
    opposed = np.r_[np.ones((4, 1)), -np.ones((4, 1))] * np.r_[1.0, np.zeros(9)] + \
        0.05 * rng.normal(size=(8, 10))
    aligned = np.abs(opposed)
    for scale in (1e-3, 1.0, 1e3):
        reference = 0.5 * scale  # the largest norm of the first rounds
        max_norm = float(np.linalg.norm(opposed * scale, axis=1).max())
        assert coherence_split_gate(update_coherence(opposed * scale), max_norm, reference,
                                    0.8, 0.6)
        assert not coherence_split_gate(update_coherence(aligned * scale), max_norm, reference,
                                        0.8, 0.6)
        # Members that all stopped moving (0.25 of the early norm) have nothing to split.
        assert not coherence_split_gate(update_coherence(opposed * scale), 0.25 * reference,
                                        reference, 0.8, 0.6)
    with pytest.raises(ValueError, match="max_ratio"):
        coherence_split_gate(0.1, 0.5, 0.2, 0.8, -0.1)


def test_has_converged_waits_for_the_norms_to_level_off() -> None:
    rising = np.array([0.35, 0.36, 0.39, 0.41])
    falling = np.array([1.0, 0.8, 0.6, 0.45])
    flat = np.array([1.0, 0.6, 0.41, 0.40, 0.39, 0.40])
    assert not has_converged(rising, 2, 0.05)
    assert not has_converged(falling, 2, 0.1)
    assert has_converged(flat, 2, 0.1) and has_converged(flat * 1e-4, 2, 0.1)
    assert not has_converged(np.array([0.4]), 2, 0.1)  # too few rounds
    with pytest.raises(ValueError, match="tolerance"):
        has_converged(flat, 2, 1.0)


def test_widest_group_and_unit_rows() -> None:
    tight = np.array([[1.0, 0.0], [1.1, 0.0]])
    wide = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    assert widest_group([tight, np.zeros((0, 2)), wide]) == 2
    assert widest_group([np.ones((1, 2)), np.zeros((0, 2))]) is None
    with pytest.raises(ValueError, match="columns"):
        widest_group([tight, np.ones((2, 3))])
    np.testing.assert_allclose(np.linalg.norm(unit_rows(wide * 7.0), axis=1), 1.0)
    np.testing.assert_array_equal(unit_rows(np.zeros((1, 3))), 0.0)


def test_group_sizes_key_parses_shares_and_names_bad_values() -> None:
    assert parse_group_sizes("") is None
    assert parse_group_sizes("0.4,0.3,0.2,0.1") == (0.4, 0.3, 0.2, 0.1)
    for bad in ("0.5,-0.5", "a,b", "1,,2"):
        with pytest.raises(ValueError, match="group-sizes"):
            parse_group_sizes(bad)


def test_ifca_with_one_cluster_trains_it() -> None:
    """A client offered one model reports no cluster-id; every reply was rejected before."""
    ifca = IFCA(1)
    requests = list(ifca.configure_train(1, _model(0.0, 0.0), ConfigRecord(), NodesOnly([1, 2])))  # type: ignore[arg-type]
    replies = [_reply(r, _model(1.0, 2.0), 10, None) for r in requests]
    new, metrics = ifca.aggregate_train(1, replies)
    assert new is not None and metrics is not None
    assert metrics["cluster-sizes"] == [2]
    np.testing.assert_allclose(p.unpack_clusters(new)[0]["head.weight"].numpy(), 2.0)


def test_acfl_phase_one_ends_when_the_norms_level_off_not_at_a_random_model() -> None:
    """Norms 100x below the absolute 0.4: the old gate ended phase 1 after round 1."""
    acfl = ACFL(min_available_nodes=4)
    packed = p.pack_clusters([_model(0.0, 0.0)])
    due = []
    for server_round, norm in enumerate([1.0, 0.6, 0.4, 0.39, 0.40, 0.39], start=1):
        requests = list(acfl.configure_train(server_round, packed, ConfigRecord(),
                                             NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
        start = p.unpack_clusters(packed)[0]
        replies = [
            _reply(r, _model(0.0, start["head.weight"].numpy()
                             + 0.01 * norm * np.array([1.0, 0.0, 0.0, 0.0])), 10, None)
            for r in requests
        ]
        packed, _ = acfl.aggregate_train(server_round, replies)
        assert packed is not None
        due.append(acfl._clustering_due)
    assert due == [False] * 5 + [True]
