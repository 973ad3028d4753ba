"""The gates of fl_clusters.clustering: coherence, convergence, widest group, output rows."""

from __future__ import annotations

import numpy as np
import pytest

from fl_clusters.clustering import (
    coherence_split_gate,
    has_converged,
    output_layer_profiles,
    unit_rows,
    update_coherence,
    widest_group,
)


def test_output_layer_profiles_drop_scale_and_the_common_row() -> None:
    rng = np.random.default_rng(0)
    update = rng.normal(size=(4, 3))
    common = np.ones((4, 1)) * rng.normal(size=(1, 3))
    profiles = output_layer_profiles(np.stack([update, 5.0 * update + common]))
    np.testing.assert_allclose(profiles[0], profiles[1], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(profiles, axis=1), 1.0)
    with pytest.raises(ValueError, match="N, R, C"):
        output_layer_profiles(np.ones((2, 3)))


# ------------------------------------------------------------ pure gate math
def test_coherence_split_gate_is_scale_free() -> None:
    rng = np.random.default_rng(0)
    opposed = np.r_[np.ones((4, 1)), -np.ones((4, 1))] * np.r_[1.0, np.zeros(9)] + \
        0.05 * rng.normal(size=(8, 10))
    aligned = np.abs(opposed)
    for scale in (1e-3, 1.0, 1e3):
        reference = 0.5 * scale  # the largest norm of the first rounds
        max_norm = float(np.linalg.norm(opposed * scale, axis=1).max())
        assert coherence_split_gate(update_coherence(opposed * scale), max_norm, reference,
                                    0.8, 0.6)
        assert not coherence_split_gate(update_coherence(aligned * scale), max_norm, reference,
                                        0.8, 0.6)
        # Members that all stopped moving (0.25 of the early norm) have nothing to split.
        assert not coherence_split_gate(update_coherence(opposed * scale), 0.25 * reference,
                                        reference, 0.8, 0.6)
    with pytest.raises(ValueError, match="max_ratio"):
        coherence_split_gate(0.1, 0.5, 0.2, 0.8, -0.1)


def test_has_converged_waits_for_the_norms_to_level_off() -> None:
    rising = np.array([0.35, 0.36, 0.39, 0.41])
    falling = np.array([1.0, 0.8, 0.6, 0.45])
    flat = np.array([1.0, 0.6, 0.41, 0.40, 0.39, 0.40])
    assert not has_converged(rising, 2, 0.05)
    assert not has_converged(falling, 2, 0.1)
    assert has_converged(flat, 2, 0.1) and has_converged(flat * 1e-4, 2, 0.1)
    assert not has_converged(np.array([0.4]), 2, 0.1)  # too few rounds
    with pytest.raises(ValueError, match="tolerance"):
        has_converged(flat, 2, 1.0)


def test_widest_group_and_unit_rows() -> None:
    tight = np.array([[1.0, 0.0], [1.1, 0.0]])
    wide = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    assert widest_group([tight, np.zeros((0, 2)), wide]) == 2
    assert widest_group([np.ones((1, 2)), np.zeros((0, 2))]) is None
    with pytest.raises(ValueError, match="columns"):
        widest_group([tight, np.ones((2, 3))])
    np.testing.assert_allclose(np.linalg.norm(unit_rows(wide * 7.0), axis=1), 1.0)
    np.testing.assert_array_equal(unit_rows(np.zeros((1, 3))), 0.0)
