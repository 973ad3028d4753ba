"""FLDC: eps by the knee or the silhouette, its run-config keys, then real federations."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from sklearn.metrics import adjusted_rand_score

from fl_clusters import protocol as p
from fl_clusters.clustering import DensityClustering, silhouette_eps
from fl_clusters.config import parse_run_config
from fl_clusters.strategies import FLDC, IFCA
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import StubGrid, train_reply


def _blobs() -> np.ndarray:
    """Three tight groups of 8 points, 5 apart, plus two stragglers."""
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [5.0, 0.0], [2.5, 4.33]])
    groups = [c + rng.normal(scale=0.2, size=(8, 2)) for c in centres]
    return np.vstack([*groups, [[15.0, 15.0], [-12.0, 8.0]]])


def test_silhouette_eps_picks_the_grid_value_with_the_best_score() -> None:
    points = _blobs()
    candidates = np.array([0.05, 0.2, 1.0, 40.0])
    eps, scores = silhouette_eps(points, 4, candidates)
    # 0.05: every point noise; 40: one cluster; both have no score.
    assert np.isnan(scores[0]) and np.isnan(scores[3])
    # 0.2 calls 12 of the 26 points noise; 1.0 keeps the three groups whole.
    assert eps == 1.0 and scores[2] > scores[1]
    assert silhouette_eps(points, 4, np.array([0.01, 100.0])) == (None, pytest.approx(
        np.array([np.nan, np.nan]), nan_ok=True))
    with pytest.raises(ValueError, match="candidates"):
        silhouette_eps(points, 4, np.array([0.0, 1.0]))


def test_density_clustering_by_silhouette_finds_the_three_groups() -> None:
    fitted = DensityClustering(min_samples=4, eps_method="silhouette").fit(_blobs())
    assert fitted.num_clusters_ == 3 and fitted.num_noise_ == 2
    assert fitted.eps_scores_.size > 1
    assert fitted.silhouette_ * (1 - 2 / 26) == pytest.approx(np.nanmax(fitted.eps_scores_))
    with pytest.raises(ValueError, match="eps_method"):
        DensityClustering(eps_method="elbow")


def test_fldc_eps_method_comes_from_the_run_config_and_bad_values_are_named() -> None:
    settings = parse_run_config({"strategy": "fldc", "fldc-eps-method": "silhouette"})
    fldc = build_strategy({**settings, "min-nodes": 4})
    assert isinstance(fldc, FLDC) and fldc.eps_method == "silhouette"
    with pytest.raises(ValueError, match="fldc-eps-method"):
        parse_run_config({"fldc-eps-method": "elbow"})
    with pytest.raises(ValueError, match="eps_method must be one of 'knee', 'silhouette'"):
        FLDC(eps_method="elbow")


def test_fldc_r_zero_is_refused_by_the_run_config_not_later() -> None:
    with pytest.raises(ValueError, match=r"'fldc-r' must be a number in \(0, 1\]; got 0\.0 "):
        parse_run_config({"fldc-r": 0.0})
    assert parse_run_config({"fldc-r": 1.0})["fldc-r"] == 1.0


ROTATION = {"cluster-structure": "rotation", "num-clusters": 4}


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


def _round0_model(preset: str) -> ArrayRecord:
    """FLDC's global model after round 0, four nodes in two groups of two."""
    def filled(value: float) -> ArrayRecord:
        return p.numpy_to_record(["w"], [np.full(2, value, np.float32)])

    trained = {1: 0.0, 2: 0.1, 3: 5.0, 4: 5.1}
    fldc = FLDC(min_pts=2, eps=1.0, preset=preset)
    requests = fldc.configure_train(1, filled(0.0), ConfigRecord(), StubGrid([1, 2, 3, 4]))  # type: ignore[arg-type]
    replies = [train_reply(request, filled(trained[request.metadata.dst_node_id]), 10, None)
               for request in requests]
    model, _ = fldc.aggregate_train(1, replies)
    assert fldc.clustering is not None and fldc.clustering.num_clusters_ == 2
    assert model is not None
    return model


@pytest.mark.usefixtures("server_identity")
def test_paper_fldc_round_0_only_clusters() -> None:
    # Robust: the round-0 models' average; the paper's Algorithm 1: the initial model.
    np.testing.assert_allclose(_round0_model("robust")["w"].numpy(), 2.55)
    np.testing.assert_allclose(_round0_model("paper")["w"].numpy(), 0.0)


def _round0_labels(preset: str) -> tuple[list[int], list[int]]:
    """FLDC's DBSCAN labels of 12 round-0 models in two groups of 6, and the groups.

    Like a trained network's: 300 weights that moved a little, alike within a group,
    and 4 output biases that moved far, each node its own way.
    """
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1], 6)
    weights = np.where(groups[:, None] == 0, -0.05, 0.05) + rng.normal(scale=0.02,
                                                                        size=(12, 300))
    biases = rng.normal(scale=1.0, size=(12, 4))
    start = p.numpy_to_record(["w", "b"], [np.zeros(300, np.float32), np.zeros(4, np.float32)])
    fldc = FLDC(preset=preset)
    nodes = list(range(1, 13))
    requests = fldc.configure_train(1, start, ConfigRecord(), StubGrid(nodes))  # type: ignore[arg-type]
    replies = []
    for request in requests:
        i = request.metadata.dst_node_id - 1
        trained = p.numpy_to_record(["w", "b"], [weights[i].astype(np.float32),
                                                 biases[i].astype(np.float32)])
        replies.append(train_reply(request, trained, 10, None))
    fldc.aggregate_train(1, replies)
    return [fldc.labels[node] for node in nodes], groups.tolist()


@pytest.mark.usefixtures("server_identity")
def test_fldc_standardizes_parameters_so_a_few_far_moving_ones_do_not_hide_the_groups() -> None:
    # Unscaled (the paper's distance), the biases decide every distance: no groups.
    labels, groups = _round0_labels("paper")
    assert adjusted_rand_score(groups, labels) < 0.5, labels
    labels, groups = _round0_labels("robust")
    assert adjusted_rand_score(groups, labels) == 1.0, labels


@pytest.mark.usefixtures("server_identity")
def test_fldc_says_at_its_start_it_trains_one_model_and_how_many_groups_dbscan_can_tell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 9 nodes in 3 groups of 3 is above 2 * min_pts yet below what MinPts 4 can split:
    # the start says at most 2 clusters, and that none gets a model of its own.
    with caplog.at_level(logging.WARNING):
        FLDC().prepare(StubGrid(list(range(1, 10))), 60.0, 10)  # type: ignore[arg-type]
    assert "FLDC trains one global model for all nodes" in caplog.text
    assert "at most 2 with 9 nodes and min_pts=4, each of at least 4 nodes" in caplog.text


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
