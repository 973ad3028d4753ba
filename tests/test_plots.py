"""Every run writes its plots; plots never fail a run and can be switched off."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from fl_clusters.plots import (
    ACCURACY_PLOT,
    ASSIGNMENT_PLOT,
    SIMILARITY_PLOT,
    plot_similarity,
    write_run_plots,
)
from fl_clusters.server_app import similarity_in_row_order
from fl_clusters.strategies.local import LocalOnly

ROTATION = {"cluster-structure": "rotation", "num-clusters": 2, "copy-per-group": True}


def assert_png(path: Path) -> None:
    assert path.is_file(), f"{path.name} was not written"
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert image.std() > 0, f"{path.name} is blank"


def test_run_writes_plots_and_assignment_history(federation) -> None:
    summary = federation({**ROTATION, "strategy": "ifca", "num-rounds": 3}, num_clients=10)
    folder = summary["_folder"]
    assert_png(folder / ACCURACY_PLOT)
    assert_png(folder / ASSIGNMENT_PLOT)
    assert not (folder / SIMILARITY_PLOT).exists()  # IFCA computes no similarity
    history = summary["assignment_history"]
    assert len(history) == 3 and all(len(row) == 10 for row in history)
    with (folder / "assignments.csv").open() as handle:
        final = [int(row["assigned_cluster"]) for row in csv.DictReader(handle)]
    assert history[-1] == final
    accuracy = summary["cluster_accuracy_history"]
    assert len(accuracy) == 3 and all(len(row) == 2 for row in accuracy)
    used = set(history[-1])
    assert all(accuracy[-1][j] is not None and 0 <= accuracy[-1][j] <= 1 for j in used)


def test_plots_switched_off(federation) -> None:
    summary = federation(
        {**ROTATION, "strategy": "local", "num-rounds": 1, "plots": False}, num_clients=4
    )
    assert not list(summary["_folder"].glob("*.png"))


def test_plot_errors_are_logged_not_raised(tmp_path: Path, caplog) -> None:
    summary = {"assignment_history": [[0, 1, 1], [0, 1, None]],
               "cluster_accuracy_history": [[0.5, 0.6], [0.7, None]]}
    caplog.set_level(logging.WARNING, logger="flwr")
    written = write_run_plots(
        tmp_path, summary, {1: 0.55, 2: 0.7}, [0, 1, 1], similarity=np.ones((2, 2))
    )
    assert [p.name for p in written] == [ACCURACY_PLOT, ASSIGNMENT_PLOT]
    for path in written:
        assert_png(path)
    assert "similarity_matrix.png not written" in caplog.text


class _Similar(LocalOnly):
    def similarity_matrix(self) -> tuple[list[int], np.ndarray]:
        return [30, 10], np.array([[1.0, 0.2], [0.2, 1.0]])


def test_similarity_reordered_to_clients_and_plotted(tmp_path: Path) -> None:
    rows = [{"node-id": 10}, {"node-id": 20}, {"node-id": 30}]
    matrix = similarity_in_row_order(_Similar(), rows)
    assert matrix is not None
    np.testing.assert_array_equal(matrix[[0, 2]][:, [0, 2]], [[1.0, 0.2], [0.2, 1.0]])
    assert np.isnan(matrix[1]).all() and np.isnan(matrix[:, 1]).all()
    written = write_run_plots(tmp_path, {}, {1: 0.5}, [0, 1, 1], similarity=matrix)
    assert [p.name for p in written] == [ACCURACY_PLOT, SIMILARITY_PLOT]
    assert_png(tmp_path / SIMILARITY_PLOT)


@pytest.mark.parametrize("bad", [np.ones((3, 2)), np.ones(3)])
def test_similarity_shape_checked(tmp_path: Path, bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="square with one row per client"):
        plot_similarity(bad, [0, 1, 1], tmp_path / "s.png")
