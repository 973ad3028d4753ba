"""AWCFL's cluster mixing and MCFL's model choice, options of the clustered strategies."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.client.choice import mcfl_choice
from fl_clusters.metrics import density_clustering_scores, mcfl_scores
from fl_clusters.strategies import CFL, IFCA
from tests.conftest import StubGrid

ROTATION = {"cluster-structure": "rotation", "num-clusters": 4}


# MCFL picks a model by the mean of a client's test inputs. With a plain split each
# client holds ~18 test digits, and in about 1 run in 4 one of the 20 means lands
# nearer another rotation's feature (benchmarks/mcfl_choice.py); that one client
# then costs ~2.5 points of intra-cluster accuracy, beyond the 2-point bar.
# A copy of the data per group (~72 test digits per client) errs in 1 draw of 900.
# ACFL clusters those copies (ARI 1.0 in every run measured); IFCA at seed 0 merged
# the 0 and 180 degree copies (ARI 0.68).
ACFL_ROTATION_COPIES = {**ROTATION, "copy-per-group": True, "strategy": "acfl", "num-rounds": 10,
                        "acfl-phase1-rounds": 9}


def _model(seed: int) -> ArrayRecord:
    rng = np.random.default_rng(seed)
    return p.numpy_to_record(
        ["layer.weight", "layer.bias"],
        [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32)],
    )


# Node -> (cluster it chose, its trained model, its number of examples).
REPLIES = {
    1: (0, _model(1), 10),
    2: (0, _model(2), 30),
    3: (1, _model(3), 20),
    4: (1, _model(4), 20),
}


def _train_round(strategy: IFCA, grid: StubGrid) -> ArrayRecord:
    """One IFCA round in which every node answers with its fixed reply."""
    replies = []
    for request in strategy.configure_train(1, _model(0), ConfigRecord(), grid):  # type: ignore[arg-type]
        cluster, model, examples = REPLIES[request.metadata.dst_node_id]
        metrics = MetricRecord(
            {p.M_NUM_EXAMPLES: examples, p.M_TRAIN_LOSS: 0.5, p.M_CLUSTER: cluster}
        )
        replies.append(Message(RecordDict({p.ARRAYS: model, p.METRICS: metrics}), reply_to=request))
    packed, _ = strategy.aggregate_train(1, replies)
    assert packed is not None
    return packed


def _aggregate(strategy: IFCA, grid: StubGrid) -> list[list[np.ndarray]]:
    """The cluster models (as numpy) after one round on the fixed replies."""
    return [p.record_to_numpy(m) for m in p.unpack_clusters(_train_round(strategy, grid))]


def test_awcfl_beta_zero_is_exactly_plain_aggregation(server_identity: None) -> None:
    grid = StubGrid([1, 2, 3, 4])
    plain = _aggregate(IFCA(num_clusters=2, restarts=1, init="random"), grid)
    beta0 = _aggregate(IFCA(num_clusters=2, restarts=1, init="random", awcfl_beta=0.0), grid)
    beta_half = _aggregate(IFCA(num_clusters=2, restarts=1, init="random", awcfl_beta=0.5), grid)
    means = []
    for members in ((1, 2), (3, 4)):
        weights = np.array([REPLIES[n][2] for n in members], dtype=np.float64)
        layers = [p.record_to_numpy(REPLIES[n][1]) for n in members]
        means.append(
            [
                sum(w * lay[i] for w, lay in zip(weights, layers, strict=True)) / weights.sum()
                for i in range(2)
            ]
        )
    for j in range(2):
        for layer in range(2):
            assert np.array_equal(beta0[j][layer], plain[j][layer])
            np.testing.assert_allclose(plain[j][layer], means[j][layer], rtol=1e-6)
            # Two clusters: beta/(n-1) = 0.5 of the other cluster's mean, 0.5 of its own.
            np.testing.assert_allclose(
                beta_half[j][layer], 0.5 * means[j][layer] + 0.5 * means[1 - j][layer], rtol=1e-6
            )


def test_mcfl_sends_member_feature_means_at_evaluation(server_identity: None) -> None:
    features = {1: [0.0, 2.0], 2: [2.0, 4.0], 3: [10.0, 0.0], 4: [12.0, 2.0]}
    grid = StubGrid([1, 2, 3, 4], features)
    strategy = IFCA(num_clusters=2, restarts=1, init="random", mcfl=True, mcfl_feature_samples=5)
    strategy.collect_features(grid, grid.nodes)  # type: ignore[arg-type]
    packed = _train_round(strategy, grid)
    messages = list(strategy.configure_evaluate(1, packed, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert len(messages) == 4
    for msg in messages:
        config = msg.content.config_records[p.CONFIG]
        assert list(config[p.CFG_MCFL_CLUSTERS]) == [0, 1]  # type: ignore[arg-type]
        assert list(config[p.CFG_MCFL_FEATURES]) == [1.0, 3.0, 11.0, 1.0]  # type: ignore[arg-type]
        assert p.CLUSTERS in msg.content.array_records  # every node gets every model


@pytest.mark.parametrize(("preset", "samples"), [("robust", None), ("paper", 5)])
def test_paper_mcfl_chooses_by_n_sampled_test_inputs(
    server_identity: None, preset: str, samples: int | None,
) -> None:
    grid = StubGrid([1, 2, 3, 4], {1: [0.0], 2: [2.0], 3: [10.0], 4: [12.0]})
    strategy = IFCA(num_clusters=2, restarts=1, init="random", mcfl=True,
                    mcfl_feature_samples=5, preset=preset)
    strategy.collect_features(grid, grid.nodes)  # type: ignore[arg-type]
    packed = _train_round(strategy, grid)
    messages = strategy.configure_evaluate(1, packed, ConfigRecord(), grid)  # type: ignore[arg-type]
    # The client averages this many sampled test inputs (fl_clusters/client/choice.py);
    # without it, all of them.
    assert {msg.content.config_records[p.CONFIG].get(p.CFG_NUM_SAMPLES)
            for msg in messages} == {samples}


class _Inputs:
    """A learner whose test split is 100 inputs; it records how many it averaged."""

    averaged: list[int]

    def num_examples(self, split: str = "train") -> int:
        return 100

    def feature_mean(self, split: str, num_samples: int, seed: int = 0) -> np.ndarray:
        self.averaged.append(num_samples)
        return np.zeros(1)


@pytest.mark.parametrize(("config", "averaged"), [({}, 100), ({p.CFG_NUM_SAMPLES: 5}, 5)])
def test_an_mcfl_client_averages_the_inputs_the_server_names(
    config: dict[str, int], averaged: int,
) -> None:
    learner = _Inputs()
    learner.averaged = []
    choice = mcfl_choice(learner, 2, ConfigRecord({  # type: ignore[arg-type]
        p.CFG_MCFL_CLUSTERS: [0, 1], p.CFG_MCFL_FEATURES: [3.0, 0.5], **config}), "test")
    assert (choice, learner.averaged) == (1, [averaged])


def test_mcfl_rejects_features_of_the_wrong_length(server_identity: None) -> None:
    grid = StubGrid([1, 2], {1: [0.0, 1.0], 2: [0.0, 1.0, 2.0]})
    strategy = IFCA(num_clusters=2, restarts=1, init="random", mcfl=True)
    strategy.collect_features(grid, grid.nodes)  # type: ignore[arg-type]
    assert sorted(strategy.node_features) == [1]
    assert strategy.rejected_replies == 1


def test_mcfl_and_density_scores_on_planted_reports() -> None:
    # Four nodes in two groups; cluster 0 is perfect on group 0, cluster 1 on group 1.
    rows = [
        {"node-id": n, "true-cluster": g, "assigned": g, "test-accuracy": acc,
         "test-feature-mean": feat}
        for n, g, acc, feat in (
            (1, 0, [1.0, 0.2], [0.0]), (2, 0, [0.8, 0.0], [0.2]),
            (3, 1, [0.0, 1.0], [5.0]), (4, 1, [0.4, 0.6], [4.0]),
        )
    ]
    scores = mcfl_scores(rows, np.array([[0.1], [4.5]]))
    assert scores["mcfl_choice_accuracy"] == 1.0
    assert scores["intra_cluster_accuracy"] == pytest.approx(0.85)
    assert scores["inter_cluster_accuracy"] == pytest.approx(0.85)  # right model everywhere
    assert scores["assigned_inter_cluster_accuracy"] == pytest.approx(0.15)
    noisy = [{**r, "noisy": int(r["node-id"] == 4)} for r in rows]
    dbscan = density_clustering_scores(noisy, {"1": 0, "2": 0, "3": 1, "4": -1})
    assert dbscan["ari"] == 1.0 and dbscan["num_clusters_found"] == 2
    assert dbscan["noisy_clients_flagged"] == 1 and dbscan["clean_clients_flagged"] == 0


def _filled(value: float) -> ArrayRecord:
    return p.numpy_to_record(["w"], [np.full(3, value, np.float32)])


def _trained(node: int, value: float, examples: int = 10) -> Message:
    request = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
    metrics = MetricRecord({p.M_NUM_EXAMPLES: examples, p.M_TRAIN_LOSS: 0.5})
    return Message(RecordDict({p.ARRAYS: _filled(value), p.METRICS: metrics}), reply_to=request)


@pytest.mark.usefixtures("server_identity")
def test_awcfl_leaves_a_cluster_without_members_out_of_the_mix() -> None:
    cfl = CFL(awcfl_beta=0.5)
    old = [_filled(0.0), _filled(10.0), _filled(100.0)]
    # Clusters 0 and 1 aggregate members this round; cluster 2 has none.
    groups = {0: [_trained(1, 2.0)], 1: [_trained(2, 4.0)]}
    packed, _ = cfl.aggregate_clusters(1, old, groups)
    models = [m["w"].numpy() for m in p.unpack_clusters(packed)]
    # beta/(n-1) * others + (1 - beta) * own, over the two clusters that aggregated.
    np.testing.assert_allclose(models[0], 0.5 * 4.0 + 0.5 * 2.0)
    np.testing.assert_allclose(models[1], 0.5 * 2.0 + 0.5 * 4.0)
    # The idle cluster keeps its model instead of moving to the others' mean
    # (the old mix gave 0.25 * (2 + 4) + 0.5 * 100 = 51.5).
    np.testing.assert_allclose(models[2], 100.0)


@pytest.mark.usefixtures("server_identity")
def test_paper_awcfl_mixes_the_plain_mean_of_a_clusters_members() -> None:
    old = [_filled(0.0), _filled(0.0)]
    groups = {0: [_trained(1, 0.0, examples=10), _trained(2, 4.0, examples=30)],
              1: [_trained(3, 8.0)]}
    models = {preset: [m["w"].numpy()[0] for m in p.unpack_clusters(
        CFL(awcfl_beta=0.5, preset=preset).aggregate_clusters(1, old, groups)[0])]
        for preset in ("robust", "paper")}
    # Own term: example-weighted (0 x 10 + 4 x 30) / 40 = 3, or the paper's plain mean 2;
    # then 0.5 x the other cluster (8) + 0.5 x the own term.
    np.testing.assert_allclose(models["robust"][0], 4.0 + 1.5)
    np.testing.assert_allclose(models["paper"][0], 4.0 + 1.0)
    # Without mixing, a cluster averages as FedAvg does under either preset.
    plain = CFL(preset="paper").aggregate_clusters(1, old, groups)[0]
    np.testing.assert_allclose(p.unpack_clusters(plain)[0]["w"].numpy()[0], 3.0)


@pytest.mark.usefixtures("server_identity")
def test_awcfl_with_every_cluster_active_is_the_papers_mix() -> None:
    cfl = CFL(awcfl_beta=0.5)
    mixed = cfl.mix_clusters([_filled(0.0), _filled(2.0), _filled(4.0)])
    np.testing.assert_allclose(
        [m["w"].numpy()[0] for m in mixed], [0.25 * 6 + 0.0, 0.25 * 4 + 1.0, 0.25 * 2 + 2.0]
    )


def test_awcfl_raises_inter_cluster_accuracy_and_mcfl_picks_the_right_model(federation) -> None:
    plain = federation({**ACFL_ROTATION_COPIES, "mcfl": True})
    # MCFL changes only which model is used at inference, so the same run also
    # scores the models without it (assigned_*: each client keeps its own cluster).
    assert plain["ari"] >= 0.9, plain
    assert plain["mcfl_choice_accuracy"] >= 0.95
    assert plain["inter_cluster_accuracy"] > plain["assigned_inter_cluster_accuracy"] + 0.2
    assert abs(
        plain["intra_cluster_accuracy"] - plain["assigned_intra_cluster_accuracy"]
    ) <= 0.02
    mixed = federation({**ACFL_ROTATION_COPIES, "awcfl-beta": 0.5})
    assert mixed["inter_cluster_accuracy"] > plain["assigned_inter_cluster_accuracy"], (
        mixed["inter_cluster_accuracy"],
        plain["assigned_inter_cluster_accuracy"],
    )
