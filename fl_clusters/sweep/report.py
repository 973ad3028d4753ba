"""A sweep's table and plots, from its ``runs.jsonl``.

Cells that differ only in their seed form one row of the table: the mean and the
spread (sample standard deviation) of each metric over the seeds that ran, and,
against each baseline, the paired difference: this cell's value minus the
baseline's value for the same seed and the same other axes, averaged over the
seeds where both ran, with its spread and a 95 % confidence half-width (Student's
t). The table is written as ``table.csv`` (every figure in its own column) and
``table.md``; the plots show every seed's value beside the mean. A recorded run
that a setting it used no longer matches (:func:`stale_runs`) still counts, and
``table.md`` names it and the setting under the table. A cell recorded from another
cell's run (``same_run_as``, :mod:`fl_clusters.sweep.twins`) counts as that cell's
run, and is stale when that run is.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fl_clusters.sweep.cells import GPUS_KEY, Cell, Sweep
from fl_clusters.sweep.twins import Change, latest_by_key, line_changes

# (field of a run's line or its summary, heading)
METRICS = (
    ("personalized_accuracy", "accuracy"),
    ("ari", "ARI"),
    ("nmi", "NMI"),
    ("num_clusters_found", "clusters"),
    ("rounds_to_target", "rounds to target"),
    ("bytes_sent", "bytes sent"),
    ("seconds", "seconds"),
)
# Metrics the table and plots pair against the baseline.
PAIRED = (("personalized_accuracy", "accuracy"), ("ari", "ARI"))
PLOTTED = (("personalized_accuracy", "personalized accuracy", "accuracy.png"),
           ("ari", "ARI", "ari.png"))
PANEL_COLUMNS = 4
DPI = 80


def metric(line: Mapping[str, Any], name: str) -> float | None:
    """A run's value of ``name`` (a summary field, or the run's ``seconds``)."""
    if line.get("status") != "ok":
        return None
    value = line["summary"].get(name) if name in line["summary"] else line.get(name)
    return None if value is None else float(value)


def spread(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, sample standard deviation, 95 % confidence half-width (t), min, max, n."""
    n = len(values)
    if n == 0:
        return {"mean": None, "std": None, "ci95": None, "min": None, "max": None, "n": 0}
    array = np.asarray(values, dtype=float)
    std = float(array.std(ddof=1)) if n > 1 else None
    ci95 = float(stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)) if std is not None else None
    return {"mean": float(array.mean()), "std": std, "ci95": ci95,
            "min": float(array.min()), "max": float(array.max()), "n": n}


def latest_lines(sweep: Sweep, runs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Cell key -> its last recorded line, for the cells of the sweep as it is now."""
    keys = {cell.key for cell in sweep.cells}
    return {key: line for key, line in latest_by_key(runs).items() if key in keys}


def stale_runs(
    sweep: Sweep, runs: Sequence[Mapping[str, Any]]
) -> list[tuple[Cell, list[Change]]]:
    """The cells whose last recorded run used a setting that has another value now,
    or repeats a run that was run again or is stale itself.

    Each with what changed (:func:`fl_clusters.sweep.twins.line_changes`), in the
    sweep's cell order; the next sweep runs (or records) these cells again.
    """
    latest = latest_lines(sweep, runs)
    cells = {cell.key: cell for cell in sweep.cells}
    found = []
    for cell in sweep.cells:
        if cell.key in latest and (changes := line_changes(cell, latest[cell.key], latest,
                                                           cells)):
            found.append((cell, changes))
    return found


def _group(sweep: Sweep, cell: Cell) -> tuple[str, ...]:
    return tuple(cell.labels[name] for name in sweep.group_axes)


def paired_differences(
    sweep: Sweep, latest: Mapping[str, Mapping[str, Any]], name: str
) -> dict[tuple[tuple[str, ...], str], list[tuple[int, float]]]:
    """``(group, baseline) -> [(seed, cell - baseline)]`` for every paired seed.

    A cell is paired with the cell that has the baseline's value on the baseline
    axis and the same value on every other axis, the seed included.
    """
    if sweep.baseline_axis is None:
        return {}
    by_labels = {tuple(sorted(cell.labels.items())): cell for cell in sweep.cells}
    found: dict[tuple[tuple[str, ...], str], list[tuple[int, float]]] = {}
    for cell in sweep.cells:
        for baseline in sweep.baselines:
            if cell.labels[sweep.baseline_axis] == baseline:
                continue
            partner = by_labels.get(
                tuple(sorted({**cell.labels, sweep.baseline_axis: baseline}.items()))
            )
            pairs = found.setdefault((_group(sweep, cell), baseline), [])
            if partner is None or cell.key not in latest or partner.key not in latest:
                continue
            mine, theirs = metric(latest[cell.key], name), metric(latest[partner.key], name)
            if mine is not None and theirs is not None:
                pairs.append((int(cell.settings["seed"]), mine - theirs))
    return found


def table_rows(sweep: Sweep, runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell without its seed: run counts, spreads, paired differences."""
    latest = latest_lines(sweep, runs)
    groups: dict[tuple[str, ...], list[Cell]] = {}
    for cell in sweep.cells:
        groups.setdefault(_group(sweep, cell), []).append(cell)
    differences = {name: paired_differences(sweep, latest, name) for name, _ in PAIRED}
    rows = []
    for group, cells in groups.items():
        lines = [latest[cell.key] for cell in cells if cell.key in latest]
        row: dict[str, Any] = dict(zip(sweep.group_axes, group, strict=True))
        row["seeds"] = ",".join(
            str(cell.settings["seed"]) for cell in cells
            if latest.get(cell.key, {}).get("status") == "ok"
        )
        row["runs_ok"] = sum(line["status"] == "ok" for line in lines)
        row["runs_failed"] = sum(line["status"] != "ok" for line in lines)
        row["runs_missing"] = len(cells) - len(lines)
        # A GPU's numbers and seconds are not a CPU's: the table says which ran where.
        row["runs_on_gpu"] = sum(
            line["status"] == "ok"
            and float(line.get("federation", {}).get(GPUS_KEY) or 0.0) > 0.0
            for line in lines
        )
        for name, _ in METRICS:
            values = [v for v in (metric(line, name) for line in lines) if v is not None]
            for stat, value in spread(values).items():
                row[f"{name}_{stat}"] = value
        for name, _ in PAIRED:
            for baseline in sweep.baselines:
                pairs = differences[name].get((group, baseline))
                if pairs is None:  # this row is that baseline
                    continue
                for stat, value in spread([d for _, d in pairs]).items():
                    row[f"{name}_minus_{baseline}_{stat}"] = value
        rows.append(row)
    return rows


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Every row's figures, one column each; an absent figure is an empty field."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def _mean_spread(row: Mapping[str, Any], name: str, digits: int, signed: bool = False) -> str:
    mean, std = row.get(f"{name}_mean"), row.get(f"{name}_std")
    if mean is None:
        return "-"
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text + ("" if std is None else f" ± {std:.{digits}f}")


def markdown(
    sweep: Sweep, rows: Sequence[Mapping[str, Any]],
    stale: Sequence[tuple[Cell, Sequence[Change]]] = (),
) -> str:
    """The table as Markdown: mean ± spread over seeds, paired differences with n.

    ``stale`` (:func:`stale_runs`) is listed under the table, one run a line.
    """
    headings = [*sweep.group_axes, "seeds", "accuracy", "ARI", "clusters",
                "rounds to target (reached)", "MB sent", "s"]
    for baseline in sweep.baselines:
        headings += [f"Δ accuracy vs {baseline} (n)", f"Δ ARI vs {baseline} (n)"]
    lines = [
        f"# Sweep {sweep.name}",
        "",
        *( [sweep.description.strip(), ""] if sweep.description.strip() else []),
        "Mean ± sample standard deviation over seeds; Δ: paired difference (this row "
        "minus the baseline, seed by seed).",
        "",
        "| " + " | ".join(headings) + " |",
        "|" + "---|" * len(headings),
    ]
    for row in rows:
        runs = row["seeds"] or "-"
        if row["runs_failed"] or row["runs_missing"]:
            runs += f" ({row['runs_failed']} failed, {row['runs_missing']} not run)"
        if row["runs_on_gpu"]:
            runs += f" ({row['runs_on_gpu']} on GPU)"
        reached = row["rounds_to_target_n"]
        mb = row.get("bytes_sent_mean")
        cells = [
            *(str(row[axis]) for axis in sweep.group_axes),
            runs,
            _mean_spread(row, "personalized_accuracy", 4),
            _mean_spread(row, "ari", 3),
            _mean_spread(row, "num_clusters_found", 1),
            f"{_mean_spread(row, 'rounds_to_target', 1)} ({reached}/{row['runs_ok']})",
            "-" if mb is None else f"{mb / 1e6:.1f}",
            _mean_spread(row, "seconds", 0),
        ]
        for baseline in sweep.baselines:
            for name, _ in PAIRED:
                prefix = f"{name}_minus_{baseline}"
                if f"{prefix}_n" not in row:
                    cells.append("")
                    continue
                digits = 4 if name == "personalized_accuracy" else 3
                cells.append(f"{_mean_spread(row, prefix, digits, signed=True)} "
                             f"({row[f'{prefix}_n']})")
        lines.append("| " + " | ".join(cells) + " |")
    if stale:
        lines += ["", "Stale runs, counted above: a setting they used has another value now "
                  "(the next sweep runs them again):", ""]
        lines += [f"- {cell.name} ran with {'; '.join(map(str, changes))}"
                  for cell, changes in stale]
    return "\n".join(lines) + "\n"


def _facets(sweep: Sweep) -> tuple[str | None, list[str]]:
    """The axis along each panel's x axis, and the axes that tell panels apart."""
    axes = sweep.group_axes
    compared = sweep.baseline_axis or (axes[0] if axes else None)
    return compared, [axis for axis in axes if axis != compared]


def _draw(
    path: Path, panels: Mapping[str, list[tuple[str, list[float], bool]]], ylabel: str,
    zero_line: bool,
) -> None:
    """One panel per entry: each x's values as points, their mean as a bar, ± std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(PANEL_COLUMNS, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.0 * rows),
                             squeeze=False)
    for ax, (title, bars) in zip(axes.flat, panels.items(), strict=False):
        for x, (_, values, highlight) in enumerate(bars):
            if values:
                ax.bar(x, np.mean(values), color="0.75" if highlight else "C0", alpha=0.8,
                       yerr=np.std(values, ddof=1) if len(values) > 1 else None, capsize=3)
                ax.scatter(np.full(len(values), x), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(bars)), [label for label, _, _ in bars],
                      rotation=30 if len(bars) > 3 else 0, ha="right" if len(bars) > 3 else
                      "center", fontsize=8)
        if zero_line:
            ax.axhline(0.0, color="k", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_plots(sweep: Sweep, runs: Sequence[Mapping[str, Any]], folder: Path) -> list[Path]:
    """``accuracy.png`` and ``ari.png`` (every seed per cell), and with a baseline
    ``paired-difference.png`` (every seed's difference to it)."""
    latest = latest_lines(sweep, runs)
    compared, panel_axes = _facets(sweep)
    written = []

    def panel_of(cell: Cell) -> str:
        title = ", ".join(cell.labels[axis] for axis in panel_axes)
        return title or sweep.name

    for name, ylabel, filename in PLOTTED:
        panels: dict[str, dict[str, list[float]]] = {}
        for cell in sweep.cells:
            x = cell.labels[compared] if compared else sweep.name
            values = panels.setdefault(panel_of(cell), {}).setdefault(x, [])
            value = metric(latest[cell.key], name) if cell.key in latest else None
            if value is not None:
                values.append(value)
        drawn = {
            title: [(x, v, x in sweep.baselines) for x, v in bars.items()]
            for title, bars in panels.items()
        }
        _draw(folder / filename, drawn, ylabel, zero_line=False)
        written.append(folder / filename)
    if sweep.baseline_axis is not None:
        differences = {name: paired_differences(sweep, latest, name) for name, _ in PAIRED}
        group_axes = sweep.group_axes
        drawn_differences: dict[str, list[tuple[str, list[float], bool]]] = {}
        for name, label in PAIRED:
            for (group, baseline), pairs in differences[name].items():
                labels = dict(zip(group_axes, group, strict=True))
                title = ", ".join(labels[axis] for axis in panel_axes) or sweep.name
                drawn_differences.setdefault(f"Δ {label}: {title}", []).append(
                    (f"{labels[sweep.baseline_axis]} - {baseline}", [d for _, d in pairs], False)
                )
        path = folder / "paired-difference.png"
        _draw(path, drawn_differences, "difference to baseline", zero_line=True)
        written.append(path)
    return written


def write_report(
    sweep: Sweep, runs: Sequence[Mapping[str, Any]], folder: Path, plots: bool = True
) -> list[Path]:
    """Write ``table.csv``, ``table.md`` and (``plots``) the PNGs; their paths."""
    rows = table_rows(sweep, runs)
    write_csv(rows, folder / "table.csv")
    (folder / "table.md").write_text(markdown(sweep, rows, stale_runs(sweep, runs)))
    written = [folder / "table.csv", folder / "table.md"]
    if plots and any(line.get("status") == "ok" for line in latest_lines(sweep, runs).values()):
        written += write_plots(sweep, runs, folder)
    return written

