"""FLDC's eps by silhouette over a grid (the paper's table 5), next to the knee."""

from __future__ import annotations

import numpy as np
import pytest

from fl_clusters.clustering import DensityClustering, silhouette_eps
from fl_clusters.config import parse_run_config
from fl_clusters.strategies import FLDC
from fl_clusters.strategies.registry import build_strategy


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
    fldc = build_strategy({**settings, "min-available-nodes": 4})
    assert isinstance(fldc, FLDC) and fldc.eps_method == "silhouette"
    with pytest.raises(ValueError, match="fldc-eps-method"):
        parse_run_config({"fldc-eps-method": "elbow"})
    with pytest.raises(ValueError, match="eps_method must be one of 'knee', 'silhouette'"):
        FLDC(eps_method="elbow")
