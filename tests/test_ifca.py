"""IFCA: the paper's updates, its warm start and re-seeding, then real federations.

The glue tests drive ``configure_train``/``aggregate_train`` with hand-made replies
(no Ray), so each checks one rule exactly; the rest are Flower simulations on
4-rotation digits.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fl_clusters import protocol as p
from fl_clusters.client.node_data import client_data_for
from fl_clusters.client_app import build_client_app, register_handlers
from fl_clusters.config import parse_run_config
from fl_clusters.drawing import draw_clusters
from fl_clusters.learner import TorchLearner
from fl_clusters.server_app import initial_arrays, train_config
from fl_clusters.strategies import IFCA, cluster_models
from tests.conftest import TWO_LAYER_NAMES as NAMES
from tests.conftest import NodesOnly
from tests.conftest import train_reply as _reply
from tests.conftest import two_layer_model as _model


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


@pytest.mark.usefixtures("server_identity")
def test_ifca_gradient_mode_steps_with_its_own_gamma_not_the_client_lr() -> None:
    ifca = IFCA(num_clusters=2, mode="gradient", server_lr=0.5, init="random",
                min_available_nodes=2)
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 0.0)])
    models = _gradient_round(ifca, packed, {1: 0, 2: 0}, {1: 10, 2: 10})
    # theta - gamma * mean gradient = 0 - 0.5 * 1; the client lr 0.01 would give -0.01.
    np.testing.assert_allclose(models[0]["head.weight"].numpy(), -0.5)
    np.testing.assert_allclose(models[1]["head.weight"].numpy(), 0.0)  # nobody chose it


@pytest.mark.usefixtures("server_identity")
def test_ifca_paper_gradient_update_divides_the_cluster_sum_by_all_clients() -> None:
    ifca = IFCA(num_clusters=2, mode="gradient", server_lr=0.6, aggregation="paper", init="random")
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 0.0)])
    models = _gradient_round(ifca, packed, {1: 0, 2: 1, 3: 1}, {1: 10, 2: 10, 3: 10})
    # theta_j - gamma / m * sum over S_j, m = 3 answering clients.
    np.testing.assert_allclose(models[0]["head.weight"].numpy(), -0.6 * 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(models[1]["head.weight"].numpy(), -0.6 * 2 / 3, rtol=1e-6)


@pytest.mark.usefixtures("server_identity")
def test_ifca_paper_model_averaging_ignores_example_counts() -> None:
    for aggregation, expected in (("weighted", (1 * 1 + 3 * 3) / 4), ("paper", 2.0)):
        ifca = IFCA(num_clusters=1, aggregation=aggregation, init="random")
        requests = list(ifca.configure_train(
            1, p.pack_clusters([_model(0.0, 0.0)]), ConfigRecord(), NodesOnly([1, 2]),  # type: ignore[arg-type]
        ))
        replies = [_reply(r, _model(v, v), v, 0) for r, v in zip(requests, (1, 3), strict=True)]
        new, _ = ifca.aggregate_train(1, replies)
        assert new is not None
        np.testing.assert_allclose(p.unpack_clusters(new)[0]["head.weight"].numpy(), expected)


# ----------------------------------------------------------- IFCA initialization
@pytest.mark.usefixtures("server_identity")
def test_ifca_keeps_the_users_pretrained_body_and_draws_only_heads() -> None:
    pretrained = _model(7.0, np.arange(4.0))
    ifca = IFCA(num_clusters=3, head_layers=1, init="random")
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


@pytest.mark.usefixtures("server_identity")
def test_ifca_restarts_are_scored_in_one_query_that_carries_one_model() -> None:
    # Issue 18: candidates travel as seeds; each node draws them itself.
    ifca = IFCA(num_clusters=2, head_layers=1, init="random", restarts=3,
                min_available_nodes=4, seed=5)
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
    expected = draw_clusters(start, 2, 1, 6)
    for key in expected:
        np.testing.assert_array_equal(chosen[key].numpy(), expected[key].numpy())


@pytest.mark.usefixtures("server_identity")
def test_a_client_scores_the_candidates_the_server_draws() -> None:
    import torch
    from torch.utils.data import TensorDataset

    from fl_clusters.client.queries import cluster_losses_reply
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
    reply = cluster_losses_reply(learner, query)
    losses = list(reply.content.metric_records[p.METRICS][p.M_CLUSTER_LOSSES])  # type: ignore[arg-type]
    expected = [
        float(learner.per_sample_losses(model, "train").mean())
        for seed in (3, 4) for model in p.unpack_clusters(draw_clusters(start, 2, 0, seed))
    ]
    assert losses == pytest.approx(expected) and len(set(losses)) == 4


def _two_layer(body: float, head: np.ndarray) -> ArrayRecord:
    return p.numpy_to_record(
        NAMES, [np.full((2, 3), body, np.float32), np.asarray(head, np.float32)]
    )


@pytest.mark.usefixtures("server_identity")
def test_ifca_local_kmeans_start_groups_the_first_local_updates() -> None:
    ifca = IFCA(num_clusters=2, head_layers=1, init_steps=7, min_available_nodes=6)
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


@pytest.mark.usefixtures("server_identity")
def test_ifca_local_kmeans_with_too_few_sampled_nodes_is_repeated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ifca = IFCA(num_clusters=4, min_available_nodes=2)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        sent = ifca.configure_train(1, _model(0.0, 0.0), ConfigRecord(), NodesOnly([1, 2]))  # type: ignore[arg-type]
    assert list(sent) == []
    assert "2 nodes for 4 clusters" in caplog.text and "ifca-init='random'" in caplog.text
    assert ifca.aggregate_train(1, []) == (None, None) and ifca.failed_rounds == 1


@pytest.mark.usefixtures("server_identity")
def test_ifca_local_kmeans_repeats_when_too_few_replies_came_back() -> None:
    ifca = IFCA(num_clusters=4, min_available_nodes=2)
    model = _model(0.0, 0.0)
    requests = list(ifca.configure_train(1, model, ConfigRecord(), NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
    # Two of four nodes answer: no k-means over 2 models for 4 clusters, no crash.
    assert ifca.aggregate_train(1, [_reply(r, _model(1.0, 1.0), 10, None)
                                    for r in requests[:2]]) == (None, None)
    # Flower passes the unchanged model on: the next round is the warm start again.
    again = list(ifca.configure_train(2, model, ConfigRecord(), NodesOnly([1, 2, 3, 4])))  # type: ignore[arg-type]
    assert all(p.ARRAYS in m.content.array_records for m in again)


@pytest.mark.usefixtures("server_identity")
def test_ifca_reseeds_a_cluster_nobody_chose_by_splitting_the_widest_one() -> None:
    ifca = IFCA(num_clusters=2, init="random", reseed_after=2, min_available_nodes=4)
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


@pytest.mark.usefixtures("server_identity")
def test_ifca_never_reseeds_when_disabled() -> None:
    ifca = IFCA(num_clusters=2, init="random", reseed_after=0)
    packed = p.pack_clusters([_model(0.0, 0.0), _model(0.0, 5.0)])
    for server_round in range(1, 5):
        requests = list(ifca.configure_train(server_round, packed, ConfigRecord(),
                                             NodesOnly([1, 2, 3])))  # type: ignore[arg-type]
        replies = [_reply(r, _model(0.0, float(r.metadata.dst_node_id)), 10, 0) for r in requests]
        packed, _ = ifca.aggregate_train(server_round, replies)
    assert ifca.reseeds == []
    np.testing.assert_allclose(p.unpack_clusters(packed)[1]["head.weight"].numpy(), 5.0)


@pytest.mark.usefixtures("server_identity")
def test_ifca_with_one_cluster_trains_it() -> None:
    """A client offered one model reports no cluster-id; every reply was rejected before."""
    ifca = IFCA(num_clusters=1)
    requests = list(ifca.configure_train(1, _model(0.0, 0.0), ConfigRecord(), NodesOnly([1, 2])))  # type: ignore[arg-type]
    replies = [_reply(r, _model(1.0, 2.0), 10, None) for r in requests]
    new, metrics = ifca.aggregate_train(1, replies)
    assert new is not None and metrics is not None
    assert metrics["cluster-sizes"] == [2]
    np.testing.assert_allclose(p.unpack_clusters(new)[0]["head.weight"].numpy(), 2.0)


ROTATION = {"cluster-structure": "rotation", "num-clusters": 4, "num-rounds": 12}


def test_ifca_recovers_rotations_and_beats_fedavg(federation) -> None:
    ifca = federation({**ROTATION, "strategy": "ifca"})
    fedavg = federation({**ROTATION, "strategy": "fedavg"})
    assert ifca["ari"] >= 0.95, ifca
    assert ifca["num_clusters_found"] == 4
    assert ifca["personalized_accuracy"] >= fedavg["personalized_accuracy"] + 0.1, (
        ifca["personalized_accuracy"],
        fedavg["personalized_accuracy"],
    )
    assert ifca["bytes_sent"] > 3.5 * fedavg["bytes_sent"]  # k models go out, not one
    folder = ifca["_folder"]
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == ROTATION["num-rounds"]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in rounds)
    assert all(0 < r["seconds"] < ifca["wall_time_s"] for r in rounds)
    models = np.load(folder / "models.npz")
    assert sum(key.startswith("cluster-3/") for key in models.files) > 0


def test_ifca_gradient_averaging_and_weight_sharing(federation) -> None:
    shared = federation(
        {**ROTATION, "strategy": "ifca", "ifca-head-layers": 1, "num-rounds": 12}
    )
    assert shared["ari"] >= 0.9, shared
    models = np.load(shared["_folder"] / "models.npz")
    assert any(key.startswith("shared/") for key in models.files)
    assert not any(key.startswith("cluster-0/body") for key in models.files)
    gradient = federation(
        {**ROTATION, "strategy": "ifca", "ifca-mode": "gradient", "lr": 0.5, "num-rounds": 15}
    )
    assert gradient["ari"] >= 0.9, gradient


class _Faulty(TorchLearner):
    """Partition 3 raises in training; partition 5 returns NaN weights."""

    partition = -1

    def train(self, arrays: ArrayRecord, **kwargs) -> tuple[ArrayRecord, float]:
        if self.partition == 3:
            raise RuntimeError("simulated client crash")
        trained, loss = super().train(arrays, **kwargs)
        if self.partition == 5:
            trained = ArrayRecord(
                {k: Array(np.full(v.shape, np.nan, dtype=np.float32)) for k, v in trained.items()}
            )
        return trained, loss


def test_crashing_and_nan_clients_do_not_stop_the_run(federation) -> None:
    overrides = {**ROTATION, "strategy": "ifca", "num-rounds": 3}

    def learner_fn(context: Context) -> TorchLearner:
        import torch
        from torch.utils.data import TensorDataset

        from fl_clusters.models import build_model

        data = client_data_for(context, overrides)
        learner = _Faulty(
            build_model("mlp", (1, 8, 8), 10),
            TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
            TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        )
        learner.partition = int(context.node_config["partition-id"])
        return learner

    app = register_handlers(ClientApp(), learner_fn)
    summary = federation(overrides, num_clients=8, client_app=app)
    # Both faulty nodes are rejected every round; the run still finishes.
    assert summary["rejected_replies"] == 2 * 3
    assert summary["num_clients"] == 8


def test_ifca_runs_from_a_users_own_server_app(tmp_path, ray_session) -> None:
    """The one-line swap: IFCA(...) where a ServerApp had FedAvg(...)."""
    overrides = {"num-rounds": 2, "min-nodes": 8}
    out = tmp_path / "clusters.json"
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        settings = parse_run_config(overrides)
        strategy = IFCA(num_clusters=4, min_available_nodes=8)
        result = strategy.start(
            grid=grid,
            initial_arrays=initial_arrays(settings),
            num_rounds=2,
            train_config=train_config(settings),
        )
        models = cluster_models(result)
        out.write_text(json.dumps([sorted(m.keys()) for m in models]))

    run_simulation(app, build_client_app(overrides), num_supernodes=8)
    models = json.loads(out.read_text())
    assert len(models) == 4
    assert models[0] == ["body.1.bias", "body.1.weight", "head.bias", "head.weight"]


@pytest.mark.parametrize("bad", [{"strategy": "nope"}, {"num-clusters": -1}])
def test_bad_run_config_stops_before_any_round(bad: dict) -> None:
    with pytest.raises(ValueError, match=r"must be .*; got "):
        parse_run_config(bad)
