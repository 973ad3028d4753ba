"""docs/reproductions.md: each paper's headline claims against the reproduction sweeps.

One sweep file per paper, ``benchmarks/sweeps/reproduce-<name>.toml``, runs the
paper's experiment as closely as the offline data allow (its comments say what was
scaled down); ``make reproduce-papers`` writes the runs to
``benchmarks/measured/sweeps/reproduce-<name>/``. Each headline claim
(docs/reproduction_claims.py's :data:`CLAIMS`) compares two cells of one sweep, or
two metrics of one cell, seed by seed, under each preset: the paired differences'
mean and 95 % interval (Student's t, :func:`fl_clusters.sweep.report.spread`) give
the verdict (:func:`verdict`). A sweep that has not run, or not for every seed,
gives "not run yet": no number is written that no run measured.

    python docs/generate_reproductions.py            # rewrite docs/reproductions.md
    python docs/generate_reproductions.py --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docs.generated_page import write_or_check
from docs.reproduction_claims import CLAIMS, HONEST_ACCURACY, Claim
from fl_clusters.sweep.cells import SEED_AXIS, Sweep
from fl_clusters.sweep.report import latest_lines, spread, stale_runs
from fl_clusters.sweep.spec import load_sweep
from fl_clusters.sweep.twins import SAME_RUN_AS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reproductions.md"
SWEEPS = ROOT / "benchmarks" / "sweeps"
MEASURED = ROOT / "benchmarks" / "measured" / "sweeps"
PRESETS = ("paper", "robust")
PRESET_AXIS = "preset"
# Verdicts, from the paired differences' 95 % interval.
REPRODUCED, NOT_SIGNIFICANT, CONTRADICTED = "reproduced", "not significant", "contradicted"
# No verdict: the two sides are one model, or a clustered side never clustered.
NOT_TESTED = "not tested"
NOT_RUN = "not run yet"
# Strategies that do not cluster (one model, or one model a client): no row in a
# section's table of what the clustering did.
NOT_CLUSTERING = ("fedavg", "fedprox", "fedmedian", "local")




def value(line: Mapping[str, Any], name: str) -> float | None:
    """A run's ``name``: a summary field; a list field's mean (None: not measured).

    ``honest_personalized_accuracy`` is the attack section's, and a run without
    attackers' ``personalized_accuracy`` (every client in it is honest).
    """
    if line.get("status") != "ok":
        return None
    summary = line["summary"]
    if name == HONEST_ACCURACY:
        attack = summary.get("attack")
        found = attack.get(name) if attack else summary.get("personalized_accuracy")
        return None if found is None else float(found)
    found = summary.get(name)
    if isinstance(found, list):
        numbers = [float(item) for item in found if item is not None]
        return sum(numbers) / len(numbers) if numbers else None
    return None if found is None else float(found)


@dataclass
class Comparison:
    """One claim under one preset: each side's per-seed values and their differences."""

    cell: dict[int, float] = field(default_factory=dict)
    other: dict[int, float] = field(default_factory=dict)
    differences: dict[int, float] = field(default_factory=dict)
    # A clustering side's label -> whether each of its runs ended with more than one
    # cluster (sides of strategies that do not cluster are left out).
    clustered: dict[str, list[bool]] = field(default_factory=dict)
    commits: set[str] = field(default_factory=set)
    dirty: bool = False
    stale: int = 0


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    return all(labels.get(axis) == label for axis, label in wanted.items())


def compare(
    sweep: Sweep, runs: Sequence[Mapping[str, Any]], claim: Claim, preset: str
) -> Comparison:
    """Pair ``claim``'s two sides seed by seed under ``preset``.

    Each cell of the ``cell`` side is paired with the cell that has the same labels
    but ``other``'s; the pairs of one seed (over the axes the claim leaves open) are
    averaged, so that every seed counts once.
    """
    latest = latest_lines(sweep, runs)
    stale = {cell.key for cell, _ in stale_runs(sweep, runs)}
    by_labels = {tuple(sorted(cell.labels.items())): cell for cell in sweep.cells}
    sides: dict[int, list[tuple[float, float]]] = {}
    found = Comparison()
    for cell in sweep.cells:
        if not _matches(cell.labels, {**claim.cell, PRESET_AXIS: preset}):
            continue
        partner = by_labels.get(tuple(sorted({**cell.labels, **claim.other}.items())))
        if partner is None or cell.key not in latest or partner.key not in latest:
            continue
        lines = (latest[cell.key], latest[partner.key])
        mine = value(lines[0], claim.metric)
        theirs = value(lines[1], claim.other_metric or claim.metric)
        if mine is None or theirs is None:
            continue
        sides.setdefault(int(cell.labels[SEED_AXIS]), []).append((mine, theirs))
        for side, line in zip((claim.cell, claim.other), lines, strict=True):
            strategy = line.get("settings", {}).get("strategy")
            clusters = line["summary"].get("num_clusters_found")
            if strategy is not None and strategy not in NOT_CLUSTERING and clusters is not None:
                found.clustered.setdefault(", ".join(side.values()), []).append(
                    int(clusters) > 1)
        found.commits |= {str(line.get("git_commit", ""))[:10] for line in lines}
        found.dirty |= any(line.get("git_dirty") for line in lines)
        found.stale += len({cell.key, partner.key} & stale)
    for seed, pairs in sorted(sides.items()):
        found.cell[seed] = sum(mine for mine, _ in pairs) / len(pairs)
        found.other[seed] = sum(theirs for _, theirs in pairs) / len(pairs)
        found.differences[seed] = found.cell[seed] - found.other[seed]
    return found


def verdict(differences: Sequence[float], relation: str, margin: float = 0.0) -> str:
    """The verdict of paired differences (claimed side minus the other), by their 95 % interval.

    ``">"``: reproduced when the interval lies above 0, contradicted when below,
    otherwise not significant. ``"~"``: reproduced when the interval lies inside
    [-margin, margin], contradicted when it lies wholly outside, otherwise not
    significant.
    """
    summary = spread(list(differences))
    if summary["n"] < 2 or summary["ci95"] is None:
        raise ValueError("a verdict needs the differences of at least two seeds")
    low = float(summary["mean"]) - float(summary["ci95"])  # type: ignore[arg-type]
    high = float(summary["mean"]) + float(summary["ci95"])  # type: ignore[arg-type]
    if relation == ">":
        inside, outside = low > 0, high < 0
    else:
        inside = -margin <= low and high <= margin
        outside = high < -margin or low > margin
    return REPRODUCED if inside else CONTRADICTED if outside else NOT_SIGNIFICANT


def _interval(values: Sequence[float], signed: bool = False) -> str:
    summary = spread(list(values))
    mean = f"{summary['mean']:+.3f}" if signed else f"{summary['mean']:.3f}"
    return f"{mean} ± {summary['ci95']:.3f}" if summary["ci95"] is not None else mean


def cell_text(claim: Claim, comparison: Comparison, seeds: int) -> tuple[str, str]:
    """The row's figures and verdict under one preset, or "not run yet"."""
    ran = len(comparison.differences)
    if ran < seeds:
        return (f"{NOT_RUN} ({ran} of {seeds} seeds)" if ran else NOT_RUN), NOT_RUN
    figures = (f"{_interval(list(comparison.cell.values()))} vs "
               f"{_interval(list(comparison.other.values()))}; Δ "
               f"{_interval(list(comparison.differences.values()), signed=True)}")
    untested = untested_reason(comparison)
    if untested is not None:
        return figures, f"{NOT_TESTED}: {untested}" + (
            f" ({claim.caveat})" if claim.caveat else "")
    outcome = verdict(list(comparison.differences.values()), claim.relation, claim.margin)
    notes = [] if outcome == REPRODUCED or not claim.caveat else [claim.caveat]
    return figures, outcome + (f" ({'; '.join(notes)})" if notes else "")


def untested_reason(comparison: Comparison) -> str | None:
    """Why the claim has no verdict here, or None: two sides that scored the same in
    every seed are one model, and a clustered side that never clustered is FedAvg."""
    if not any(comparison.differences.values()):
        return "the two sides scored the same in every seed: nothing told them apart"
    never = [side for side, flags in comparison.clustered.items() if not any(flags)]
    if never:
        return (f"{' and '.join(never)} never clustered (one cluster in every seed), so the "
                "comparison is against one global model")
    return None


def _runs(name: str) -> list[dict[str, Any]]:
    path = MEASURED / name / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _hours(runs: Sequence[Mapping[str, Any]]) -> float:
    """The hours the runs took; a line that repeats another cell's run took none."""
    return sum(float(run.get("seconds", 0.0)) for run in runs
               if SAME_RUN_AS not in run) / 3600


def clustering_table(sweep: Sweep, runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each clustered cell's runs found, per preset: in how many seeds it ended with
    more than one cluster, the clusters found and the ARI (means over its seeds)."""
    latest = latest_lines(sweep, runs)
    found: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for cell in sweep.cells:
        line = latest.get(cell.key)
        if line is None or line.get("status") != "ok" \
                or line.get("run_config", {}).get("strategy") in NOT_CLUSTERING:
            continue
        row = ", ".join(label for axis, label in cell.labels.items()
                        if axis not in (SEED_AXIS, PRESET_AXIS))
        found.setdefault(row, {}).setdefault(cell.labels[PRESET_AXIS], []).append(
            line["summary"])
    if not found:
        return []
    lines = ["What the clustering did (seeds that ended with more than one cluster; the "
             "clusters found and the ARI, means over those seeds):", "",
             "| cell | `paper` | `robust` |", "|---|---|---|"]
    for row, by_preset in found.items():
        texts = [_clustering_text(by_preset.get(preset, [])) for preset in PRESETS]
        lines.append(f"| {row} | " + " | ".join(texts) + " |")
    return [*lines, ""]


def _clustering_text(summaries: Sequence[Mapping[str, Any]]) -> str:
    if not summaries:
        return NOT_RUN
    clusters = [int(summary["num_clusters_found"]) for summary in summaries]
    return (f"more than one cluster in {sum(k > 1 for k in clusters)} of {len(clusters)} "
            f"seeds; {spread(clusters)['mean']:.1f} clusters; ARI "
            f"{spread([float(summary['ari']) for summary in summaries])['mean']:.2f}")


HEAD = """# Reproductions: each paper's headline claims, measured

Generated by docs/generate_reproductions.py from the reproduction sweeps,
`benchmarks/sweeps/reproduce-*.toml` (one per seed paper, and one each for
CFL, FL+HC, WeCFL and FedEM), whose runs `make reproduce-papers` records under
`benchmarks/measured/sweeps/`, a folder per sweep (resumable: a sweep started again
skips the runs it has recorded; docs/sweeps.md). Each file's comments cite the
source of every setting and say what was scaled down to fit 2 CPU cores and why
(Fashion-MNIST stands in for MNIST, EMNIST and CIFAR-10). Each file was sized to
about an hour on 2 cores (estimated from the clustering matrix's run times); the
hours each sweep's recorded runs took are in its section.

A row is one headline claim. "ours" gives the claimed side against the other side,
mean ± 95 % half-width (Student's t) over seeds 0-4, and Δ, their paired difference
seed by seed (on a sweep axis the claim leaves open, such as ACFL's alphas, the
values of a seed are averaged first). The verdict reads Δ's 95 % interval: for
"A beats B", **reproduced** when it lies above 0, **contradicted** when below 0, and
**not significant** when it holds 0; for "A is as accurate as B (within m)",
reproduced when it lies inside [-m, m], contradicted when wholly outside. Where a
claim does not reproduce, the verdict names what differs from the paper's setting;
a claim has **not tested** instead of a verdict when its two sides scored the same in
every seed (one model) or a clustered side never clustered (one cluster in every
seed: it was FedAvg), with the reason;
a contradicted claim is a result, not a failure. A sweep that has not run for
every seed says "not run yet": no figure is written that no run measured. Below
each section's claims, a table says what each clustered cell's runs found (in how
many seeds more than one cluster, the clusters and the ARI): two sides that never
split give the same model, which a verdict row alone would not show.
"""


def render() -> str:
    """The page, from :data:`CLAIMS` and the measured sweeps."""
    recorded_runs = {name: _runs(name) for name in dict.fromkeys(c.sweep for c in CLAIMS)}
    total = sum(_hours(runs) for runs in recorded_runs.values())
    out = [HEAD, f"`make reproduce-papers` runs all {len(recorded_runs)} sweeps: their "
           f"recorded runs took {total:.1f} h in all (the sum of their wall times on 2 CPU "
           "cores, often beside another sweep).", ""]
    for name, runs in recorded_runs.items():
        sweep = load_sweep(SWEEPS / f"{name}.toml")
        seeds = len({cell.labels[SEED_AXIS] for cell in sweep.cells})
        repeats = sum(SAME_RUN_AS in run for run in runs)
        recorded = (f"runs `benchmarks/measured/sweeps/{name}/runs.jsonl` ({len(runs)} "
                    "recorded, "
                    + (f"{repeats} of them the same run as another cell's, " if repeats else "")
                    + f"{_hours(runs):.1f} h)" if runs else "no runs recorded yet")
        out += [f"## {name}", "", sweep.description.strip().replace("\n", " "), "",
                f"Sweep file `benchmarks/sweeps/{name}.toml`; {recorded}.",
                "", "| claim | the paper | source | ours, `paper` | verdict, `paper` "
                "| ours, `robust` | verdict, `robust` | commits |",
                "|---|---|---|---|---|---|---|---|"]
        for claim in (claim for claim in CLAIMS if claim.sweep == name):
            cells, commits, notes = [], set(), []
            for preset in PRESETS:
                comparison = compare(sweep, runs, claim, preset)
                cells += cell_text(claim, comparison, seeds)
                commits |= comparison.commits
                if comparison.stale:
                    notes.append(f"{comparison.stale} stale runs under {preset}")
                if comparison.dirty:
                    notes.append(f"a run under {preset} ran on a dirty checkout")
            commit_text = ", ".join(sorted(commits)) or "-"
            if notes:
                commit_text += " (" + "; ".join(notes) + ")"
            out.append(f"| {claim.text} | {claim.paper} | {claim.source} | "
                       + " | ".join(cells) + f" | {commit_text} |")
        out += ["", *clustering_table(sweep, runs)]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/reproductions.md is out of date")
    args = parser.parse_args(argv)
    return write_or_check(PAGE, render(), check=args.check,
                          command="python docs/generate_reproductions.py")


if __name__ == "__main__":
    sys.exit(main())
