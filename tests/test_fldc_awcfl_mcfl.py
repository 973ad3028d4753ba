"""FLDC, AWCFL and MCFL: unit checks of the glue, then real Flower simulations on digits."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.config import parse_run_config
from fl_clusters.metrics import density_clustering_scores, mcfl_scores
from fl_clusters.strategies import FLDC, IFCA
from fl_clusters.strategies.registry import build_strategy

ROTATION = {"cluster-structure": "rotation", "num-clusters": 4}
# MCFL picks a model by the mean of a client's test inputs. With a plain split each
# client holds ~18 test digits, and in about 1 run in 4 one of the 20 means lands
# nearer another rotation's feature (benchmarks/mcfl_choice.py); that one client
# then costs ~2.5 points of intra-cluster accuracy, beyond the 2-point bar.
# A copy of the data per group (~72 test digits per client) errs in 1 draw of 900.
# ACFL clusters those copies (ARI 1.0 in every run measured); IFCA at seed 0 merged
# the 0 and 180 degree copies (ARI 0.68).
ACFL_ROTATION_COPIES = {**ROTATION, "copy-per-group": True, "strategy": "acfl", "num-rounds": 10}


@pytest.fixture
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run identity Flower gives a ServerApp process; Message() needs it."""
    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


class StubGrid:
    """Just enough of a Grid for configure_* calls: fixed nodes, canned query replies."""

    def __init__(self, nodes: list[int], features: dict[int, list[float]] | None = None) -> None:
        self.nodes = nodes
        self.features = features or {}
        self._pushed: list[Message] = []  # pushed, reply not pulled yet
        self._ids = itertools.count()

    def get_node_ids(self) -> list[int]:
        return self.nodes

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        # What a grid does on push: give every message a new id (MeteredGrid pulls by id)
        # and keep it until its reply is pulled.
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            self._pushed.append(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        wanted = set(message_ids)
        pushed = [msg for msg in self._pushed if msg.metadata.message_id in wanted]
        self._pushed = [msg for msg in self._pushed if msg not in pushed]
        return self.send_and_receive(pushed) if pushed else []

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            if msg.metadata.message_type == p.QUERY_IDENTITY:
                # Keys in the reverse order of the ids: ordering must follow the keys.
                key = 1000 - msg.metadata.dst_node_id
                replies.append(Message(RecordDict({p.METRICS: MetricRecord(
                    {p.M_NODE_KEY: key})}), reply_to=msg))
                continue
            assert msg.metadata.message_type == p.QUERY_FEATURES
            metrics = MetricRecord(
                {
                    p.M_FEATURE_MEAN: self.features[msg.metadata.dst_node_id],
                    p.M_NUM_EXAMPLES: 10,
                }
            )
            replies.append(Message(RecordDict({p.METRICS: metrics}), reply_to=msg))
        return replies


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


def test_fldc_builder_and_bad_settings() -> None:
    settings = {**parse_run_config({"strategy": "fldc"}), "min-available-nodes": 8}
    fldc = build_strategy(settings)
    assert isinstance(fldc, FLDC) and fldc.eps is None and fldc.min_pts == 4
    fixed = build_strategy({**settings, "fldc-eps": 1.5})
    assert isinstance(fixed, FLDC) and fixed.eps == 1.5
    with pytest.raises(ValueError, match="fldc-r"):
        build_strategy({**settings, "fldc-r": 0.0})
    with pytest.raises(ValueError, match="fldc-min-pts"):
        build_strategy({**settings, "fldc-min-pts": 1})
    ifca = build_strategy({**settings, "strategy": "ifca", "mcfl": True, "awcfl-beta": 0.5})
    assert isinstance(ifca, IFCA) and ifca.mcfl and ifca.awcfl_beta == 0.5


# ------------------------------------------------------------ real federations
def test_fldc_separates_rotations_and_flags_randomized_clients(federation) -> None:
    summary = federation(
        {**ROTATION, "strategy": "fldc", "noisy-clients": 2, "num-rounds": 3}
    )
    assert summary["ari"] >= 0.9, summary
    assert summary["num_clusters_found"] == 4
    assert summary["noisy_clients_flagged"] == 2  # the two randomized clients are noise
    assert summary["num_noise_clients"] <= 3
    assert summary["eps"] > 0 and summary["silhouette"] > 0
    assert (summary["_folder"] / "k_distance.png").stat().st_size > 0
    rounds = [
        json.loads(line)
        for line in (summary["_folder"] / "rounds.jsonl").read_text().splitlines()
    ]
    # Round 0 averages every clustered client; later rounds draw max(round(0.2|T|), 1)
    # = 1 client from each of the 4 clusters, never a noise client.
    assert rounds[0]["train"]["num-trained"] == 20 - summary["num_noise_clients"]
    assert [r["train"]["num-trained"] for r in rounds[1:]] == [4, 4]


@pytest.mark.slow
def test_fldc_keeps_up_with_fedavg_under_label_skew(federation) -> None:
    """FLDC's global model against FedAvg's after the same 20 rounds, Dirichlet(0.3).

    Same participation per round after FLDC's round 0: FedAvg draws half the
    clients, FLDC half of every DBSCAN cluster. With 20 digits clients under this
    skew DBSCAN finds one dense cluster, so FLDC is FedAvg with a full round 0 and
    its noise clients left out, and the honest claim is a tie. Half, not the
    paper's 20%: with 4 clients a round the final model swings with the last draw
    (paired sd 0.05-0.12 over seeds), and one CI run lost 0.14 at a single seed.
    Measured through Flower, seeds 0-9: FLDC 0.881 +- 0.052, FedAvg 0.894 +- 0.016,
    paired difference -0.013 +- 0.044 (sd); 9 seeds within 0.03, and seed 5 at
    -0.131, where DBSCAN declared 4 honest clients noise and FLDC never trained
    them. Over 4 seeds the mean difference has a standard error of ~0.022, so the
    -0.10 tolerance needs three such seeds out of four to fail, and still catches
    an FLDC that loses 10 points.
    """
    skew = {"cluster-structure": "none", "dirichlet-alpha": 0.3, "num-rounds": 20}
    fldc_accuracy, gaps = [], []
    for seed in (0, 1, 2, 3):
        fldc = federation({**skew, "seed": seed, "strategy": "fldc", "fldc-r": 0.5})
        fedavg = federation({**skew, "seed": seed, "strategy": "fedavg", "fraction-train": 0.5})
        fldc_accuracy.append(fldc["personalized_accuracy"])
        gaps.append(fldc["personalized_accuracy"] - fedavg["personalized_accuracy"])
    assert np.mean(fldc_accuracy) >= 0.8, fldc_accuracy
    assert np.mean(gaps) >= -0.10, gaps


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
