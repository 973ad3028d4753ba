"""Write docs/robustness.md's attack tables and plot from the attacks sweep's runs.

The sweep is ``benchmarks/sweeps/attacks.toml``, recorded under
``benchmarks/measured/sweeps/attacks/``. The page's block between the markers
``<!-- attacks: ... -->`` and ``<!-- /attacks -->`` is rewritten; the plot,
honest clients' accuracy against the attackers' share with one line per
strategy and a panel per attack, goes to ``benchmarks/measured/attacks.png``.
A cell that has not run for every seed says so; no figure is written that no run
measured.

    python docs/generate_attacks.py            # rewrite the block and the plot
    python docs/generate_attacks.py --check    # exit 1 when the block is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from docs.generated_page import write_or_check
from fl_clusters.files import atomic_output
from fl_clusters.sweep.cells import SEED_AXIS, Sweep
from fl_clusters.sweep.report import latest_lines
from fl_clusters.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "robustness.md"
SWEEP = ROOT / "benchmarks" / "sweeps" / "attacks.toml"
RUNS = ROOT / "benchmarks" / "measured" / "sweeps" / "attacks" / "runs.jsonl"
PLOT = ROOT / "benchmarks" / "measured" / "attacks.png"
BLOCK = re.compile(r"(<!-- attacks: [^>]*-->\n)(.*?)(<!-- /attacks -->)", re.DOTALL)
# A strategy "holds" an attack when its honest clients lose at most this much
# accuracy against its own clean runs (paired by seed, mean over seeds): the
# issue's 2 points.
HOLDS = 0.02
NOT_RUN = "not run yet"


def _lines() -> list[dict[str, Any]]:
    if not RUNS.exists():
        return []
    return [json.loads(line) for line in RUNS.read_text().splitlines() if line.strip()]


def honest_accuracy(summary: Mapping[str, Any]) -> float:
    """Honest clients' personalized accuracy: every client's in a run without attackers."""
    attack = summary.get("attack")
    if not attack:
        return float(summary["personalized_accuracy"])
    return float(attack["honest_personalized_accuracy"])


def measured(sweep: Sweep) -> dict[tuple[str, str], dict[int, Mapping[str, Any]]]:
    """(strategy, attack) -> seed -> the summary of its last ok run."""
    latest = latest_lines(sweep, _lines())
    found: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for cell in sweep.cells:
        line = latest.get(cell.key)
        if line is None or line.get("status") != "ok":
            continue
        labels = cell.labels
        found.setdefault((labels["strategy"], labels["attack"]), {})[
            int(labels[SEED_AXIS])] = line["summary"]
    return found


def _axis(sweep: Sweep, name: str) -> list[str]:
    return list(dict.fromkeys(cell.labels[name] for cell in sweep.cells))


def _kinds(attacks: Sequence[str]) -> dict[str, list[str]]:
    """Attack kind -> its cells by share (``sign-flip-20`` -> kind ``sign-flip``)."""
    kinds: dict[str, list[str]] = {}
    for attack in attacks:
        if attack != "none":
            kinds.setdefault(attack.rsplit("-", 1)[0], []).append(attack)
    return kinds


def _share(attack: str) -> int:
    return 0 if attack == "none" else int(attack.rsplit("-", 1)[1])


def _cell(runs: Mapping[int, Mapping[str, Any]] | None, seeds: int) -> str:
    if not runs or len(runs) < seeds:
        return NOT_RUN
    values = [honest_accuracy(s) for s in runs.values()]
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def _drop(clean: Mapping[int, Mapping[str, Any]], attacked: Mapping[int, Mapping[str, Any]]
          ) -> float | None:
    """Mean over the seeds both have of clean minus attacked honest accuracy."""
    seeds = sorted(set(clean) & set(attacked))
    if not seeds:
        return None
    return float(np.mean([honest_accuracy(clean[s]) - honest_accuracy(attacked[s])
                          for s in seeds]))


def _verdict(held: Sequence[tuple[int, bool]]) -> str:
    """"holds up to 20 %; breaks at 30 %" from (share, held) in increasing share."""
    if not held:
        return NOT_RUN
    breaks = [share for share, ok in held if not ok]
    if not breaks:
        return f"holds up to {held[-1][0]} %"
    holds = [share for share, _ in held if share < breaks[0]]
    return (f"holds up to {holds[-1]} %; " if holds else "") + f"breaks at {breaks[0]} %"


def accuracy_table(sweep: Sweep, found: Mapping[tuple[str, str], Any], kind: str,
                   cells: Sequence[str], seeds: int) -> list[str]:
    """One attack kind: honest accuracy per strategy and share, and where it holds."""
    header = ["strategy", "0 %", *(f"{_share(a)} %" for a in cells), "holds (within 2 points)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for strategy in _axis(sweep, "strategy"):
        clean = found.get((strategy, "none"), {})
        row = [strategy, _cell(clean, seeds)]
        held = []
        for attack in cells:
            attacked = found.get((strategy, attack), {})
            row.append(_cell(attacked, seeds))
            drop = _drop(clean, attacked) if len(attacked) == seeds == len(clean) else None
            if drop is not None:
                held.append((_share(attack), drop <= HOLDS))
        row.append(_verdict(held))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _mean_field(runs: Mapping[int, Mapping[str, Any]], name: str, seeds: int) -> str:
    values = [s["attack"].get(name) for s in runs.values() if s.get("attack")]
    values = [v for v in values if v is not None]
    if len(runs) < seeds:
        return NOT_RUN
    return f"{np.mean(values):.2f}" if values else "-"


def side_table(sweep: Sweep, found: Mapping[tuple[str, str], Any], attacks: Sequence[str],
               name: str, seeds: int) -> list[str]:
    """A field of the attack section per strategy (rows) and attack cell (columns)."""
    lines = ["| strategy | " + " | ".join(attacks) + " |", "|---|" + "---|" * len(attacks)]
    for strategy in _axis(sweep, "strategy"):
        lines.append(f"| {strategy} | " + " | ".join(
            _mean_field(found.get((strategy, a), {}), name, seeds) for a in attacks) + " |")
    return lines


def _base(strategy: str) -> str:
    """The strategy a robust variant is of: ``ifca-median`` -> ``ifca``, FedMedian -> FedAvg."""
    return "fedavg" if strategy == "fedmedian" else strategy.removesuffix("-median")


def plot(sweep: Sweep, found: Mapping[tuple[str, str], Any], path: Path) -> None:
    """Honest accuracy against the attackers' share: one panel per kind, a line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    kinds = _kinds(_axis(sweep, "attack"))
    # A strategy and its robust variant share a colour; the median is dashed.
    bases = list(dict.fromkeys(_base(s) for s in _axis(sweep, "strategy")))
    colours = {base: f"C{i}" for i, base in enumerate(bases)}
    figure, axes = plt.subplots(1, len(kinds), figsize=(3.2 * len(kinds), 3.4), sharey=True)
    for axis, (kind, cells) in zip(np.atleast_1d(axes), kinds.items(), strict=True):
        for strategy in _axis(sweep, "strategy"):
            points = [(_share(a), np.mean([honest_accuracy(s) for s in runs.values()]))
                      for a in ("none", *cells) if (runs := found.get((strategy, a)))]
            if points:
                style = "-" if _base(strategy) == strategy else "--"
                axis.plot(*zip(*points, strict=True), style, marker="o", label=strategy,
                          color=colours[_base(strategy)])
        axis.set_title(kind)
        axis.set_xlabel("attackers (%)")
    np.atleast_1d(axes)[0].set_ylabel("honest clients' accuracy")
    np.atleast_1d(axes)[-1].legend(fontsize=7)
    figure.tight_layout()
    with atomic_output(path) as out:
        figure.savefig(out, format="png", dpi=110)
    plt.close(figure)


def render(sweep: Sweep) -> str:
    """The block's text, from the sweep's recorded runs."""
    found = measured(sweep)
    seeds = len({cell.labels[SEED_AXIS] for cell in sweep.cells})
    attacks = _axis(sweep, "attack")
    kinds = _kinds(attacks)
    runs = _lines()
    commits = sorted({line.get("git_commit", "")[:7] for line in runs if line.get("git_commit")})
    out = [f"From `benchmarks/measured/sweeps/attacks/runs.jsonl` ({len(runs)} runs recorded; "
           f"commits {', '.join(commits) or '-'}); mean ± standard deviation over {seeds} "
           "seeds of the honest clients' personalized accuracy. \"holds\": the honest clients "
           "lose at most 2 points against the same strategy's clean runs (paired by seed), at "
           "every share up to the one named.", "",
           "![honest accuracy against attacker share](../benchmarks/measured/attacks.png)", ""]
    for kind, cells in kinds.items():
        out += [f"**{kind}**", "", *accuracy_table(sweep, found, kind, cells, seeds), ""]
    backdoor = kinds.get("backdoor", [])
    if backdoor:
        out += ["Backdoor success on honest clients' test inputs (share of triggered inputs "
                "not of the target class that the model puts in it; mean over seeds):", "",
                *side_table(sweep, found, backdoor, "honest_backdoor_success", seeds), ""]
    attacked = [a for a in attacks if a.endswith("-20")]
    out += ["Where the attackers end (20 % attackers): the share of attackers in clusters "
            "without an honest client (isolated), then the share of honest clients whose "
            "cluster holds an attacker (mean over seeds):", "",
            *side_table(sweep, found, attacked, "attackers_isolated", seeds), "",
            *side_table(sweep, found, attacked, "honest_clients_with_attackers", seeds), ""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/robustness.md's attack block is out of date")
    args = parser.parse_args(argv)
    sweep = load_sweep(SWEEP)
    page = PAGE.read_text()
    match = BLOCK.search(page)
    if match is None:
        print(f"{PAGE} has no '<!-- attacks: ... -->' block", file=sys.stderr)
        return 2
    new = page[:match.start(2)] + render(sweep) + "\n" + page[match.end(2):]
    status = write_or_check(PAGE, new, check=args.check,
                            command="python docs/generate_attacks.py")
    if not args.check and RUNS.exists():
        plot(sweep, measured(sweep), PLOT)
        print(f"wrote {PLOT}")
    return status


if __name__ == "__main__":
    sys.exit(main())
