"""IFCA's server update of a cluster (:func:`fl_clusters.clustering.cluster_update`)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_clusters.clustering import cluster_update

OLD = [np.array([1.0, 1.0], dtype=np.float32)]
MEMBERS = [[np.array([0.0, 2.0], dtype=np.float32)], [np.array([4.0, 2.0], dtype=np.float32)]]


def test_weighted_model_averaging_weighs_by_examples() -> None:
    (layer,) = cluster_update(OLD, MEMBERS, [3.0, 1.0], mode="model", aggregation="weighted",
                              server_lr=0.5, num_replies=2)
    np.testing.assert_allclose(layer, [1.0, 2.0])
    assert layer.dtype == np.float32


def test_paper_gradient_step_scales_by_the_share_of_replies() -> None:
    # gamma / m * sum of the cluster's gradients, m = 4 replies over all clusters.
    (layer,) = cluster_update(OLD, MEMBERS, [3.0, 1.0], mode="gradient", aggregation="paper",
                              server_lr=0.5, num_replies=4)
    np.testing.assert_allclose(layer, OLD[0] - 0.5 / 4 * (MEMBERS[0][0] + MEMBERS[1][0]))
    assert layer.dtype == np.float32


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode='sgd'"):
        cluster_update(OLD, MEMBERS, [1.0, 1.0], mode="sgd", aggregation="paper",
                       server_lr=0.5, num_replies=2)
