"""The clustering math recovers planted structure and follows the papers' equations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, silhouette_score

from fl_clusters.clustering import (
    DensityClustering,
    GreedyIncentiveClustering,
    assign_by_loss,
    bipartition_by_cosine,
    cluster_feature_means,
    cluster_structure_score,
    decide_cfl_split,
    flatten_models,
    group_by_kmeans,
    has_positive_incentive,
    importance_weights,
    incentive,
    incentive_standard_error,
    inter_cluster_mix,
    k_distance_curve,
    knee_eps,
    model_updates,
    nearest_feature,
    order_by_similarity,
    pairwise_cosine,
    sample_per_cluster,
    selection_probabilities,
    should_split,
    stratified_sample,
    update_norms,
    weighted_average,
)


def planted_updates(
    group_sizes: list[int], dim: int = 200, noise: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Updates scattered around one random unit direction per group, and the group labels."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(len(group_sizes), dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    labels = np.repeat(np.arange(len(group_sizes)), group_sizes)
    updates = directions[labels] + noise * rng.normal(size=(labels.size, dim)) / np.sqrt(dim)
    return updates.astype(np.float32), labels


# ---------------------------------------------------------------- similarity
def test_flatten_models_and_updates_are_float32_rows() -> None:
    start = [np.zeros((2, 3)), np.zeros(4)]
    trained = [[np.full((2, 3), i), np.arange(4.0) * i] for i in range(3)]
    flat = flatten_models(trained)
    assert flat.shape == (3, 10) and flat.dtype == np.float32
    np.testing.assert_array_equal(flat[2], [2, 2, 2, 2, 2, 2, 0, 2, 4, 6])
    deltas = model_updates(trained, [np.ones((2, 3)), np.ones(4)])
    np.testing.assert_array_equal(deltas, flat - 1.0)
    assert deltas.dtype == np.float32
    np.testing.assert_array_equal(model_updates(trained, start), flat)


def test_pairwise_cosine_matches_definition_and_zero_rows_give_zero() -> None:
    vectors = np.array([[1.0, 0.0], [1.0, 1.0], [-2.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    similarity = pairwise_cosine(vectors)
    expected = np.array(
        [
            [1.0, np.sqrt(0.5), -1.0, 0.0],
            [np.sqrt(0.5), 1.0, -np.sqrt(0.5), 0.0],
            [-1.0, -np.sqrt(0.5), 1.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    np.testing.assert_allclose(similarity, expected, atol=1e-6)
    assert not np.isnan(similarity).any()


def test_update_norms_use_whole_client_norms_not_coordinates() -> None:
    # Client 0's update has norm 5 but largest coordinate 4: eps2 = 4.5 must fire.
    updates = np.array([[3.0, 4.0], [-3.0, -4.0], [0.0, 1.0]])
    mean_norm, max_norm = update_norms(updates)
    assert mean_norm == pytest.approx(1.0 / 3.0)
    assert max_norm == pytest.approx(5.0)
    assert should_split(mean_norm, max_norm, eps1=0.4, eps2=4.5)


# --------------------------------------------------------------- bipartition
def test_bipartition_recovers_two_planted_groups() -> None:
    updates, truth = planted_updates([7, 5])
    labels, max_cross = bipartition_by_cosine(pairwise_cosine(updates))
    assert set(labels) == {0, 1}
    assert adjusted_rand_score(truth, labels) == 1.0
    # Random directions in 200 dimensions are nearly orthogonal.
    assert max_cross < 0.4


def test_cfl_splits_opposed_groups_when_norms_qualify() -> None:
    # Two groups pulling in opposite directions: the joint model is stationary
    # (small mean update) while every client is far from its own optimum.
    rng = np.random.default_rng(1)
    direction = rng.normal(size=200)
    truth = np.repeat([0, 1], 6)
    signs = np.where(truth == 0, 1.0, -1.0)
    updates = signs[:, None] * direction / np.linalg.norm(direction)
    updates += 0.02 * rng.normal(size=updates.shape)
    decision = decide_cfl_split(updates, eps1=0.4, eps2=0.5, gamma_max=0.0)
    assert decision.split
    assert decision.mean_norm < 0.4 and decision.max_norm > 0.5
    assert decision.max_cross_similarity < 0.0
    assert adjusted_rand_score(truth, decision.labels) == 1.0


def test_cfl_does_not_split_when_gated_by_norms() -> None:
    updates, truth = planted_updates([6, 6])
    updates[truth == 1] *= -1.0
    # Far from a joint stationary point: the mean update is too large.
    far = decide_cfl_split(updates * 10.0, eps1=0.4, eps2=0.5, gamma_max=0.5)
    assert not far.split and far.mean_norm > 0.4
    # Every client already converged: no update is large enough.
    near = decide_cfl_split(updates * 0.01, eps1=0.4, eps2=0.5, gamma_max=0.5)
    assert not near.split and near.max_norm < 0.5
    np.testing.assert_array_equal(near.labels, np.zeros(12))


def test_cross_similarity_threshold_blocks_splitting_one_distribution() -> None:
    updates, _ = planted_updates([12], noise=0.5)
    decision = decide_cfl_split(updates, eps1=10.0, eps2=0.5, gamma_max=0.5)
    assert decision.max_cross_similarity > 0.5
    assert not decision.split
    np.testing.assert_array_equal(decision.labels, np.zeros(12))


@pytest.mark.parametrize("sizes", [[5] * 8, [5] * 4, [10, 6, 3, 1]])
def test_structure_score_sees_tight_groups_whatever_their_number(sizes: list[int]) -> None:
    updates, _ = planted_updates(sizes, noise=1.0)  # within-group cosine ~0.5
    score, num_clusters = cluster_structure_score(pairwise_cosine(updates))
    assert score >= 0.4
    assert num_clusters >= len(sizes) - 1  # a group of one may join another
    # With 8 groups the bipartition's own silhouette is below the bar: each half
    # holds 4 groups, which is why the score searches k.
    if len(sizes) == 8:
        labels, _ = bipartition_by_cosine(pairwise_cosine(updates))
        distance = np.clip(1.0 - pairwise_cosine(updates), 0.0, None)
        np.fill_diagonal(distance, 0.0)
        assert silhouette_score(distance, labels, metric="precomputed") < 0.4


def test_cfl_does_not_cut_one_noisy_distribution_below_the_cross_threshold() -> None:
    # Five clients of one distribution whose updates differ by sample noise
    # (cosine ~0.3): the cross similarity of the best cut falls below 0.45, so
    # the paper's rule splits them; the structure score (~0.05-0.12) does not.
    for seed in range(3):
        updates, _ = planted_updates([5], noise=1.5, seed=seed)
        paper = decide_cfl_split(updates, eps1=10.0, eps2=0.0, gamma_max=0.45)
        guarded = decide_cfl_split(updates, eps1=10.0, eps2=0.0, gamma_max=0.45,
                                   min_structure=0.4)
        assert paper.split and paper.max_cross_similarity < 0.45
        assert not guarded.split and guarded.structure_score < 0.2
        np.testing.assert_array_equal(guarded.labels, np.zeros(5))


def test_structure_score_and_its_threshold_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="N >= 3"):
        cluster_structure_score(np.eye(2))
    with pytest.raises(ValueError, match="max_clusters"):
        cluster_structure_score(np.eye(4), max_clusters=1)
    with pytest.raises(ValueError, match="min_structure"):
        decide_cfl_split(np.ones((4, 3)), eps1=1.0, eps2=0.0, gamma_max=0.5,
                         min_structure=1.5)


def test_cluster_of_one_never_splits() -> None:
    decision = decide_cfl_split(np.ones((1, 5)), eps1=10.0, eps2=0.0, gamma_max=1.0)
    assert not decision.split and np.isnan(decision.max_cross_similarity)


# ------------------------------------------------------------------- density
def test_knee_eps_on_planted_curve() -> None:
    dense = np.linspace(1.0, 1.2, 90)
    curve = np.concatenate([dense, [2.5, 4.0, 6.0, 9.0, 14.0]])
    assert knee_eps(curve) == pytest.approx(1.2)
    assert knee_eps(np.full(10, 0.7)) == pytest.approx(0.7)
    # A straight line has no knee: everything stays one neighbourhood.
    assert knee_eps(np.linspace(0.0, 1.0, 10)) == pytest.approx(1.0)


def test_knee_eps_ignores_a_bump_on_a_concave_curve() -> None:
    """The k-distance curve of 20 skewed digits clients from a CI run (FLDC, seed 1).

    Its third point dips below the chord, but the curve lies above it on average:
    taking that dip as the knee made 16 of the 20 clients noise.
    """
    curve = np.array(
        [0.894, 0.906, 0.906, 0.96, 0.995, 1.012, 1.02, 1.032, 1.043, 1.054,
         1.055, 1.063, 1.07, 1.07, 1.071, 1.075, 1.076, 1.096, 1.099, 1.103]
    )
    assert knee_eps(curve) == pytest.approx(1.103)
    # The planted knee above stays: the dense part lies below the chord.
    dense = np.linspace(0.9, 1.0, 16)
    assert knee_eps(np.concatenate([dense, [1.6, 2.4, 3.5, 5.0]])) == pytest.approx(1.0)


def test_k_distance_curve_excludes_the_point_itself() -> None:
    points = np.array([[0.0], [1.0], [3.0], [7.0]])
    np.testing.assert_allclose(k_distance_curve(points, 1), [1.0, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(k_distance_curve(points, 3), [4.0, 6.0, 7.0, 7.0])


def test_density_clustering_separates_blobs_and_flags_outliers() -> None:
    rng = np.random.default_rng(0)
    centers = 10.0 * np.eye(4, 10)
    blobs = np.concatenate([c + 0.3 * rng.normal(size=(25, 10)) for c in centers])
    outliers = np.array([[40.0] * 10, [-40.0] * 10, [0.0] * 9 + [60.0]])
    points = np.concatenate([blobs, outliers])
    truth = np.concatenate([np.repeat(np.arange(4), 25), [-1, -1, -1]])

    model = DensityClustering(min_samples=4).fit(points)

    assert adjusted_rand_score(truth, model.labels_) == 1.0
    np.testing.assert_array_equal(model.labels_[-3:], [-1, -1, -1])
    assert model.num_noise_ == 3 and model.num_clusters_ == 4
    assert model.silhouette_ > 0.8
    assert model.k_distances_.shape == (103,)
    assert np.all(np.diff(model.k_distances_) >= 0)
    assert model.eps_ == pytest.approx(knee_eps(model.k_distances_))


def test_density_clustering_with_one_cluster_has_nan_silhouette() -> None:
    points = np.random.default_rng(0).normal(size=(20, 3))
    model = DensityClustering(min_samples=4, eps=100.0).fit(points)
    assert model.eps_ == 100.0 and model.num_clusters_ == 1
    assert np.isnan(model.silhouette_)


def test_stratified_sample_sizes() -> None:
    labels = np.array([0] * 10 + [1] * 5 + [2] * 3 + [3] + [-1] * 4)
    rng = np.random.default_rng(0)
    picked = stratified_sample(labels, 0.2, rng)
    assert len(set(picked)) == picked.size
    assert not np.any(labels[picked] == -1)
    sizes = np.bincount(labels[picked], minlength=4)
    # 0.2 * (10, 5, 3, 1) = (2, 1, 0.6, 0.2) -> (2, 1, 1, 1) with the floor of one.
    np.testing.assert_array_equal(sizes, [2, 1, 1, 1])
    # 0.5 * 5 = 2.5 rounds up to 3.
    half = stratified_sample(labels, 0.5, rng)
    np.testing.assert_array_equal(np.bincount(labels[half], minlength=4), [5, 3, 2, 1])
    assert stratified_sample(np.full(4, -1), 0.2, rng).size == 0


# ------------------------------------------------------------------ ordering
def test_order_by_similarity_is_descending_and_stable() -> None:
    similarity = np.array(
        [[1.0, 0.2, 0.9, 0.2], [0.2, 1.0, 0.0, 0.0], [0.9, 0.0, 1.0, 0.0], [0.2, 0.0, 0.0, 1.0]]
    )
    np.testing.assert_array_equal(order_by_similarity(similarity, 0), [2, 1, 3])


def test_incentive_threshold_is_inclusive() -> None:
    local = np.array([0.8, 0.8])
    assert incentive(np.array([0.7, 0.93]), local) == pytest.approx(0.03)
    # Dyadic accuracies make the sum exactly -0.25, right on the threshold.
    assert has_positive_incentive(np.array([0.25, 0.5]), np.array([0.5, 0.5]), beta=-0.25)
    assert not has_positive_incentive(np.array([0.6, 0.8]), local, beta=-0.17)


def run_greedy(
    acfl: GreedyIncentiveClustering, accept: Callable[[np.ndarray], bool]
) -> GreedyIncentiveClustering:
    """Drive the state machine with a fake evaluator: +0.1 per member if accepted, else -0.2."""
    while (group := acfl.next_trial()) is not None:
        local = np.full(group.size, 0.8)
        acfl.report(local + (0.1 if accept(group) else -0.2), local)
    return acfl


def test_greedy_incentive_clustering_recovers_planted_groups_quickly() -> None:
    updates, truth = planted_updates([4, 4, 4], noise=0.5, seed=3)
    acfl = GreedyIncentiveClustering(pairwise_cosine(updates), beta=-0.17, max_rejections=3, seed=0)
    # Twelve clients, eleven of them candidates: m starts at ceil(3 * 11 / 12).
    assert acfl.rejection_limit == 3

    # Federating with a client of another group lowers every member's accuracy.
    run_greedy(acfl, lambda group: np.unique(truth[group]).size == 1)

    assert acfl.done and acfl.next_trial() is None
    assert adjusted_rand_score(truth, acfl.labels_) == 1.0
    assert acfl.num_clusters_ == 3
    # 3 acceptances per group, then m rejections closing the first two groups:
    # m = ceil(3 * 8 / 12) = 2, then ceil(3 * 4 / 12) = 1; the last group runs out
    # of candidates. 9 + 2 + 1 = 12 trials, against N * k = 36 for trying all.
    assert acfl.num_trials_ == 12 < 12 * 3


def test_greedy_incentive_clustering_makes_singletons_when_everyone_rejects() -> None:
    updates, _ = planted_updates([6], seed=4)
    acfl = run_greedy(GreedyIncentiveClustering(pairwise_cosine(updates), seed=1), lambda g: False)
    assert sorted(acfl.labels_) == list(range(6))
    # m = ceil(3 * U / 6) for U = 5, 4, 3, 2, 1 unplaced candidates: 3 + 2 + 2 + 1 + 1.
    assert acfl.num_trials_ == 9


def test_greedy_incentive_clustering_guards_its_protocol() -> None:
    acfl = GreedyIncentiveClustering(np.eye(3), seed=0)
    group = acfl.next_trial()
    assert group is not None and group.size == 2
    with pytest.raises(ValueError, match="global_acc"):
        acfl.report(np.ones(3), np.ones(3))
    run_greedy(acfl, lambda g: True)
    np.testing.assert_array_equal(acfl.labels_, [0, 0, 0])
    with pytest.raises(RuntimeError):
        acfl.report(np.ones(3), np.ones(3))


def test_incentive_standard_error_follows_validation_sizes() -> None:
    fed, local = np.array([0.75, 0.75]), np.array([0.75, 0.75])
    # Each gain: (0.1875 + 0.1875) / n; two members add up.
    assert incentive_standard_error(fed, local, np.array([100, 100])) == pytest.approx(
        np.sqrt(2 * 0.375 / 100)
    )
    big = incentive_standard_error(fed, local, np.array([350, 350]))
    small = incentive_standard_error(fed, local, np.array([9, 9]))
    assert small / big == pytest.approx(np.sqrt(350 / 9))
    with pytest.raises(ValueError, match="num_samples"):
        incentive_standard_error(fed, local, np.array([10, 0]))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        incentive_standard_error(np.array([1.5, 0.5]), local, np.array([10, 10]))


def test_noise_threshold_rejects_a_costly_candidate_that_beta_admits() -> None:
    """Fashion-MNIST-sized trials (ACFL logs, CNN, ~350 validation samples a client).

    Label permutation, seed 1, trial 5: a newcomer of another group loses 0.543
    while five members gain 0.077 each; the sum, -0.157, passes beta = -0.17, the
    newcomer's own loss (~14 standard errors) does not pass the noise rule. Trial 9:
    a newcomer of the same group loses 0.034, about one standard error; z = 1
    rejected it (a singleton cluster, ARI 0.93), z = 2 (the default) admits it.
    With ~9 samples a member the first trial's gains are noise and it is admitted.
    """

    def trial(fed: np.ndarray, local: np.ndarray, sizes: np.ndarray, **kwargs: Any) -> bool:
        acfl = GreedyIncentiveClustering(np.ones((8, 8)), seed=0, **kwargs)
        for _ in range(fed.size - 2):  # grow the open cluster to fed.size - 1 members
            group = acfl.next_trial()
            assert group is not None
            acfl.report(np.full(group.size, 0.9), np.full(group.size, 0.8),
                        np.full(group.size, 350))
        assert acfl.next_trial().size == fed.size  # type: ignore[union-attr]
        return acfl.report(fed, local, sizes)

    wrong_fed, wrong_local = np.array([0.857] * 5 + [0.237]), np.full(6, 0.78)
    assert incentive(wrong_fed, wrong_local) == pytest.approx(-0.158)
    assert trial(wrong_fed, wrong_local, np.full(6, 350), threshold="beta")
    assert not trial(wrong_fed, wrong_local, np.full(6, 350), threshold="noise")
    right_fed, right_local = np.array([0.7785, 0.7785, 0.746]), np.full(3, 0.78)
    assert trial(right_fed, right_local, np.full(3, 350), threshold="noise")
    assert not trial(right_fed, right_local, np.full(3, 350), threshold="noise", noise_z=1.0)
    tiny = np.full(6, 9)
    assert trial(np.array([0.78] * 5 + [0.556]), wrong_local, tiny, threshold="noise")
    # Rotation seed 2: five members gain +0.054 each, the newcomer of another group
    # loses 0.30; the sum, -0.03, passes both thresholds, the newcomer's own loss
    # (~9 standard errors) does not pass the noise rule.
    fed = np.array([0.834] * 5 + [0.48])
    local = np.array([0.78] * 5 + [0.78])
    for threshold, joins in [("beta", True), ("noise", False)]:
        acfl = GreedyIncentiveClustering(np.ones((8, 8)), seed=0, threshold=threshold)
        assert acfl.threshold_for(fed, local, np.full(6, 350)) < incentive(fed, local)
        assert trial(fed, local, np.full(6, 350), threshold=threshold) is joins, threshold
    noisy = GreedyIncentiveClustering(np.eye(2), threshold="noise")
    with pytest.raises(ValueError, match="num_samples"):
        noisy.report(np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="threshold="):
        GreedyIncentiveClustering(np.eye(2), threshold="loose")


# -------------------------------------------------------------- soft weights
def test_importance_weights_floor_without_renormalizing() -> None:
    counts = np.array([[8, 2, 0], [0, 0, 5]])
    u = importance_weights(counts, sigma=0.01)
    np.testing.assert_allclose(u, [[0.8, 0.2, 0.01], [0.01, 0.01, 1.0]])
    np.testing.assert_allclose(u.sum(axis=1), [1.01, 1.02])
    assert u.min() >= 0.01


def test_selection_probabilities_follow_the_formula() -> None:
    u = np.array([[0.8, 0.2], [0.1, 0.9], [0.5, 0.5]])
    n = np.array([100, 50, 10])
    v = selection_probabilities(u, n)
    assert v.shape == (2, 3)
    np.testing.assert_allclose(v.sum(axis=1), 1.0)
    np.testing.assert_allclose(v[0], np.array([80.0, 5.0, 5.0]) / 90.0)
    # sigma = 0 and nobody's data in cluster 2: nobody can train it.
    v0 = selection_probabilities(importance_weights(np.array([[3, 0], [1, 0]]), 0.0), n[:2])
    np.testing.assert_array_equal(v0[1], [0.0, 0.0])


def test_sample_per_cluster_draws_distinct_eligible_clients() -> None:
    v = np.array([[0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.0]])
    picked = sample_per_cluster(v, K=3, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(picked[0], [0, 1])
    assert picked[1].size == 3 and len(set(picked[1])) == 3
    assert picked[2].size == 0
    assert sample_per_cluster(v, K=10, rng=np.random.default_rng(0))[1].size == 4


# --------------------------------------------------------------- aggregation
def test_weighted_average_is_exact_for_identical_float32_models() -> None:
    models = [[np.full((3, 4), 2.0, dtype=np.float32), np.full(5, 2.0, dtype=np.float32)]] * 6
    # With these example counts, float32 sums of normalized weights give 1.9999999.
    averaged = weighted_average(models, [4233, 879, 447, 4316, 111, 2707])
    assert all(layer.dtype == np.float32 for layer in averaged)
    assert all(np.all(layer == 2.0) for layer in averaged)


def test_weighted_average_weights_by_examples() -> None:
    models = [[np.array([0.0, 1.0])], [np.array([4.0, 5.0])]]
    np.testing.assert_allclose(weighted_average(models, [3, 1])[0], [1.0, 2.0])
    with pytest.raises(ValueError, match="shapes"):
        weighted_average([[np.zeros(2)], [np.zeros(3)]], [1, 1])


def test_inter_cluster_mix_identity_and_formula() -> None:
    rng = np.random.default_rng(0)
    clusters = [[rng.normal(size=(2, 3)).astype(np.float32), rng.normal(size=4)] for _ in range(3)]
    same = inter_cluster_mix(clusters, beta=0.0)
    for mixed, original in zip(same, clusters, strict=True):
        for a, b in zip(mixed, original, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    half = inter_cluster_mix(clusters, beta=0.5)
    for k in range(3):
        for layer in range(2):
            own = clusters[k][layer].astype(np.float64)
            others = sum(clusters[i][layer].astype(np.float64) for i in range(3) if i != k)
            np.testing.assert_allclose(half[k][layer], 0.5 / 2 * others + 0.5 * own, rtol=1e-6)
    single = inter_cluster_mix(clusters[:1], beta=0.5)
    np.testing.assert_array_equal(single[0][0], clusters[0][0])


# ---------------------------------------------------------------- assignment
def test_assign_by_loss_and_nearest_feature() -> None:
    losses = np.array([[0.3, 0.1, 0.9], [0.2, 0.5, 0.2], [2.0, 1.0, 0.5]])
    np.testing.assert_array_equal(assign_by_loss(losses), [1, 0, 2])
    features = np.array([[0.0, 0.0], [0.2, 0.0], [10.0, 10.0], [10.0, 12.0]])
    means = cluster_feature_means(features, np.array([0, 0, 2, 2]), num_clusters=3)
    np.testing.assert_allclose(means[[0, 2]], [[0.1, 0.0], [10.0, 11.0]])
    assert np.isnan(means[1]).all()
    # The empty cluster 1 sits nowhere, so the point next to it is not given it.
    query = np.array([[0.0, 1.0], [9.0, 9.0], [5.0, 5.0]])
    np.testing.assert_array_equal(nearest_feature(query, means), [0, 2, 0])


def test_group_by_kmeans_recovers_planted_groups() -> None:
    updates, labels = planted_updates([6, 5, 4], noise=0.3, seed=3)
    groups = group_by_kmeans(updates, 3, seed=0)
    assert groups.dtype == np.int64 and sorted(set(groups.tolist())) == [0, 1, 2]
    assert adjusted_rand_score(labels, groups) == 1.0
    np.testing.assert_array_equal(groups, group_by_kmeans(updates, 3, seed=0))


# ------------------------------------------------------------ bad parameters
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: should_split(0.1, 1.0, eps1=-1.0, eps2=1.0), "eps1"),
        (lambda: decide_cfl_split(np.ones((3, 2)), 0.4, 1.6, gamma_max=1.5), "gamma_max"),
        (lambda: pairwise_cosine(np.array([[np.nan, 1.0]])), "vectors"),
        (lambda: k_distance_curve(np.zeros((3, 2)), k=3), "k=3"),
        (lambda: knee_eps(np.array([3.0, 1.0, 2.0])), "curve"),
        (lambda: DensityClustering(min_samples=1), "min_samples=1"),
        (lambda: DensityClustering(eps=0.0), "eps=0.0"),
        (lambda: DensityClustering(min_samples=5).fit(np.zeros((4, 2))), "min_samples=5"),
        (lambda: stratified_sample(np.zeros(3, int), 0.0, np.random.default_rng()), "r=0.0"),
        (lambda: GreedyIncentiveClustering(np.eye(3), max_rejections=0), "max_rejections=0"),
        (lambda: GreedyIncentiveClustering(np.ones((2, 3))), "similarity"),
        (lambda: order_by_similarity(np.eye(3), start=3), "start=3"),
        (lambda: importance_weights(np.ones((2, 2)), sigma=1.5), "sigma=1.5"),
        (lambda: importance_weights(np.array([[1, 0], [0, 0]]), sigma=0.1), "counts"),
        (lambda: selection_probabilities(np.ones((2, 2)), np.array([1, 0])), "num_samples"),
        (lambda: sample_per_cluster(np.ones((1, 2)), K=0, rng=np.random.default_rng()), "K=0"),
        (lambda: weighted_average([[np.ones(2)]] * 2, [0, 0]), "weights"),
        (lambda: weighted_average([[np.ones(2)]] * 2, [1]), "weights"),
        (lambda: inter_cluster_mix([[np.ones(2)]] * 2, beta=1.5), "beta=1.5"),
        (lambda: assign_by_loss(np.array([[0.1, np.inf]])), "losses"),
        (lambda: cluster_feature_means(np.ones((2, 2)), np.array([0, 3]), 2), "labels"),
        (lambda: cluster_feature_means(np.ones((2, 2)), np.array([0, 0]), 0), "num_clusters=0"),
        (lambda: nearest_feature(np.ones((1, 2)), np.full((2, 2), np.nan)), "centroids"),
        (lambda: group_by_kmeans(np.ones((2, 3)), 3), "num_groups=3"),
        (lambda: group_by_kmeans(np.array([[np.nan, 1.0]]), 1), "points"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(
    call: Callable[[], object], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        call()
