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
    cluster_colors,
    group_colors,
    plot_assignment_map,
    plot_similarity,
    run_title,
    write_run_plots,
)
from fl_clusters.results import similarity_in_row_order
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


def test_colours_only_for_the_clusters_that_exist() -> None:
    colors = cluster_colors([3, 0, 3, 7])
    assert list(colors) == [0, 3, 7]
    assert len(set(colors.values())) == 3


def test_a_group_takes_the_colour_of_the_cluster_that_holds_it() -> None:
    colors = cluster_colors([5, 2, 7])
    truth = [0, 0, 1, 1, 2, 2, 3]
    final = [5, 5, 2, 2, 7, None, 5]  # group 3's only client sits in group 0's cluster
    shades = group_colors(truth, final, colors)
    assert shades[0] == colors[5] and shades[1] == colors[2] and shades[2] == colors[7]
    assert shades[3] not in colors.values()  # no cluster of its own: a grey


@pytest.mark.parametrize("k", [2, 4, 8])
def test_assignment_map_for_recovered_clusters_of_any_count(tmp_path: Path, k: int) -> None:
    rng = np.random.default_rng(k)
    truth = [i // 3 for i in range(3 * k)]
    relabel = rng.permutation(k) + 10  # cluster ids need not be 0..k-1
    history = [[int(relabel[g]) for g in truth] for _ in range(4)]
    colors = cluster_colors(relabel)
    assert len(colors) == k
    shades = group_colors(truth, history[-1], colors)
    assert [shades[g] for g in range(k)] == [colors[int(relabel[g])] for g in range(k)]
    path = plot_assignment_map(history, truth, tmp_path / "map.png", "ifca on digits, ARI 1.00")
    assert_png(path)
    # Every cluster's colour is drawn.
    pixels = np.unique(
        np.round(matplotlib.image.imread(path)[..., :3].reshape(-1, 3) * 255), axis=0
    )

    def drawn(color: tuple[float, ...]) -> bool:
        return bool(np.abs(pixels - np.round(np.array(color) * 255)).max(axis=1).min() <= 1)

    assert all(drawn(color) for color in colors.values())
    # ... and no colour of a cluster that does not exist (the colour bar had ten).
    # tab10's grey is left out: anti-aliased black text has grey pixels too.
    unused = [c for i, c in enumerate(matplotlib.colormaps["tab10"].colors) if i >= k and i != 7]
    assert not any(drawn(color) for color in unused)


def test_titles_say_strategy_data_and_ari() -> None:
    assert run_title({"strategy": "cfl", "ari": 0.8312}, "digits, rotation") == (
        "cfl on digits, rotation, ARI 0.83"
    )
    assert run_title({"strategy": "fedavg", "ari": None}, "") == "fedavg"
