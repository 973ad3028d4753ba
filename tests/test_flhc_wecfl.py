"""FL+HC and WeCFL (issue 17): their clustering math, their glue, and real federations.

The federations use each strategy's DEFAULT settings; only data, structure and
rounds change. Bounds are what held, with margin, in every measured run
(docs/clustering-defaults.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from sklearn.metrics import adjusted_rand_score

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    UpdateHierarchy,
    initial_kmeans,
    median_nearest_distance,
    weighted_kmeans,
)
from fl_clusters.clustering.kmeans_models import match_to_previous, recluster_kmeans
from fl_clusters.config import parse_run_config
from fl_clusters.data import FASHION_MNIST_ROOT
from fl_clusters.strategies import FLHC, WeCFL
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import NodesOnly

needs_fashion = pytest.mark.skipif(
    not Path(FASHION_MNIST_ROOT).is_dir(),
    reason=f"{FASHION_MNIST_ROOT} absent: apt-get install -y dataset-fashion-mnist",
)


def _groups(num_groups: int, per_group: int, dim: int, spread: float, scale: float,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points around ``num_groups`` random directions, all scaled by ``scale``."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(num_groups, dim))
    truth = np.repeat(np.arange(num_groups), per_group)
    points = centers[truth] + spread * rng.normal(size=(truth.size, dim))
    return scale * points, truth


# ---------------------------------------------------------------- math: FL+HC
@pytest.mark.parametrize("threshold", ["gap", "relative"])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_scale_free_cuts_find_the_groups_at_any_scale(threshold: str, scale: float) -> None:
    points, truth = _groups(4, 5, 50, spread=0.2, scale=scale)
    hierarchy = UpdateHierarchy(threshold=threshold).fit(points)
    assert adjusted_rand_score(truth, hierarchy.labels_) == 1.0
    assert hierarchy.num_clusters_ == 4
    if threshold == "relative":
        assert hierarchy.threshold_ == pytest.approx(2.5 * hierarchy.nearest_distance_)
    else:
        assert hierarchy.max_gap_ >= 1.6


@pytest.mark.parametrize("threshold", ["gap", "relative"])
def test_scale_free_cuts_keep_one_distribution_together(threshold: str) -> None:
    points = np.random.default_rng(1).normal(size=(20, 200))
    hierarchy = UpdateHierarchy(threshold=threshold).fit(points)
    assert hierarchy.num_clusters_ == 1
    assert hierarchy.labels_.tolist() == [0] * 20


@pytest.mark.parametrize("seed", range(3))
def test_gap_cut_splits_small_noisy_groups_that_the_relative_cut_merges(seed: int) -> None:
    """Two groups of 3 whose members lie 2/3 as far apart as the groups do.

    The plug-in example's CNN updates look like this (distances ~4 within its
    two groups of 3 clients, ~6.2 across): 2.5 x the nearest distance lies above
    the last merge, while the jump to that merge is ~2x.
    """
    rng = np.random.default_rng(seed)
    truth = np.repeat([0, 1], 3)
    points = 0.55 * rng.normal(size=(2, 500))[truth] + 0.5 * rng.normal(size=(6, 500))
    assert UpdateHierarchy(threshold="relative").fit(points).num_clusters_ == 1
    gap = UpdateHierarchy().fit(points)
    assert adjusted_rand_score(truth, gap.labels_) == 1.0


def test_absolute_cut_depends_on_the_scale() -> None:
    """The paper's absolute threshold: right for one scale, wrong for another."""
    points, truth = _groups(4, 5, 50, spread=0.2, scale=1.0)
    hierarchy = UpdateHierarchy(threshold="absolute", distance_threshold=5.0)
    assert adjusted_rand_score(truth, hierarchy.fit_predict(points)) == 1.0
    assert hierarchy.fit(points * 100).num_clusters_ == 20  # every update its own cluster
    assert hierarchy.fit(points / 100).num_clusters_ == 1


@pytest.mark.parametrize(
    ("linkage", "metric"),
    [("average", "cosine"), ("complete", "manhattan"), ("single", "euclidean")],
)
def test_other_linkages_and_metrics_find_the_groups(linkage: str, metric: str) -> None:
    points, truth = _groups(3, 6, 40, spread=0.15, scale=1.0, seed=2)
    labels = UpdateHierarchy(linkage, metric).fit_predict(points)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_labels_are_numbered_in_order_of_first_appearance() -> None:
    points, _ = _groups(3, 4, 30, spread=0.1, scale=1.0, seed=3)
    labels = UpdateHierarchy().fit_predict(points[::-1])
    first = [labels[np.flatnonzero(labels == j)[0]] for j in np.unique(labels)]
    assert list(dict.fromkeys(labels.tolist())) == [0, 1, 2] and sorted(first) == [0, 1, 2]


def test_edge_cases_of_the_hierarchy() -> None:
    assert UpdateHierarchy().fit(np.ones((1, 5))).labels_.tolist() == [0]
    assert UpdateHierarchy().fit(np.eye(2)).num_clusters_ == 1  # no jump to judge
    # Identical pairs count once: three equidistant updates, no group structure
    # (before copies were collapsed, only the twins merged: 3 clusters).
    twins = np.repeat(np.eye(3), 2, axis=0)
    hierarchy = UpdateHierarchy().fit(twins)
    assert hierarchy.labels_.tolist() == [0] * 6 and hierarchy.num_distinct_ == 3
    assert UpdateHierarchy(threshold="relative").fit_predict(twins).tolist() == [0] * 6
    # A cut below every distance keeps the distinct updates apart; copies follow.
    absolute = UpdateHierarchy(threshold="absolute", distance_threshold=0.5)
    assert absolute.fit_predict(twins).tolist() == [0, 0, 1, 1, 2, 2]
    assert UpdateHierarchy().fit(np.ones((4, 3))).labels_.tolist() == [0] * 4
    assert median_nearest_distance(np.array([[0.0, 0.0], [3.0, 4.0], [3.0, 5.0]])) == 1.0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: UpdateHierarchy(linkage="centroid"), "linkage must be one of 'ward', "),
        (lambda: UpdateHierarchy(metric="l3"), "metric must be one of .*; got 'l3'"),
        (lambda: UpdateHierarchy("ward", "cosine"),
         "metric must be 'euclidean' with linkage='ward'"),
        (lambda: UpdateHierarchy(threshold="knee"), "threshold must be one of .*; got 'knee'"),
        (lambda: UpdateHierarchy(min_gap=1.0), "min_gap must be a number > 1; got 1.0"),
        (lambda: UpdateHierarchy(distance_ratio=0.0), "distance_ratio must be a number > 0"),
        (lambda: UpdateHierarchy(distance_threshold=-1.0),
         "distance_threshold must be a number > 0; got -1.0"),
        (lambda: UpdateHierarchy().fit(np.full((3, 2), np.nan)), "finite"),
        (lambda: UpdateHierarchy("average", "cosine").fit(np.zeros((3, 2))), "zero row"),
        (lambda: FLHC(warmup_rounds=-1), "warmup_rounds must be an int >= 0; got -1"),
        (lambda: FLHC(linkage="ward", metric="manhattan"), "metric must be 'euclidean' with"),
        (lambda: build_strategy({**parse_run_config({
            "strategy": "flhc", "flhc-linkage": "ward", "flhc-metric": "manhattan"})}),
         "run-config key 'flhc-metric' must be 'euclidean' with linkage='ward'"),
        (lambda: WeCFL(num_clusters=0), "num_clusters must be an int >= 1; got 0"),
        (lambda: WeCFL(num_clusters=2, n_init=0), "n_init must be an int >= 1; got 0"),
        (lambda: initial_kmeans(np.zeros((2, 3)), np.ones(2), 3), "num_clusters=3"),
        (lambda: initial_kmeans(np.zeros((2, 3)), np.array([1.0, 0.0]), 1), "weights"),
        (lambda: weighted_kmeans(np.zeros((2, 3)), np.ones(2), np.zeros((2, 4))), "centers"),
    ],
)
def test_bad_parameters_are_named(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


# --------------------------------------------------------------- math: WeCFL
def test_first_kmeans_finds_the_groups_weighted() -> None:
    points, truth = _groups(4, 5, 100, spread=0.3, scale=0.01, seed=4)
    labels = initial_kmeans(points, np.arange(1, 21, dtype=float), 4)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_weights_pull_the_centre_to_the_larger_client() -> None:
    points = np.array([[0.0], [1.0], [10.0]])
    labels, centers = weighted_kmeans(points, np.array([3.0, 1.0, 1.0]), np.array([[0.5], [9.0]]))
    assert labels.tolist() == [0, 0, 1]
    assert centers[:, 0].tolist() == [0.25, 10.0]


def test_kmeans_from_the_cluster_models_keeps_their_numbering_and_empty_clusters() -> None:
    """Started from the current models, cluster j stays j; a cluster nobody chose keeps its centre.

    sklearn's KMeans would re-seed the empty cluster on a far point (here client 3).
    """
    centers = np.array([[10.0, 0.0], [0.0, 10.0], [-10.0, -10.0]])
    points = np.array([[0.0, 9.0], [1.0, 11.0], [9.0, 1.0], [12.0, 0.0]])
    labels, new = weighted_kmeans(points, np.ones(4), centers)
    assert labels.tolist() == [1, 1, 0, 0]
    assert new[2].tolist() == [-10.0, -10.0]
    assert new[0].tolist() == [10.5, 0.5]


# ------------------------------------------------------------------ glue, no Ray
START = p.numpy_to_record(["w"], [np.zeros(6, np.float32)])


def _round(strategy, server_round: int, arrays: ArrayRecord, grid: NodesOnly,
           direction: dict[int, int]) -> tuple[list[Message], ArrayRecord]:
    """Node n answers with its start model + a step along axis ``direction[n]`` (+ noise).

    Nodes missing from ``direction`` do not answer; an unassigned node trains cluster 0.
    """
    requests = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
    replies = []
    for request in requests:
        node = request.metadata.dst_node_id
        if node not in direction:
            continue
        records = request.content.array_records
        start = records[p.ARRAYS] if p.ARRAYS in records else p.unpack_clusters(
            records[p.CLUSTERS])[0]
        step = np.eye(6)[direction[node]] + np.random.default_rng(node).normal(scale=0.05, size=6)
        model = p.numpy_to_record(["w"], [(start["w"].numpy() + step).astype(np.float32)])
        metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5, p.M_CLUSTER: 0})
        replies.append(Message(RecordDict({p.ARRAYS: model, p.METRICS: metrics}),
                               reply_to=request))
    packed, _ = strategy.aggregate_train(server_round, replies)
    return requests, packed


def test_flhc_clusters_once_after_warmup_and_late_nodes_choose(server_identity) -> None:
    nodes = list(range(1, 10))
    grid = NodesOnly(nodes)
    flhc = FLHC(warmup_rounds=1, min_available_nodes=9)
    groups = {n: (n - 1) % 3 for n in nodes}
    _, packed = _round(flhc, 1, START, grid, groups)
    assert p.num_packed_clusters(packed) == 1 and flhc.assignments == {}  # FedAvg warm-up
    _, packed = _round(flhc, 2, packed, grid, {n: g for n, g in groups.items() if n != 9})
    assert flhc.clustering_round == 2 and p.num_packed_clusters(packed) == 3
    truth = [groups[n] for n in range(1, 9)]
    assert adjusted_rand_score(truth, [flhc.assignments[n] for n in range(1, 9)]) == 1.0
    assert flhc.assignment_for(9) is None  # it missed the clustering round
    # Later rounds never cluster again. Node 9, never clustered, is asked to train
    # once to be placed by its update (tests/test_late_joiners.py); silent here, it
    # gets every model and chooses by loss.
    from tests.conftest import SilentNodes

    silent = SilentNodes(nodes)
    requests, packed = _round(flhc, 3, packed, silent, dict.fromkeys(nodes, 5))
    assert silent.placements == [9]
    by_node = {r.metadata.dst_node_id: r.content.array_records for r in requests}
    assert p.CLUSTERS in by_node[9] and p.ARRAYS in by_node[1]
    assert flhc.clustering_round == 2 and p.num_packed_clusters(packed) == 3
    assert flhc.assignment_for(9) == 0  # placed by its reported (lowest-loss) choice
    fields = flhc.summary_fields()
    assert fields["clustering_round"] == 2 and fields["num_clusters_found"] == 3
    assert fields["max_merge_gap"] >= 1.6 and fields["distance_threshold"] > 0


def test_wecfl_keeps_cluster_numbers_and_unsampled_members(server_identity) -> None:
    nodes = list(range(1, 9))
    grid = NodesOnly(nodes)
    wecfl = WeCFL(num_clusters=2, min_available_nodes=8)
    groups = {n: 0 if n <= 4 else 1 for n in nodes}
    _, packed = _round(wecfl, 1, START, grid, groups)
    assert wecfl.clustering_round == 1 and p.num_packed_clusters(packed) == 2
    first = dict(wecfl.assignments)
    assert adjusted_rand_score(list(groups.values()), [first[n] for n in nodes]) == 1.0
    models = p.unpack_clusters(packed)
    # Round 2: only group 1 trains; group 0's cluster keeps its model and members.
    _, packed = _round(wecfl, 2, packed, grid, {n: g for n, g in groups.items() if g == 1})
    after = p.unpack_clusters(packed)
    kept = first[1]
    np.testing.assert_array_equal(after[kept]["w"].numpy(), models[kept]["w"].numpy())
    assert wecfl.assignments == first
    assert wecfl.reassigned == [0, 0]


def _wecfl_round(wecfl: WeCFL, server_round: int, arrays: ArrayRecord, grid: NodesOnly,
                 target: dict[int, np.ndarray]) -> ArrayRecord:
    """Every node answers with the model ``target[node]`` (its data's optimum) + noise."""
    replies = []
    for request in wecfl.configure_train(server_round, arrays, ConfigRecord(), grid):
        node = request.metadata.dst_node_id
        noise = np.random.default_rng(100 * server_round + node).normal(scale=0.05, size=6)
        model = p.numpy_to_record(["w"], [(target[node] + noise).astype(np.float32)])
        metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5, p.M_CLUSTER: 0})
        replies.append(Message(RecordDict({p.ARRAYS: model, p.METRICS: metrics}),
                               reply_to=request))
    packed, _ = wecfl.aggregate_train(server_round, replies)
    return packed


def test_wecfl_reruns_kmeans_every_round_and_counts_the_nodes_that_move(
    server_identity,
) -> None:
    """Node 4's data change after round 1: its model now lands among group B's.

    Each round's k-means is fresh, and its clusters are matched to the cluster
    models: group A keeps cluster A's number, node 4 is one move.
    """
    nodes = list(range(1, 9))
    grid = NodesOnly(nodes)
    wecfl = WeCFL(num_clusters=2, min_available_nodes=8)
    a, b = 3 * np.eye(6)[0], 3 * np.eye(6)[1]
    target = {n: a if n <= 4 else b for n in nodes}
    packed = _wecfl_round(wecfl, 1, START, grid, target)
    first = dict(wecfl.assignments)
    cluster_a, cluster_b = first[1], first[5]
    assert cluster_a != cluster_b and wecfl.reassigned == [0]
    target[4] = b
    packed = _wecfl_round(wecfl, 2, packed, grid, target)
    assert wecfl.assignments == {n: cluster_a if n <= 3 else cluster_b for n in nodes}
    assert wecfl.reassigned == [0, 1]
    models = p.unpack_clusters(packed)
    np.testing.assert_allclose(models[cluster_b]["w"].numpy(), b, atol=0.1)
    np.testing.assert_allclose(models[cluster_a]["w"].numpy(), a, atol=0.1)
    # Nobody changes again: the matching keeps every number, so nothing counts as a move.
    _wecfl_round(wecfl, 3, packed, grid, target)
    assert wecfl.reassigned == [0, 1, 0]
    assert wecfl.summary_fields()["reassigned_per_round"] == [0, 1, 0]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1], [1, 2, 0]])
def test_fresh_kmeans_is_numbered_as_the_previous_cluster_models(order: list[int]) -> None:
    points, truth = _groups(3, 4, 20, spread=0.05, scale=1.0, seed=5)
    centers = np.stack([points[truth == g].mean(axis=0) for g in range(3)])
    labels = recluster_kmeans(points, np.ones(12), centers[order] + 0.1)
    # Group g sits at previous cluster order.index(g) whatever k-means numbered it.
    assert labels.tolist() == [order.index(g) for g in truth]
    assert match_to_previous(centers[[1, 2, 0]], centers).tolist() == [1, 2, 0]
    # Fewer distinct models than clusters: Lloyd's iterations from the models place them.
    few = recluster_kmeans(points[:2], np.ones(2), centers[order])
    assert few.tolist() == [order.index(0)] * 2


def test_fresh_kmeans_regroups_where_lloyd_from_the_old_models_sticks() -> None:
    """Both groups' models drifted next to old cluster 1: Lloyd's iterations from the
    old models put everyone in cluster 1 and leave cluster 0 empty; a fresh k-means
    separates the two groups (the one nearer old model 0 takes cluster 0)."""
    points = np.array([[9.0], [9.1], [8.9], [11.0], [11.1], [10.9]])
    previous = np.array([[0.0], [10.0]])
    assert weighted_kmeans(points, np.ones(6), previous)[0].tolist() == [1] * 6
    assert recluster_kmeans(points, np.ones(6), previous).tolist() == [0, 0, 0, 1, 1, 1]


def test_run_config_builds_flhc_and_wecfl_with_their_keys() -> None:
    settings = parse_run_config(
        {"strategy": "flhc", "flhc-linkage": "average", "flhc-metric": "cosine",
         "flhc-threshold": "absolute", "flhc-distance-threshold": 0.4, "flhc-warmup-rounds": 2}
    )
    flhc = build_strategy({**settings, "min-nodes": 4})
    assert isinstance(flhc, FLHC) and flhc.warmup_rounds == 2
    h = flhc.hierarchy
    assert (h.linkage, h.metric, h.threshold, h.distance_threshold, h.min_gap) == (
        "average", "cosine", "absolute", 0.4, 1.6)
    settings = parse_run_config({"strategy": "wecfl", "num-clusters": 3, "wecfl-n-init": 4})
    wecfl = build_strategy({**settings, "min-nodes": 4})
    assert isinstance(wecfl, WeCFL) and (wecfl.num_clusters, wecfl.n_init) == (3, 4)
    with pytest.raises(ValueError, match="flhc-distance-ratio"):
        parse_run_config({"flhc-distance-ratio": 0.0})
    with pytest.raises(ValueError, match="flhc-min-gap"):
        parse_run_config({"flhc-min-gap": 1.0})
    with pytest.raises(ValueError, match="flhc-linkage"):
        parse_run_config({"flhc-linkage": "centroid"})


# ------------------------------------------------------------ real federations
FASHION_ROTATION = {"dataset": "fashion-mnist", "cluster-structure": "rotation",
                    "num-clusters": 4}
DIGITS_PERMUTATION = {"cluster-structure": "label-permutation", "num-clusters": 4}


@pytest.mark.slow
@needs_fashion
def test_flhc_defaults_recover_fashion_mnist_rotations(federation) -> None:
    flhc = federation({**FASHION_ROTATION, "strategy": "flhc", "num-rounds": 5})
    assert flhc["clustering_round"] == 4, flhc
    assert flhc["ari"] >= 0.9, flhc
    assert flhc["num_clusters_found"] == 4, flhc


@pytest.mark.slow
@needs_fashion
def test_wecfl_defaults_recover_fashion_mnist_rotations(federation) -> None:
    wecfl = federation({**FASHION_ROTATION, "strategy": "wecfl", "num-rounds": 3})
    assert wecfl["ari"] >= 0.9, wecfl
    assert wecfl["num_clusters_found"] == 4, wecfl


@pytest.mark.slow
def test_flhc_defaults_recover_digits_label_permutations(federation) -> None:
    flhc = federation({**DIGITS_PERMUTATION, "strategy": "flhc", "num-rounds": 6})
    assert flhc["ari"] >= 0.9, flhc
    assert flhc["num_clusters_found"] == 4, flhc


@pytest.mark.slow
def test_wecfl_defaults_recover_digits_label_permutations(federation) -> None:
    wecfl = federation({**DIGITS_PERMUTATION, "strategy": "wecfl", "num-rounds": 6})
    assert wecfl["ari"] >= 0.9, wecfl
    assert wecfl["num_clusters_found"] == 4, wecfl


def test_flhc_says_when_its_cut_keeps_one_cluster(server_identity, caplog) -> None:
    """Issue 45: one cluster from the clustering round is a warning naming the measured
    jump, ``min_gap`` and what to change, never silent; groups found say nothing."""
    nodes = list(range(1, 7))
    flhc = FLHC(warmup_rounds=0, min_available_nodes=6)
    with caplog.at_level("WARNING", logger="flwr"):
        _round(flhc, 1, START, NodesOnly(nodes), dict.fromkeys(nodes, 0))
    assert flhc.hierarchy.num_clusters_ == 1
    said = [r.getMessage() for r in caplog.records if "ONE cluster" in r.getMessage()]
    assert len(said) == 1
    assert f"{flhc.hierarchy.max_gap_:.3g} < min gap 1.6" in said[0]
    assert "local epochs" in said[0] and "flhc-min-gap" in said[0]
    caplog.clear()
    split = FLHC(warmup_rounds=0, min_available_nodes=6)
    with caplog.at_level("WARNING", logger="flwr"):
        _round(split, 1, START, NodesOnly(nodes), {n: n % 2 for n in nodes})
    assert split.hierarchy.num_clusters_ == 2
    assert not [r for r in caplog.records if "ONE cluster" in r.getMessage()]
