"""Issue 58: no clustering decision flips on floating-point noise.

Every threshold decision of fl_clusters.clustering either holds when its inputs
move by 1e-6 (relative, several seeded draws), or is reported as a tie: a
warning naming the decision, and a margin below TIE_TOLERANCE.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sklearn.cluster import DBSCAN, AgglomerativeClustering

from fl_clusters.clustering import (
    DensityClustering,
    UpdateHierarchy,
    coherence_split_gate,
    decide_cfl_split,
    has_converged,
    has_positive_incentive,
    should_split,
    weighted_kmeans,
)
from fl_clusters.clustering.density import clear_radius
from fl_clusters.clustering.margins import TIE_TOLERANCE, relative_margin

DRAWS = 5
NOISE = 1e-6


def _perturbed(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``values`` times (1 + 1e-6 x a standard normal draw), elementwise."""
    return values * (1.0 + NOISE * rng.standard_normal(np.shape(values)))


def _ties(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "is a tie" in r.getMessage()]


def _groups(rng: np.random.Generator, count: int = 4, size: int = 6, dim: int = 5) -> np.ndarray:
    centres = 10.0 * np.eye(count, dim)
    return np.vstack([c + 0.5 * rng.standard_normal((size, dim)) for c in centres])


# --------------------------------------------------------------------- FLDC
# Two pairs 1.0 apart whose nearest points are 1.375 apart (link A-B), a pair
# 1.375 apart that sets the knee, two more pairs and one far outlier.
KNEE_POINTS = np.array([-1.0, 0.0, 1.375, 2.375, 100.0, 101.375, 200.0, 201.125, 300.0,
                        301.25, 1000.0])[:, None]


def test_a_distance_one_ulp_from_the_knee_eps_does_not_change_the_clustering() -> None:
    nudged = KNEE_POINTS.copy()
    nudged[2:4, 0] = np.nextafter(nudged[2:4, 0], np.inf)  # link A-B: 1.375 + 1 ulp
    assert nudged[2, 0] - nudged[1, 0] == np.nextafter(1.375, np.inf)  # exactly 1 ulp
    exact, moved = DensityClustering(2).fit(KNEE_POINTS), DensityClustering(2).fit(nudged)
    assert exact.eps_ == moved.eps_ == 1.375  # the knee is the pair at 1.375 exactly
    # DBSCAN at the knee itself splits A and B once their distance is one ulp above it:
    plain = [DBSCAN(eps=1.375, min_samples=2).fit(p).labels_ for p in (KNEE_POINTS, nudged)]
    assert np.unique(plain[0]).size != np.unique(plain[1]).size
    # Its radius lies between 1.375 and the next distance, 2.375: both count A-B in.
    np.testing.assert_array_equal(exact.labels_, moved.labels_)
    assert exact.radius_ == pytest.approx(1.875) and exact.eps_margin_ > 0.25


def test_fldc_clustering_holds_under_relative_noise() -> None:
    rng = np.random.default_rng(58)
    points = np.vstack([_groups(rng), [[30.0] * 5, [-30.0] * 5]])
    for method in ("knee", "silhouette"):
        fitted = DensityClustering(4, eps_method=method).fit(points)
        assert fitted.eps_margin_ >= TIE_TOLERANCE and fitted.num_clusters_ == 4
        for _ in range(DRAWS):
            again = DensityClustering(4, eps_method=method).fit(_perturbed(points, rng))
            np.testing.assert_array_equal(again.labels_, fitted.labels_)


def test_clear_radius_keeps_a_clear_eps_and_reports_packed_distances(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert clear_radius(1.5, np.array([1.0, 2.0])) == (1.5, pytest.approx(1 / 3))
    # 1.00005 is within the tolerance above eps: it counts in, like 1.0.
    radius, margin = clear_radius(1.0, np.array([1.0, 1.00005, 3.0]))
    assert radius == pytest.approx((1.00005 + 3.0) / 2) and not _ties(caplog)
    # 1.00015 lies just beyond it: no radius clears both by the tolerance.
    radius, margin = clear_radius(1.0, np.array([1.0, 1.00015]))
    assert 1.0 < radius < 1.00015 and margin < TIE_TOLERANCE
    assert any("FLDC DBSCAN neighbourhood" in m for m in _ties(caplog))
    # Coinciding points: the smallest positive radius, as before.
    assert clear_radius(0.0, np.zeros(3))[0] == np.finfo(np.float64).tiny


# ---------------------------------------------------------------------- CFL
def test_cfl_gates_hold_under_noise_and_report_ties(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(1)
    for _ in range(DRAWS):
        mean, peak = _perturbed(np.array([0.3, 2.0]), rng)
        assert should_split(mean, peak, 0.4, 1.6)
        coherence, peak = _perturbed(np.array([0.5, 2.0]), rng)
        assert coherence_split_gate(coherence, peak, 1.0, 0.7, 0.5)
        assert has_converged(_perturbed(np.array([1.0, 1.0, 1.05, 1.05]), rng), 2, 0.1)
    assert not _ties(caplog)
    should_split(0.4, 2.0, 0.4, 1.6)
    coherence_split_gate(0.7, 2.0, 1.0, 0.7, 0.5)
    has_converged(np.array([1.0, 1.0, 1.1, 1.1]), 2, 0.1)
    ties = " ".join(_ties(caplog))
    for name in ("mean norm < eps1", "coherence < mean_ratio", "ACFL phase-1 gate"):
        assert name in ties


def test_cfl_split_holds_under_noise_and_reports_a_cross_similarity_tie(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(2)
    updates = np.vstack([np.eye(1, 6, k) + 0.05 * rng.standard_normal((3, 6)) for k in (0, 1)])
    decision = decide_cfl_split(updates, 1.0, 0.0, 0.5, min_structure=0.3)
    assert decision.split and decision.margin >= TIE_TOLERANCE and not _ties(caplog)
    for _ in range(DRAWS):
        again = decide_cfl_split(_perturbed(updates, rng), 1.0, 0.0, 0.5, min_structure=0.3)
        np.testing.assert_array_equal(again.labels, decision.labels)
    at_tie = decide_cfl_split(updates, 1.0, 0.0, decision.max_cross_similarity)
    assert at_tie.margin == 0.0 and any("cross similarity" in m for m in _ties(caplog))


# --------------------------------------------------------------------- ACFL
def test_acfl_incentive_holds_under_noise_and_reports_a_tie(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(3)
    group, own = np.array([0.8, 0.7, 0.6]), np.array([0.75, 0.72, 0.61])
    for _ in range(DRAWS):
        assert has_positive_incentive(_perturbed(group, rng), own, beta=-0.17)
    assert not _ties(caplog)
    has_positive_incentive(np.array([0.5, 0.33]), np.array([0.5, 0.5]), beta=-0.17)
    assert any("ACFL trial" in m for m in _ties(caplog))


# -------------------------------------------------------------------- FL+HC
def test_flhc_cut_holds_under_noise_and_reports_a_cut_on_a_merge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(4)
    points = _groups(rng)
    fitted = UpdateHierarchy().fit(points)
    assert fitted.num_clusters_ == 4 and fitted.margin_ >= TIE_TOLERANCE
    for _ in range(DRAWS):
        np.testing.assert_array_equal(UpdateHierarchy().fit_predict(_perturbed(points, rng)),
                                      fitted.labels_)
    assert not _ties(caplog)
    tree = UpdateHierarchy(threshold="absolute", distance_threshold=100.0).fit(points)
    heights = AgglomerativeClustering(n_clusters=1, compute_distances=True).fit(points).distances_
    height = float(np.sort(heights)[-2])
    on_merge = UpdateHierarchy(threshold="absolute", distance_threshold=height).fit(points)
    assert tree.num_clusters_ == 1 and on_merge.margin_ == 0.0
    assert any("FL+HC cut" in m for m in _ties(caplog))


# ------------------------------------------------------------------ k-means
def test_kmeans_labels_hold_under_noise_and_report_an_equidistant_point(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rng = np.random.default_rng(5)
    points, weights = _groups(rng, count=2), np.ones(12)
    centres = np.vstack([points[:6].mean(axis=0), points[6:].mean(axis=0)])
    labels, _ = weighted_kmeans(points, weights, centres)
    assert not _ties(caplog)
    for _ in range(DRAWS):
        np.testing.assert_array_equal(
            weighted_kmeans(_perturbed(points, rng), weights, centres)[0], labels)
    # Equidistant from two fixed centres: the tie goes to the first and is reported.
    halfway = np.array([[0.0, 1.0], [0.0, -1.0], [10.0, 1.0], [10.0, -1.0], [5.0, 0.0]])
    tied, _ = weighted_kmeans(halfway, np.array([1.0, 1.0, 1.0, 1.0, 1e-9]),
                              np.array([[0.0, 0.0], [10.0, 0.0]]), max_iter=1)
    assert tied[-1] == 0 and any("k-means" in m for m in _ties(caplog))


def test_relative_margin_units() -> None:
    assert relative_margin(1.1, 1.0) == pytest.approx(0.1)
    assert relative_margin(0.5, 0.0) == 1.0
    assert relative_margin(0.0, 0.0) == np.inf
    assert relative_margin(0.05, 0.0, scale=1.0) == 0.05
