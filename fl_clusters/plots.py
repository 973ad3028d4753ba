"""The PNG plots every run writes next to its ``summary.json``.

Matplotlib on the Agg backend (files only, no display). :func:`write_run_plots` is
what the ServerApp calls; a plot that cannot be drawn is logged and skipped, so
plotting never fails a finished run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import WARNING
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from flwr.common.logger import log
from matplotlib.colors import ListedColormap
from matplotlib.ticker import MaxNLocator

ACCURACY_PLOT = "accuracy_per_cluster.png"
ASSIGNMENT_PLOT = "assignment_map.png"
SIMILARITY_PLOT = "similarity_matrix.png"
DPI = 80


def plot_cluster_accuracy(
    history: Sequence[Sequence[float | None]], overall: Mapping[int, float], path: Path
) -> Path:
    """Accuracy per round of every cluster's members, and the overall accuracy.

    Parameters
    ----------
    history : Sequence[Sequence[float | None]]
        Per round (round 1 first), each cluster's example-weighted accuracy over
        the nodes that used it; ``None`` where no node used the cluster.
    overall : Mapping[int, float]
        Round -> the run's personalized accuracy (all nodes).
    path : Path
        PNG file to write.
    """
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rounds = np.arange(1, len(history) + 1)
    num_clusters = max((len(row) for row in history), default=0)
    for j in range(num_clusters):
        values = [np.nan if j >= len(row) or row[j] is None else row[j] for row in history]
        ax.plot(rounds, values, marker=".", lw=1, label=f"cluster {j}")
    if overall:
        ax.plot(sorted(overall), [overall[r] for r in sorted(overall)], "k--", lw=1.5,
                label="all clients")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("accuracy per round per cluster")
    return _save(fig, path)


def plot_assignment_map(
    history: Sequence[Sequence[int | None]], truth: Sequence[int], path: Path
) -> Path:
    """Client x round map of the cluster each client used, clients grouped by true group.

    Parameters
    ----------
    history : Sequence[Sequence[int | None]]
        Per round, the cluster of every client (the order of ``truth``); ``None``
        where the client was not evaluated that round (drawn white).
    truth : Sequence[int]
        Every client's true group; the left strip is colored by it and the rows
        are sorted by it, so a recovered clustering shows as blocks of one color.
    path : Path
        PNG file to write.
    """
    truth = np.asarray(truth, dtype=int)
    grid = np.array(
        [[-1 if c is None else c for c in row] for row in history], dtype=float
    ).T  # (clients, rounds)
    order = np.argsort(truth, kind="stable")
    grid[grid < 0] = np.nan
    colors = plt.get_cmap("tab10")
    fig, (strip, ax) = plt.subplots(
        1, 2, figsize=(7, 0.18 * len(truth) + 1.6), width_ratios=(1, 14), sharey=True
    )
    strip.imshow(truth[order][:, None], cmap=ListedColormap(colors.colors), vmin=0, vmax=9,
                 aspect="auto", interpolation="nearest")
    strip.set_xticks([])
    strip.set_ylabel("client (sorted by true group)")
    strip.set_title("true", fontsize=8)
    image = ax.imshow(grid[order], cmap=ListedColormap(colors.colors), vmin=0, vmax=9,
                      aspect="auto", interpolation="nearest",
                      extent=(0.5, grid.shape[1] + 0.5, len(truth) - 0.5, -0.5))
    for boundary in np.flatnonzero(np.diff(truth[order])):
        ax.axhline(boundary + 0.5, color="k", lw=0.8)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    strip.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("cluster used per round (color = cluster)", fontsize=9)
    fig.colorbar(image, ax=ax, ticks=range(10), label="cluster")
    return _save(fig, path)


def plot_similarity(matrix: np.ndarray, truth: Sequence[int], path: Path) -> Path:
    """The strategy's final pairwise client similarity, rows sorted by true group.

    Parameters
    ----------
    matrix : np.ndarray
        (n, n) similarities, rows and columns in the order of ``truth``.
    truth : Sequence[int]
        The true group of every row's client.
    path : Path
        PNG file to write.
    """
    matrix = np.asarray(matrix, dtype=float)
    truth = np.asarray(truth, dtype=int)
    if matrix.shape != (truth.size, truth.size):
        raise ValueError(
            f"similarity matrix of shape {matrix.shape} for {truth.size} clients; "
            "it must be square with one row per client"
        )
    order = np.argsort(truth, kind="stable")
    fig, ax = plt.subplots(figsize=(4.8, 4))
    image = ax.imshow(matrix[np.ix_(order, order)], cmap="viridis", interpolation="nearest")
    for boundary in np.flatnonzero(np.diff(truth[order])):
        ax.axhline(boundary + 0.5, color="w", lw=0.8)
        ax.axvline(boundary + 0.5, color="w", lw=0.8)
    ax.set_xlabel("client (sorted by true group)")
    ax.set_ylabel("client (sorted by true group)")
    ax.set_title("final pairwise similarity")
    fig.colorbar(image, ax=ax)
    return _save(fig, path)


def write_run_plots(
    folder: Path,
    summary: Mapping[str, Any],
    overall: Mapping[int, float],
    truth: Sequence[int],
    similarity: np.ndarray | None = None,
) -> list[Path]:
    """Write every plot a run's data allow; a failing plot is logged, never raised.

    Parameters
    ----------
    folder : Path
        The run's results folder.
    summary : Mapping[str, Any]
        The run's summary; ``cluster_accuracy_history`` and ``assignment_history``
        are plotted when present.
    overall : Mapping[int, float]
        Round -> personalized accuracy of all nodes.
    truth : Sequence[int]
        Every client's true group, in the summary's client order.
    similarity : np.ndarray | None
        The strategy's final (n, n) client similarity in the same order, if any.

    Returns
    -------
    list[Path]
        The PNG files written.
    """
    jobs = [
        (ACCURACY_PLOT, plot_cluster_accuracy,
         (summary.get("cluster_accuracy_history") or [[overall[r]] for r in sorted(overall)],
          overall)),
    ]
    if summary.get("assignment_history"):
        jobs.append((ASSIGNMENT_PLOT, plot_assignment_map, (summary["assignment_history"], truth)))
    if similarity is not None:
        jobs.append((SIMILARITY_PLOT, plot_similarity, (similarity, truth)))
    written = []
    for name, draw, args in jobs:
        try:
            written.append(draw(*args, folder / name))
        except Exception as error:  # a plot must never fail a finished run
            plt.close("all")
            log(WARNING, "plot %s not written: %s: %s", name, type(error).__name__, error)
    return written


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
