"""FedSoft: unit checks of the glue and scores, then real Flower simulations on digits."""

from __future__ import annotations

import csv
import json
import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from sklearn.metrics import adjusted_rand_score
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.client.node_data import client_data_for
from fl_clusters.client.queries import TEST_GROUPS, group_scores
from fl_clusters.client_app import register_handlers
from fl_clusters.clustering import best_fit_counts
from fl_clusters.config import parse_run_config
from fl_clusters.learner import TorchLearner
from fl_clusters.metrics import (
    importance_weight_error,
    match_clusters_to_sources,
    pooled_group_accuracy,
    soft_clustering_scores,
)
from fl_clusters.models import build_model
from fl_clusters.strategies import FedSoft
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import Federation, SharedRay, federation_in

MIXTURE = {"cluster-structure": "rotation-mixture", "num-clusters": 2}


NUM_CLIENTS = 20


class CountsGrid:
    """Just enough of a Grid for FedSoft: fixed nodes answering the sample-assignment query."""

    def __init__(self, counts: dict[int, list[int]]) -> None:
        self.counts = counts
        self.queries = 0

    def get_node_ids(self) -> list[int]:
        return sorted(self.counts)

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            assert msg.metadata.message_type == p.QUERY_SAMPLE_ASSIGNMENT
            assert p.num_packed_clusters(msg.content.array_records[p.CLUSTERS]) == 2
            self.queries += 1
            counts = self.counts[msg.metadata.dst_node_id]
            metrics = MetricRecord({"counts": counts, p.M_NUM_EXAMPLES: max(sum(counts), 1)})
            replies.append(Message(RecordDict({p.METRICS: metrics}), reply_to=msg))
        return replies


def _model(value: float) -> ArrayRecord:
    return p.numpy_to_record(
        ["layer.weight", "layer.bias"],
        [np.full((3, 4), value, dtype=np.float32), np.full(3, value, dtype=np.float32)],
    )


def _replies(messages: list[Message]) -> list[Message]:
    """Node k returns a model full of k, trained on 10 k examples."""
    return [
        Message(
            RecordDict(
                {
                    p.ARRAYS: _model(float(m.metadata.dst_node_id)),
                    p.METRICS: MetricRecord(
                        {p.M_NUM_EXAMPLES: 10 * m.metadata.dst_node_id, p.M_TRAIN_LOSS: 0.1}
                    ),
                }
            ),
            reply_to=m,
        )
        for m in messages
    ]


def test_one_message_per_drawn_node_and_plain_mean_per_cluster(server_identity) -> None:
    # Nodes 1-3 fit cluster 0 best, 4-6 cluster 1; node 7 sends counts for 3 clusters
    # and node 8 an all-zero count: both are logged and skipped. The paper's rules:
    # K draws per cluster, each cluster the plain mean of its draws.
    counts = {1: [9, 1], 2: [8, 2], 3: [10, 0], 4: [0, 10], 5: [1, 9], 6: [5, 5],
              7: [1, 1, 1], 8: [0, 0]}
    grid = CountsGrid(counts)
    strategy = FedSoft(num_clusters=2, tau=2, sigma=0.01, clients_per_cluster=4,
                       proximal_lambda=0.3,
                       init="random", preset="paper")
    messages = list(strategy.configure_train(1, _model(0.0), ConfigRecord({"lr": 0.1}), grid))  # type: ignore[arg-type]
    assert grid.queries == 8 and strategy.rejected_replies == 2
    assert sorted(strategy.importance) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(strategy.importance[3], [1.0, 0.01])  # floored, not renormalized
    drawn = strategy.selections[1]
    assert [len(d) for d in drawn] == [4, 4]
    # Every drawn node gets exactly one message, with one proximal problem over both
    # centres weighted by its u, and a node drawn twice is there once.
    destinations = [m.metadata.dst_node_id for m in messages]
    assert sorted(destinations) == sorted(set(drawn[0]) | set(drawn[1]))
    assert len(set(drawn[0]) & set(drawn[1])) >= 2  # 4 + 4 draws from 6 nodes overlap
    for msg in messages:
        config = msg.content.config_records[p.CONFIG]
        node = msg.metadata.dst_node_id
        assert config[p.CFG_PERSISTENT] is True and config[p.CFG_PROX_MU] == 0.3
        np.testing.assert_allclose(config[p.CFG_CENTER_WEIGHTS], strategy.importance[node])
        assert p.num_packed_clusters(msg.content.array_records[p.CENTERS]) == 2
        assert config["lr"] == 0.1
        # A node without a model of its own starts from the common initial model.
        assert msg.content.array_records[p.ARRAYS]["layer.bias"].numpy().tolist() == [0.0] * 3
    # Node k returns a model full of k; cluster s must be the plain mean over its draws.
    packed, metrics = strategy.aggregate_train(1, _replies(messages))
    assert packed is not None and metrics is not None
    for s, model in enumerate(p.unpack_clusters(packed)):
        np.testing.assert_allclose(model["layer.bias"].numpy(), np.mean(drawn[s]), rtol=1e-6)
    assert metrics["max-tasks-per-node"] == 1
    # Round 2 reuses u (tau = 2): no query; round 3 estimates again.
    second = list(strategy.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 8
    # Nodes that returned a model keep it in their state: no start model is re-sent
    # to them (before, every train message carried the initial model again).
    trained = set(destinations)
    for msg in second:
        assert (p.ARRAYS in msg.content.array_records) == (msg.metadata.dst_node_id not in trained)
    # A node that fails (e.g. restarted, its state lost) gets a start model again.
    failed = second[0]
    strategy.aggregate_train(2, [Message(Error(code=0, reason="no model of its own"),
                                         reply_to=failed)])
    assert failed.metadata.dst_node_id not in strategy._initialized
    list(strategy.configure_train(3, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 16 and strategy.estimate_rounds == [1, 3]
    fields = strategy.summary_fields()
    assert fields["max_train_tasks_per_node"] == 1
    assert set(fields["importance_weights"]) == {str(n) for n in range(1, 7)}


@pytest.mark.parametrize("clients_per_cluster", [None, 5])
def test_cluster_models_weigh_the_drawn_nodes_by_importance(
    server_identity, clients_per_cluster: int | None
) -> None:
    # Two groups of 3 nodes (1-3 fit cluster 0, 4-6 cluster 1). With K = 5 each
    # cluster also draws 2 nodes of the other group at the floor sigma: the paper's
    # plain mean gives them 2/5 of the cluster model, so both models mix both
    # groups. The robust rule weighs every drawn node by u_ks n_k; by default (no K)
    # every node trains every round.
    counts = {1: [10, 0], 2: [10, 0], 3: [10, 0], 4: [0, 10], 5: [0, 10], 6: [0, 10]}
    strategy = FedSoft(num_clusters=2, init="random", clients_per_cluster=clients_per_cluster)
    assert strategy.importance_weighted_mean and strategy.sigma == 1e-4
    grid = CountsGrid(counts)
    messages = list(strategy.configure_train(1, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    drawn = strategy.selections[1]
    assert [len(d) for d in drawn] == [clients_per_cluster or 6] * 2
    assert {1, 2, 3} <= set(drawn[0]) and {4, 5, 6} <= set(drawn[1])
    packed, _ = strategy.aggregate_train(1, _replies(messages))
    assert packed is not None
    members = [[1, 2, 3], [4, 5, 6]]
    for model, group in zip(p.unpack_clusters(packed), members, strict=True):
        # The group's mean (every node counted 10 samples), the others at sigma.
        np.testing.assert_allclose(model["layer.bias"].numpy(), np.mean(group), rtol=1e-3)
    paper = FedSoft(num_clusters=2, init="random", clients_per_cluster=5, preset="paper")
    assert not paper.importance_weighted_mean
    messages = list(paper.configure_train(1, _model(0.0), ConfigRecord(), CountsGrid(counts)))  # type: ignore[arg-type]
    packed, _ = paper.aggregate_train(1, _replies(messages))
    assert packed is not None
    for model, picks in zip(p.unpack_clusters(packed), paper.selections[1], strict=True):
        np.testing.assert_allclose(model["layer.bias"].numpy(), np.mean(picks), rtol=1e-6)


def test_the_last_round_says_when_no_importance_weight_tells_the_clusters_apart(
    server_identity, caplog: pytest.LogCaptureFixture
) -> None:
    # Cluster models that fit every node's samples alike (too little training for
    # their losses to tell the groups apart) leave u near 1/2 for every node: the
    # clusters average the nodes alike, and the run must say so at its end.
    said = "tell the clusters apart for no node"
    ties = {1: [52, 48], 2: [47, 53], 3: [50, 50], 4: [51, 49]}
    strategy = FedSoft(num_clusters=2, init="random")
    strategy.final_round = 2
    with caplog.at_level(logging.WARNING):
        list(strategy.configure_train(1, _model(0.0), ConfigRecord(), CountsGrid(ties)))  # type: ignore[arg-type]
        assert said not in caplog.text  # only the last round judges
        list(strategy.configure_train(2, _model(0.0), ConfigRecord(), CountsGrid(ties)))  # type: ignore[arg-type]
    assert said in caplog.text and "largest 0.53" in caplog.text
    caplog.clear()
    groups = {1: [60, 40], 2: [47, 53], 3: [50, 50], 4: [51, 49]}  # node 1 leans to 0
    strategy = FedSoft(num_clusters=2, init="random")
    strategy.final_round = 1
    with caplog.at_level(logging.WARNING):
        list(strategy.configure_train(1, _model(0.0), ConfigRecord(), CountsGrid(groups)))  # type: ignore[arg-type]
    assert said not in caplog.text


def test_local_kmeans_warm_start_groups_first_updates(server_identity) -> None:
    # Nodes 1-3 move the model one way, 4-6 the other: k-means must find the two
    # groups, and cluster s must start as the plain mean of its group's models.
    counts = {n: [5, 5] for n in range(1, 7)}
    grid = CountsGrid(counts)
    strategy = FedSoft(num_clusters=2, tau=2, clients_per_cluster=2, init="local-kmeans")
    start = _model(0.0)
    messages = list(strategy.configure_train(1, start, ConfigRecord({"lr": 0.1}), grid))  # type: ignore[arg-type]
    assert grid.queries == 0  # no importance estimate in the warm-start round
    assert sorted(m.metadata.dst_node_id for m in messages) == list(range(1, 7))
    for msg in messages:
        config = msg.content.config_records[p.CONFIG]
        assert config[p.CFG_PERSISTENT] is True and p.CENTERS not in msg.content.array_records
        assert msg.content.array_records[p.ARRAYS]["layer.bias"].numpy().tolist() == [0.0] * 3
    shift = {1: 1.0, 2: 1.2, 3: 0.8, 4: -1.0, 5: -1.1, 6: -0.9}
    replies = [
        Message(
            RecordDict({
                p.ARRAYS: _model(shift[m.metadata.dst_node_id]),
                p.METRICS: MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5}),
            }),
            reply_to=m,
        )
        for m in messages
    ]
    packed, metrics = strategy.aggregate_train(1, replies)
    assert packed is not None and metrics is not None and metrics["max-tasks-per-node"] == 1
    groups = strategy.warm_start_groups
    assert groups[1] == groups[2] == groups[3] != groups[4] == groups[5] == groups[6]
    means = sorted(float(m["layer.bias"].numpy()[0]) for m in p.unpack_clusters(packed))
    np.testing.assert_allclose(means, [-1.0, 1.0], rtol=1e-6)
    # The groups are the first importance weights: round 2 draws by them and asks no
    # node (the centres, means of one local task's models, would fit every sample
    # alike); round 3 (tau = 2) estimates from the trained cluster models.
    for node, group in groups.items():
        np.testing.assert_allclose(strategy.importance[node],
                                   [1.0 if s == group else 1e-4 for s in range(2)])
    list(strategy.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 0 and strategy.estimate_rounds == []
    for s, picks in enumerate(strategy.selections[2]):  # K = 2 of each group's 3 nodes
        assert len(picks) == 2 and all(groups[n] == s for n in picks)
    list(strategy.configure_train(3, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 6 and strategy.estimate_rounds == [3]
    assert strategy.summary_fields()["init"] == "local-kmeans"


def test_local_kmeans_warm_start_without_a_model_per_cluster_is_repeated(server_identity) -> None:
    grid = CountsGrid({1: [1, 1], 2: [1, 1], 3: [1, 1]})
    strategy = FedSoft(num_clusters=3, init="local-kmeans")
    messages = list(strategy.configure_train(1, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    one_reply = Message(
        RecordDict({
            p.ARRAYS: _model(1.0),
            p.METRICS: MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5}),
        }),
        reply_to=messages[0],
    )
    # One warm start for every strategy: too few local models repeat it next round.
    assert strategy.aggregate_train(1, [one_reply]) == (None, None)
    again = list(strategy.configure_train(2, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    assert all(p.ARRAYS in m.content.array_records and p.CENTERS not in m.content.array_records
               for m in again)


def test_cluster_models_start_different_and_config_is_checked() -> None:
    rng = np.random.default_rng(0)
    initial = p.numpy_to_record(["layer.weight"], [rng.normal(size=(3, 4)).astype(np.float32)])
    models = p.unpack_clusters(FedSoft(num_clusters=3, seed=1).initialize(initial))
    assert len(models) == 3
    assert not np.allclose(models[0]["layer.weight"].numpy(), models[1]["layer.weight"].numpy())
    for bad, name in (({"tau": 0}, "tau"), ({"sigma": 2.0}, "sigma"),
                      ({"clients_per_cluster": 0}, "clients_per_cluster"),
                      ({"proximal_lambda": -1.0}, "proximal_lambda"),
                      ({"init": "kmeans"}, "init")):
        with pytest.raises(ValueError, match=name):
            FedSoft(num_clusters=2, **bad)
    with pytest.raises(ValueError, match="fedsoft-tau"):
        parse_run_config({"strategy": "fedsoft", "fedsoft-tau": 0})
    with pytest.raises(ValueError, match="fedsoft-init"):
        parse_run_config({"strategy": "fedsoft", "fedsoft-init": "kmeans"})
    strategy = build_strategy(
        {**parse_run_config({**MIXTURE, "strategy": "fedsoft", "fedsoft-lambda": 0.5}),
         "min-available-nodes": 4}
    )
    assert isinstance(strategy, FedSoft)
    assert (strategy.num_clusters, strategy.proximal_lambda, strategy.tau) == (2, 0.5, 2)


def test_source_scores_are_pooled_matched_and_permutation_invariant() -> None:
    # Two nodes, two cluster models, two sources; cluster 0 serves source 1.
    correct = np.array([[[2, 9], [8, 1]], [[1, 18], [9, 2]]])
    counts = np.array([[10, 10], [10, 20]])
    accuracy = pooled_group_accuracy(correct, counts)
    np.testing.assert_allclose(accuracy, [[3 / 20, 27 / 30], [17 / 20, 3 / 30]])
    match = match_clusters_to_sources(accuracy)
    assert match.tolist() == [1, 0]
    u = np.array([[0.3, 0.7], [0.5, 0.5]])
    truth = np.array([[0.8, 0.2], [0.6, 0.4]])  # source shares; cluster 0 <-> source 1
    assert importance_weight_error(u, truth, match) == pytest.approx((0.1 + 0.1 + 0.1 + 0.1) / 4)
    rows = [
        {"node-id": 5, "test-accuracy": [0.0, 0.0], "true-mixture": truth[0].tolist(),
         "group-correct": correct[0].ravel().tolist(), "group-counts": counts[0].tolist()},
        {"node-id": 6, "test-accuracy": [0.0, 0.0], "true-mixture": truth[1].tolist(),
         "group-correct": correct[1].ravel().tolist(), "group-counts": counts[1].tolist()},
    ]
    scores = soft_clustering_scores(rows, {"5": u[0].tolist(), "6": u[1].tolist()})
    assert scores["cluster_best_source"] == [1, 0]
    assert scores["importance_weight_error"] == pytest.approx(0.1)
    assert soft_clustering_scores([{k: v for k, v in rows[0].items() if k != "group-counts"}],
                                  None) == {}
    with pytest.raises(ValueError, match="correct"):
        pooled_group_accuracy(correct + 20, counts)


class _CountingLearner(TorchLearner):
    """Appends one line per local optimization task to a file shared by all processes."""

    log_file = Path()
    node_id = 0

    def train(self, arrays: ArrayRecord, **kwargs) -> tuple[ArrayRecord, float]:
        with self.log_file.open("a") as out:
            out.write(f"{self.node_id}\n")
        return super().train(arrays, **kwargs)


def test_each_drawn_node_solves_one_proximal_problem_per_round(federation, tmp_path) -> None:
    # The random start: every round draws (a warm-start round would train every node once),
    # K nodes per cluster (by default every node is drawn for every cluster).
    overrides = {**MIXTURE, "strategy": "fedsoft", "fedsoft-init": "random", "num-rounds": 4,
                 "mixture-alpha": 0.5, "fedsoft-clients-per-cluster": 5}
    log_file = tmp_path / "tasks.log"

    def learner_fn(context: Context) -> TorchLearner:
        data = client_data_for(context, overrides)
        learner = _CountingLearner(
            build_model("mlp", (1, 8, 8), 10),
            TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
            TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        )
        learner.log_file, learner.node_id = log_file, context.node_id
        return learner

    def metadata_fn(context: Context) -> dict[str, list]:
        data = client_data_for(context, overrides)
        return {"true-mixture": data.mixture.tolist(), TEST_GROUPS: data.test_sources.tolist()}

    app = register_handlers(ClientApp(), learner_fn, metadata_fn)
    summary = federation(overrides, num_clients=8, client_app=app)
    tasks = Counter(int(line) for line in log_file.read_text().split())
    drawn_rounds: Counter[int] = Counter()
    drawn_twice = 0
    for picks in summary["selections"].values():
        drawn_rounds.update(set(picks[0]) | set(picks[1]))
        drawn_twice += len(set(picks[0]) & set(picks[1]))
    # K = 5 per cluster among 8 nodes: some node is drawn by both clusters in a round,
    # and still trains once in that round.
    assert drawn_twice > 0
    assert dict(tasks) == dict(drawn_rounds)
    assert summary["max_train_tasks_per_node"] == 1
    assert summary["importance_estimate_rounds"] == [1, 3]
    assert len(summary["importance_weights"]) == 8
    # The report's per-source counts reach the summary, scored against the truth.
    assert np.array(summary["cluster_source_accuracy"]).shape == (2, 2)
    assert 0.0 <= summary["importance_weight_error"] <= 1.0


def test_report_rejects_groups_that_do_not_match_the_test_split() -> None:
    x, y = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.int64)
    learner = TorchLearner(
        build_model("mlp", (1, 8, 8), 10), TensorDataset(x, y), TensorDataset(x, y)
    )
    model = ArrayRecord(learner.model.state_dict())
    scored = learner.per_sample_scores(model, "test")[1]
    correct, counts = group_scores([scored, scored], [0, 1, 1, 1])
    assert counts == [1, 3] and len(correct) == 4 and correct[:2] == correct[2:]
    with pytest.raises(ValueError, match="one non-negative integer group per test sample"):
        group_scores([scored], [0, 1])


# The acceptance setting: 20 clients, a 2-source rotation mixture of digits.
# The sources are a quarter turn apart (rotation-step 90): at 0 and 180 degrees the
# digits 0, 1 and 8 look alike, and the per-sample loss argmin split them between the
# clusters (u error 0.15-0.30 measured). Nearly pure clients (mixture-alpha 0.1), each
# source its own copy of the digits (copy-per-group: ~140 train samples per client
# instead of ~70), no validation split (FedSoft does not use one), K = 5 and tau,
# sigma the defaults. Two settings were needed, both named here:
# - fedsoft-init local-kmeans (the default, which preset='paper' changes): with
#   random cluster models the first estimates of u are noise, the first draws mix
#   both sources and, since one MLP fits both quarter turns, both clusters often
#   settle as generalists (both gaps >= 0.10 and u error <= 0.15 in 6 of 13 measured
#   runs, default lambda, K 3);
# - fedsoft-lambda 0.01: at 0.1 each local model is pulled towards the cluster
#   models, which a mixed client drawn for both clusters blends every few rounds, so
#   the local models, and then the clusters (plain means of local models), drift to
#   generalists (warm start with lambda 0.1: 2 of 5 runs met the bars).
ACCEPTANCE = {
    **MIXTURE,
    "rotation-step": 90,
    "mixture-alpha": 0.1,
    "validation-fraction": 0.0,
    "copy-per-group": True,
    "num-rounds": 100,
    "local-steps": 20,
    "fedsoft-init": "local-kmeans",
    "fedsoft-lambda": 0.01,
}


def _source_gaps(summary: dict) -> tuple[np.ndarray, np.ndarray]:
    """Each cluster's best source and how much better it does there than on the other."""
    accuracy = np.array(summary["cluster_source_accuracy"])  # (cluster, source)
    best = accuracy.argmax(axis=1)
    return best, accuracy[np.arange(2), best] - accuracy[np.arange(2), 1 - best]


@pytest.mark.slow
def test_local_kmeans_warm_start_groups_clients_by_their_dominant_source(federation) -> None:
    """Round 1 trains every node once; k-means of those updates finds the sources.

    Measured: ARI 1.0 against each client's dominant source (seeds 0 to 3 in an
    in-process replica, seed 0 through Flower).
    """
    summary = federation({**ACCEPTANCE, "strategy": "fedsoft", "num-rounds": 3})
    rows = list(csv.DictReader((summary["_folder"] / "assignments.csv").open()))
    groups = summary["warm_start_groups"]
    assert len(groups) == NUM_CLIENTS
    truth = [int(row["true_cluster"]) for row in rows]
    assert adjusted_rand_score(truth, [groups[row["node_id"]] for row in rows]) >= 0.8
    rounds = [json.loads(line) for line in (summary["_folder"] / "rounds.jsonl").open()]
    assert rounds[0]["train"]["num-trained"] == NUM_CLIENTS
    assert summary["max_train_tasks_per_node"] == 1
    assert summary["importance_estimate_rounds"][0] == 3


@pytest.fixture(scope="module")
def fedsoft_acceptance(
    tmp_path_factory: pytest.TempPathFactory, shared_ray: SharedRay
) -> dict[str, Any]:
    """FedSoft's run in the acceptance setting (100 rounds), read by two tests."""
    run = federation_in(tmp_path_factory.mktemp("fedsoft-acceptance"), shared_ray)
    return run({**ACCEPTANCE, "strategy": "fedsoft"})


@pytest.mark.slow
def test_fedsoft_recovers_the_sources_of_a_digits_mixture(
    fedsoft_acceptance: dict[str, Any],
) -> None:
    """Both cluster models serve different sources and u matches the true mixtures.

    Measured in this setting through Flower, seeds 0 to 3: source gaps 0.75 / 0.64,
    0.59 / 0.37, 0.61 / 0.72, 0.65 / 0.44 and u error 0.054, 0.074, 0.058, 0.043. In
    an in-process replica of the algorithm (same data, model and draw rule) 10 of 10
    seeds met both bars after 100 rounds, and 93 of 100 snapshots taken every 10
    rounds (a cluster is the plain mean of this round's draws, so it can dip for a
    round when a mixed client is drawn for both).
    """
    summary = fedsoft_acceptance
    best, gaps = _source_gaps(summary)
    assert sorted(best.tolist()) == [0, 1], summary["cluster_source_accuracy"]
    assert gaps.min() >= 0.10, summary["cluster_source_accuracy"]
    assert summary["importance_weight_error"] <= 0.15, summary["importance_weight_error"]
    assert summary["max_train_tasks_per_node"] == 1


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="issue 4's last bar is not met on digits: one network fits both quarter-turn "
    "sources, so FedAvg's model, trained on every client every round, beats local models "
    "trained on ~140 samples and pulled towards one source's cluster. Measured after 100 "
    "rounds: FedSoft local models 0.891-0.908 (this setting, 4 seeds) and 0.915-0.941 "
    "(lambda 0.1) against FedAvg 0.957; 0/180-degree sources 0.928 against 0.950; one shared copy "
    "(MLP) 0.886-0.922 against 0.953, CNN 0.933 against 0.969. The reproduction report "
    "(seed 004) also has local models below cluster models (MNIST-2set 66.9 vs 77.9)",
)
def test_fedsoft_local_models_beat_fedavg(
    federation: Federation, fedsoft_acceptance: dict[str, Any]
) -> None:
    fedsoft = fedsoft_acceptance
    fedavg = federation({**ACCEPTANCE, "strategy": "fedavg"})
    assert fedsoft["personalized_accuracy"] > fedavg["personalized_accuracy"], (
        fedsoft["personalized_accuracy"],
        fedavg["personalized_accuracy"],
    )


def test_a_node_without_its_own_model_and_no_start_says_so(server_identity) -> None:
    from fl_clusters.client.task import candidate_models

    config = ConfigRecord({p.CFG_PERSISTENT: True})
    message = Message(RecordDict({p.CENTERS: p.pack_clusters([_model(0.0), _model(1.0)]),
                                  p.CONFIG: config}), dst_node_id=1, message_type="train")
    own = _model(5.0)
    assert candidate_models(message, own) == [own]
    with pytest.raises(ValueError, match="keeps no model of its own"):
        candidate_models(message, None)


def test_a_node_that_joins_between_estimates_is_estimated_at_once(server_identity) -> None:
    counts = {1: [9, 1], 2: [8, 2], 3: [1, 9], 4: [0, 10]}
    grid = CountsGrid(counts)
    strategy = FedSoft(num_clusters=2, tau=5, sigma=0.01, clients_per_cluster=2, init="random")
    list(strategy.configure_train(1, _model(0.0), ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 4
    packed = strategy.initialize(_model(0.0))
    counts[5] = [2, 8]  # node 5 joins; the next full estimate would be round 6
    list(strategy.configure_train(2, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 5 and 5 in strategy.importance  # only the newcomer was asked
    assert strategy.assignments[5] == 1
    list(strategy.configure_train(3, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert grid.queries == 5


def test_fedsoft_counts_share_tied_samples_instead_of_giving_them_to_cluster_0() -> None:
    # Three identical cluster models (a random start in the worst case) tie on
    # every sample; argmin gave cluster 0 all 4 samples.
    tied = np.ones((3, 4))
    np.testing.assert_allclose(best_fit_counts(tied), [4 / 3, 4 / 3, 4 / 3])
    losses = np.array([[0.1, 0.5, 0.2, 0.9], [0.3, 0.5, 0.2, 0.1], [0.2, 0.6, 0.7, 0.8]])
    np.testing.assert_allclose(best_fit_counts(losses), [1 + 0.5 + 0.5, 0.5 + 0.5 + 1, 0.0])
    assert best_fit_counts(losses).sum() == pytest.approx(4.0)
