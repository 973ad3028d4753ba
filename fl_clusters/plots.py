"""The PNG plots every run writes next to its ``summary.json``.

Matplotlib on the Agg backend (files only, no display). :func:`write_run_plots` is
what the ServerApp calls; a plot that cannot be drawn is logged and skipped, so
plotting never fails a finished run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
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
from scipy.optimize import linear_sum_assignment

from fl_clusters.placement_regret import REGRET_THRESHOLD

ACCURACY_PLOT = "accuracy_per_cluster.png"
ASSIGNMENT_PLOT = "assignment_map.png"
SIMILARITY_PLOT = "similarity_matrix.png"
DPI = 80


def cluster_colors(clusters: Sequence[int]) -> dict[int, tuple[float, ...]]:
    """One distinct colour per cluster id that occurs, in id order.

    Matplotlib's qualitative ``tab10`` up to ten clusters, ``tab20`` beyond, so a
    plot shows as many colours as there are clusters and no more.
    """
    ids = sorted(set(int(c) for c in clusters))
    palette = plt.get_cmap("tab10" if len(ids) <= 10 else "tab20").colors
    return {cluster: palette[i % len(palette)] for i, cluster in enumerate(ids)}


def group_colors(
    truth: Sequence[int], final: Sequence[int | None], colors: Mapping[int, tuple[float, ...]]
) -> dict[int, tuple[float, ...]]:
    """Each true group's colour: that of the cluster that holds it in the last round.

    Groups and clusters are matched one to one by the most shared clients
    (Hungarian matching on their contingency table), so a recovered clustering
    shows the group strip and the clusters in the same colours. A group left
    without a cluster is drawn in grey shades.

    Parameters
    ----------
    truth : Sequence[int]
        Every client's true group.
    final : Sequence[int | None]
        Every client's cluster in the last round (``None``: not evaluated).
    colors : Mapping[int, tuple[float, ...]]
        Cluster id -> colour (:func:`cluster_colors`).
    """
    groups = sorted(set(int(g) for g in truth))
    clusters = sorted(colors)
    shared = np.zeros((len(groups), len(clusters)))
    for group, cluster in zip(truth, final, strict=True):
        if cluster is not None and int(cluster) in colors:
            shared[groups.index(int(group)), clusters.index(int(cluster))] += 1
    rows, cols = linear_sum_assignment(-shared) if shared.size else ([], [])
    matched = {groups[r]: colors[clusters[c]] for r, c in zip(rows, cols, strict=True)
               if shared[r, c] > 0}
    greys = [(0.35 + 0.5 * i / max(1, len(groups)),) * 3 for i in range(len(groups))]
    return {g: matched.get(g, greys[i]) for i, g in enumerate(groups)}


def plot_cluster_accuracy(
    history: Sequence[Sequence[float | None]],
    overall: Mapping[int, float],
    path: Path,
    title: str = "",
) -> Path:
    """Accuracy per round of every cluster's members, and the overall accuracy.

    Parameters
    ----------
    history : Sequence[Sequence[float | None]]
        Per round (round 1 first), each cluster's example-weighted accuracy over
        the nodes that used it; ``None`` where no node used the cluster. A
        cluster nobody ever used gets no line.
    overall : Mapping[int, float]
        Round -> the run's personalized accuracy (all nodes).
    path : Path
        PNG file to write.
    title : str
        What ran (strategy, data, ARI), above the plot's own title.
    """
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rounds = np.arange(1, len(history) + 1)
    num_clusters = max((len(row) for row in history), default=0)
    used = [j for j in range(num_clusters)
            if any(j < len(row) and row[j] is not None for row in history)]
    colors = cluster_colors(used)
    for j in used:
        values = [np.nan if j >= len(row) or row[j] is None else row[j] for row in history]
        ax.plot(rounds, values, marker=".", lw=1, color=colors[j], label=f"cluster {j}")
    if overall:
        ax.plot(sorted(overall), [overall[r] for r in sorted(overall)], "k--", lw=1.5,
                label="all clients")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(_titled(title, "accuracy of each cluster's clients per round"), fontsize=9)
    return _save(fig, path)


def plot_assignment_map(
    history: Sequence[Sequence[int | None]],
    truth: Sequence[int],
    path: Path,
    title: str = "",
    regret: Sequence[float] | None = None,
) -> Path:
    """Client x round map of the cluster each client used, clients grouped by true group.

    Parameters
    ----------
    history : Sequence[Sequence[int | None]]
        Per round, the cluster of every client (the order of ``truth``); ``None``
        where the client was not evaluated that round (drawn white).
    truth : Sequence[int]
        Every client's true group; the left strip shows it in the colour of the
        cluster that holds the group in the last round (:func:`group_colors`),
        and the rows are sorted by it, so a recovered clustering shows as blocks
        of one colour continuing the strip.
    path : Path
        PNG file to write.
    title : str
        What ran (strategy, data, ARI), above the plot's own title.
    regret : Sequence[float] | None
        Every client's final placement regret (the order of ``truth``): a client
        above :data:`~fl_clusters.placement_regret.REGRET_THRESHOLD` gets a cross
        in its last round's cell.
    """
    truth = np.asarray(truth, dtype=int)
    colors = cluster_colors([c for row in history for c in row if c is not None])
    index = {cluster: i for i, cluster in enumerate(colors)}
    grid = np.array(
        [[np.nan if c is None else index[int(c)] for c in row] for row in history], dtype=float
    ).T  # (clients, rounds), cluster positions in ``colors``
    order = np.argsort(truth, kind="stable")
    strip_colors = group_colors(truth, history[-1] if len(history) else [None] * truth.size,
                                colors)
    fig, (strip, ax) = plt.subplots(
        1, 2, figsize=(7, 0.18 * len(truth) + 1.8), width_ratios=(1, 14), sharey=True
    )
    strip.imshow([[strip_colors[g]] for g in truth[order]], aspect="auto",
                 interpolation="nearest")
    strip.set_xticks([])
    strip.set_ylabel("client (sorted by true group)")
    strip.set_title("true group", fontsize=8)
    cmap = ListedColormap([colors[c] for c in colors] or [(1.0, 1.0, 1.0)])
    image = ax.imshow(grid[order], cmap=cmap, vmin=-0.5, vmax=max(len(colors), 1) - 0.5,
                      aspect="auto", interpolation="nearest",
                      extent=(0.5, grid.shape[1] + 0.5, len(truth) - 0.5, -0.5))
    for boundary in np.flatnonzero(np.diff(truth[order])):
        ax.axhline(boundary + 0.5, color="k", lw=0.8)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    strip.yaxis.set_major_locator(MaxNLocator(integer=True))
    marks = _mark_regret(ax, regret, order, grid.shape[1])
    ax.set_title(_titled(title, f"cluster each client used per round{marks}"), fontsize=9)
    bar = fig.colorbar(image, ax=ax, ticks=range(len(colors)), label="cluster")
    bar.ax.set_yticklabels([str(c) for c in colors])
    return _save(fig, path)


def _mark_regret(
    ax: plt.Axes, regret: Sequence[float] | None, order: np.ndarray, last_round: int
) -> str:
    """Cross the last cell of each client above the regret threshold; the title's key to it."""
    if regret is None:
        return ""
    rows = np.flatnonzero(np.asarray(regret, dtype=float)[order] > REGRET_THRESHOLD)
    if not rows.size:
        return ""
    ax.autoscale(False)  # the crosses sit on the map's cells and must not widen it
    # Black with a white edge stays visible on every cluster colour and on white.
    ax.scatter(np.full(rows.size, last_round), rows, marker="X", s=80, c="k",
               edgecolors="w", linewidths=0.8, zorder=3)
    return f"; x: placement regret above {REGRET_THRESHOLD}"


def plot_similarity(
    matrix: np.ndarray, truth: Sequence[int], path: Path, title: str = ""
) -> Path:
    """The strategy's final pairwise client similarity, rows sorted by true group.

    Parameters
    ----------
    matrix : np.ndarray
        (n, n) similarities, rows and columns in the order of ``truth``.
    truth : Sequence[int]
        The true group of every row's client.
    path : Path
        PNG file to write.
    title : str
        What ran (strategy, data, ARI), above the plot's own title.
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
    ax.set_title(_titled(title, "final pairwise similarity"), fontsize=9)
    fig.colorbar(image, ax=ax)
    return _save(fig, path)


def write_run_plots(
    folder: Path,
    summary: Mapping[str, Any],
    overall: Mapping[int, float],
    truth: Sequence[int],
    similarity: np.ndarray | None = None,
    data: str = "",
) -> list[Path]:
    """Write every plot a run's data allow; a failing plot is logged, never raised.

    Parameters
    ----------
    folder : Path
        The run's results folder.
    summary : Mapping[str, Any]
        The run's summary; ``cluster_accuracy_history`` and ``assignment_history``
        are plotted when present, the latter with ``placement_regret``'s marks.
    overall : Mapping[int, float]
        Round -> personalized accuracy of all nodes.
    truth : Sequence[int]
        Every client's true group, in the summary's client order.
    similarity : np.ndarray | None
        The strategy's final (n, n) client similarity in the same order, if any.
    data : str
        The data the run trained on (e.g. "digits, rotation"), for the titles.

    Returns
    -------
    list[Path]
        The PNG files written.
    """
    title = run_title(summary, data)
    jobs = [
        (ACCURACY_PLOT, plot_cluster_accuracy,
         (summary.get("cluster_accuracy_history") or [[overall[r]] for r in sorted(overall)],
          overall)),
    ]
    if summary.get("assignment_history"):
        jobs.append((ASSIGNMENT_PLOT,
                     partial(plot_assignment_map, regret=summary.get("placement_regret")),
                     (summary["assignment_history"], truth)))
    if similarity is not None:
        jobs.append((SIMILARITY_PLOT, plot_similarity, (similarity, truth)))
    written = []
    for name, draw, args in jobs:
        try:
            written.append(draw(*args, folder / name, title))
        except Exception as error:  # a plot must never fail a finished run
            plt.close("all")
            log(WARNING, "plot %s not written: %s: %s", name, type(error).__name__, error)
    return written


def run_title(summary: Mapping[str, Any], data: str) -> str:
    """``strategy on data, ARI x.xx``: what a plot shows, from the run's summary."""
    parts = [str(summary.get("strategy", ""))]
    if data:
        parts.append(f"on {data}")
    title = " ".join(p for p in parts if p)
    if summary.get("ari") is not None:
        title += f", ARI {summary['ari']:.2f}"
    return title


def _titled(title: str, what: str) -> str:
    return f"{title}\n{what}" if title else what


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
