"""Copies of a client's update (the same data and seed, a device that reports twice)
must not change how the other clients are grouped: FL+HC's cut, WeCFL's k-means and
CFL's split proposal.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from fl_clusters.clustering import UpdateHierarchy, initial_kmeans
from fl_clusters.clustering.bipartition import (
    MIN_SPLIT_MEMBERS,
    bipartition_by_cosine,
    decide_cfl_split,
)
from fl_clusters.clustering.hierarchical import distinct_updates
from fl_clusters.clustering.kmeans_models import recluster_kmeans
from fl_clusters.clustering.similarity import pairwise_cosine


def _groups(seed: int, num_groups: int, per_group: int, dim: int,
            spread: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(num_groups), per_group)
    points = rng.normal(size=(num_groups, dim))[truth] + spread * rng.normal(size=(truth.size, dim))
    return points, truth


def _with_copy(points: np.ndarray, source: int, position: int, noise: float,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``points`` with a copy of row ``source`` (plus noise x its norm) inserted at
    ``position``; and where every original row went."""
    rng = np.random.default_rng(seed)
    copy = points[source] + noise * np.linalg.norm(points[source]) * rng.normal(
        size=points.shape[1]) / np.sqrt(points.shape[1])
    position %= points.shape[0] + 1
    extended = np.insert(points, position, copy, axis=0)
    originals = np.arange(points.shape[0])
    originals[originals >= position] += 1
    return extended, originals


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return adjusted_rand_score(a, b) == 1.0 and np.unique(a).size == np.unique(b).size


copies = st.fixed_dictionaries({
    "seed": st.integers(0, 10_000),
    "source": st.integers(0, 1_000),
    "position": st.integers(0, 1_000),
    # 0: an exact copy; otherwise far below any distance between distinct updates.
    "noise": st.sampled_from([0.0, 1e-12, 1e-9, 1e-7]),
})
# Updates of 1-4 groups, 1-6 clients each, at several spreads around their group.
layouts = st.fixed_dictionaries({
    "num_groups": st.integers(1, 4),
    "per_group": st.integers(1, 6),
    "dim": st.integers(2, 30),
    "spread": st.sampled_from([0.05, 0.2, 0.5, 1.0]),
})


def _updates_and_copy(
    copy: dict, layout: dict
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The layout's updates, them with the copy, where each original went, the copied
    row and the copy's row."""
    points, _ = _groups(copy["seed"], layout["num_groups"], layout["per_group"],
                        layout["dim"], layout["spread"])
    source = copy["source"] % points.shape[0]
    extended, originals = _with_copy(points, source, copy["position"], copy["noise"],
                                     copy["seed"])
    copied = int(np.setdiff1d(np.arange(extended.shape[0]), originals)[0])
    return points, extended, originals, source, copied


@settings(max_examples=60, deadline=None)
@given(
    copy=copies,
    layout=layouts,
    cut=st.sampled_from([("ward", "euclidean", "gap"), ("ward", "euclidean", "relative"),
                         ("average", "cosine", "gap"), ("complete", "manhattan", "gap"),
                         ("single", "euclidean", "gap")]),
)
def test_a_copy_never_regroups_the_other_updates_of_flhc(
    copy: dict, layout: dict, cut: tuple[str, str, str],
) -> None:
    points, extended, originals, source, copied = _updates_and_copy(copy, layout)
    hierarchy = UpdateHierarchy(*cut)
    before = hierarchy.fit_predict(points)
    distinct = hierarchy.num_distinct_
    after = hierarchy.fit_predict(extended)
    assert _same_partition(before, after[originals]), (before, after)
    assert after[copied] == after[originals[source]]
    # The copy adds no distinct update (a lone update and its near copy give no
    # scale to call them copies by).
    assert hierarchy.num_distinct_ == distinct or points.shape[0] == 1


@settings(max_examples=30, deadline=None)
@given(copy=copies, extra=st.integers(1, 5))
def test_many_copies_of_one_update_never_make_a_cluster_of_their_own(
    copy: dict, extra: int
) -> None:
    """One distribution, one update sent ``extra`` more times: still one cluster."""
    points, _ = _groups(copy["seed"], 1, 12, 20, 1.0)
    for i in range(extra):
        points, _ = _with_copy(points, copy["source"] % 12, copy["position"] + i,
                               copy["noise"], copy["seed"] + i)
    assert UpdateHierarchy().fit(points).num_clusters_ == 1


@pytest.mark.parametrize("noise", [0.0, 1e-9, 1e-6])
def test_a_near_identical_pair_neither_splits_groups_nor_one_distribution(noise: float) -> None:
    """4 separated groups of 5 with one near-identical pair gave 19 clusters (the pair's
    tiny first merge was the largest jump); one distribution with such a pair gave 19."""
    rng = np.random.default_rng(0)
    points, truth = _groups(0, 4, 5, 50, 0.2)
    points[1] = points[0] + noise * rng.normal(size=50)
    hierarchy = UpdateHierarchy().fit(points)
    assert hierarchy.num_clusters_ == 4
    assert adjusted_rand_score(truth, hierarchy.labels_) == 1.0
    one = rng.normal(size=(20, 50))
    one[1] = one[0] + noise * rng.normal(size=50)
    assert UpdateHierarchy().fit(one).num_clusters_ == 1


def test_a_close_but_distinct_pair_is_below_the_noise_floor() -> None:
    """A pair at 2 % of the typical nearest distance is not a copy, yet its merge is
    far below every other: the gap cut does not count it."""
    rng = np.random.default_rng(1)
    one = rng.normal(size=(20, 50))
    one[1] = one[0] + 0.02 * rng.normal(size=50)
    hierarchy = UpdateHierarchy().fit(one)
    assert hierarchy.num_distinct_ == 20 and hierarchy.num_clusters_ == 1
    points, truth = _groups(2, 4, 5, 50, 0.2)
    points[6] = points[5] + 0.01 * rng.normal(size=50)
    assert adjusted_rand_score(truth, UpdateHierarchy().fit_predict(points)) == 1.0


def test_distinct_updates_points_every_copy_at_its_first_occurrence() -> None:
    base = np.eye(4)
    points = np.array([base[2], base[0], base[2], base[1], base[0] + 1e-9, base[3]])
    assert distinct_updates(points).tolist() == [0, 1, 0, 3, 1, 5]
    assert distinct_updates(np.ones((3, 2))).tolist() == [0, 0, 0]


# ------------------------------------------------------------------- WeCFL
@settings(max_examples=40, deadline=None)
@given(
    copy=copies,
    num_groups=st.integers(2, 4),
    per_group=st.integers(1, 5),
    dim=st.integers(2, 30),
    weight=st.integers(1, 500),
)
def test_a_copy_never_regroups_the_other_models_of_wecfl(
    copy: dict, num_groups: int, per_group: int, dim: int, weight: int
) -> None:
    """Separated groups (spread 1 % of their distance): a copy adds its data size to
    its group, and k-means groups every other client as before, in the first round and
    in later rounds' matched k-means."""
    points, truth = _groups(copy["seed"], num_groups, per_group, dim, 0.01)
    centers = np.stack([points[truth == g].mean(axis=0) for g in range(num_groups)])
    gaps = np.linalg.norm(centers[:, None] - centers[None], axis=2)
    assume(gaps[np.triu_indices(num_groups, 1)].min() > 0.5)
    rng = np.random.default_rng(copy["seed"])
    sizes = rng.integers(1, 500, size=points.shape[0]).astype(float)
    source = copy["source"] % points.shape[0]
    extended, originals = _with_copy(points, source, copy["position"], copy["noise"],
                                     copy["seed"])
    extended_sizes = np.insert(sizes, copy["position"] % (points.shape[0] + 1), float(weight))
    before = initial_kmeans(points, sizes, num_groups)
    after = initial_kmeans(extended, extended_sizes, num_groups)
    assert _same_partition(before, after[originals])
    assert _same_partition(truth, before)
    previous = centers[rng.permutation(num_groups)]
    before = recluster_kmeans(points, sizes, previous)
    after = recluster_kmeans(extended, extended_sizes, previous)
    np.testing.assert_array_equal(before, after[originals])


# --------------------------------------------------------------------- CFL
@settings(max_examples=60, deadline=None)
@given(copy=copies, layout=layouts)
def test_a_copy_never_regroups_the_other_updates_of_cfl_bipartition(
    copy: dict, layout: dict
) -> None:
    """CFL's split proposal (complete linkage of cosine similarities): a copy joins its
    source's side, and every other update stays on the side it was on."""
    points, extended, originals, source, copied = _updates_and_copy(copy, layout)
    assume(points.shape[0] >= 2)
    before = decide_cfl_split(points, 0.0, 0.0, 1.0, norms_qualify=True)
    after = decide_cfl_split(extended, 0.0, 0.0, 1.0, norms_qualify=True)
    if points.shape[0] >= MIN_SPLIT_MEMBERS:
        assert before.split and after.split
        assert _same_partition(before.labels, after.labels[originals])
        assert after.labels[copied] == after.labels[originals[source]]
        # The copy is as similar to the other side as its source: the test that
        # decides whether the split is sound sees the same largest cross similarity.
        assert after.max_cross_similarity == pytest.approx(before.max_cross_similarity,
                                                           abs=1e-6)
    labels, _ = bipartition_by_cosine(pairwise_cosine(extended))
    assert labels[copied] == labels[originals[source]]
