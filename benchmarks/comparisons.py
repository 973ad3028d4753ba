"""Two comparisons where a method's strength can show, over seeds, with paired differences.

(a) FedSoft against FedAvg, IFCA and local-only on a label-permutation mixture
    (each client mixes two sources whose labels are permuted differently, so the
    sources conflict for one network) and on the rotation mixture.
(b) FLDC against FedAvg where DBSCAN can find strata: four rotation groups, no
    label skew. FedAvg samples the same fraction of clients (``fldc-r``) a round.

Every run is one real Flower simulation (Ray backend, the fl-clusters ServerApp
and ClientApp) on scikit-learn's digits, 20 clients, the MLP. The seed
(run-config key ``seed``) draws the partition, the initial model and sampling, so
the strategies of one seed see the same clients: the difference per seed is paired.
Writes ``benchmarks/measured/comparisons.json`` after every run (a cut-off run
keeps what it measured) and ``comparisons.png``.

    nice -n 5 python benchmarks/comparisons.py                  # 5 seeds, every scenario
    nice -n 5 python benchmarks/comparisons.py --seeds 3 strata
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from flwr.simulation import run_simulation

from fl_clusters.client_app import build_client_app
from fl_clusters.server_app import build_server_app

OUT = Path(__file__).resolve().parent / "measured"
NUM_CLIENTS = 20

# FedSoft's acceptance federation (tests/test_fedsoft.py), shortened to 20 rounds.
MIXTURE = {
    "num-clusters": 2, "mixture-alpha": 0.1, "validation-fraction": 0.0,
    "copy-per-group": True, "local-steps": 20, "num-rounds": 20, "plots": False,
}
FEDSOFT = {"strategy": "fedsoft", "fedsoft-init": "local-kmeans", "fedsoft-lambda": 0.01}
STRATA = {
    "cluster-structure": "rotation", "num-clusters": 4, "copy-per-group": True,
    "num-rounds": 20, "plots": False,
}

# scenario -> (shared run config, {strategy label: its overrides}, label compared).
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]], str]] = {
    "label-permutation-mixture": (
        {**MIXTURE, "cluster-structure": "label-permutation-mixture"},
        {"fedsoft": FEDSOFT, "fedavg": {"strategy": "fedavg"}, "ifca": {"strategy": "ifca"},
         "local": {"strategy": "local"}},
        "fedsoft",
    ),
    "strata": (
        STRATA,
        {"fldc": {"strategy": "fldc"},
         "fldc-silhouette": {"strategy": "fldc", "fldc-eps-method": "silhouette"},
         "fedavg": {"strategy": "fedavg", "fraction-train": 0.2}},
        "fldc",
    ),
    "rotation-mixture": (
        {**MIXTURE, "cluster-structure": "rotation-mixture", "rotation-step": 90},
        {"fedsoft": FEDSOFT, "fedavg": {"strategy": "fedavg"}, "ifca": {"strategy": "ifca"},
         "local": {"strategy": "local"}},
        "fedsoft",
    ),
}
KEPT = ("personalized_accuracy", "ari", "num_clusters_found", "rounds_to_target", "wall_time_s")


def run_once(config: dict[str, Any]) -> dict[str, Any]:
    """One simulated federation; returns its ``summary.json``."""
    with tempfile.TemporaryDirectory() as folder:
        settings = {"results-dir": folder, "min-nodes": NUM_CLIENTS, **config}
        run_simulation(
            server_app=build_server_app(settings),
            client_app=build_client_app(settings),
            num_supernodes=NUM_CLIENTS,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        summaries = list(Path(folder).glob("*/summary.json"))
        if len(summaries) != 1:
            raise RuntimeError(f"run {config} wrote no summary.json; see the log above")
        return json.loads(summaries[0].read_text())


def stats(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation, min and max."""
    array = np.asarray(values, dtype=float)
    return {
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if array.size > 1 else 0.0,
        "min": float(array.min()),
        "max": float(array.max()),
        "n": int(array.size),
    }


def analyse(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per scenario: accuracy statistics per strategy and paired differences to the focus."""
    report: dict[str, Any] = {}
    for scenario, by_label in runs.items():
        focus = SCENARIOS[scenario][2]
        accuracy = {
            label: {r["seed"]: r["personalized_accuracy"] for r in rows}
            for label, rows in by_label.items()
        }
        entry: dict[str, Any] = {
            "accuracy": {
                label: stats(list(acc.values())) for label, acc in accuracy.items() if acc
            },
            "paired_difference": {},
        }
        for label, acc in accuracy.items():
            seeds = sorted(set(acc) & set(accuracy.get(focus, {})))
            if label == focus or not seeds:
                continue
            diffs = [accuracy[focus][s] - acc[s] for s in seeds]
            entry["paired_difference"][f"{focus} - {label}"] = {
                **stats(diffs), "seeds": seeds, "values": diffs,
            }
        report[scenario] = entry
    return report


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables (docs/results.md)."""
    lines = []
    for scenario, entry in report.items():
        lines += [f"{scenario}:", "", "| strategy | seeds | mean +- std | min..max |",
                  "|---|---|---|---|"]
        lines += [
            f"| {label} | {a['n']} | {a['mean']:.3f} +- {a['std']:.3f} | "
            f"{a['min']:.3f}..{a['max']:.3f} |"
            for label, a in entry["accuracy"].items()
        ]
        lines += ["", "| paired difference | seeds | mean +- std | min..max | per seed |",
                  "|---|---|---|---|---|"]
        lines += [
            f"| {name} | {d['n']} | {d['mean']:+.3f} +- {d['std']:.3f} | "
            f"{d['min']:+.3f}..{d['max']:+.3f} | "
            + ", ".join(f"{v:+.3f}" for v in d["values"]) + " |"
            for name, d in entry["paired_difference"].items()
        ]
        lines.append("")
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, list[dict[str, Any]]]], path: Path) -> Path:
    """One panel per scenario: each seed's accuracy per strategy, the mean as a bar."""
    measured = {
        scenario: {label: rows for label, rows in by_label.items() if rows}
        for scenario, by_label in runs.items()
    }
    measured = {scenario: by_label for scenario, by_label in measured.items() if by_label}
    fig, axes = plt.subplots(
        1, len(measured), figsize=(4.2 * len(measured), 3.4), squeeze=False
    )
    for ax, (scenario, by_label) in zip(axes[0], measured.items(), strict=True):
        labels = list(by_label)
        seeds = min(len(rows) for rows in by_label.values())
        for x, label in enumerate(labels):
            values = [r["personalized_accuracy"] for r in by_label[label]]
            ax.bar(x, np.mean(values), color="C0" if label == SCENARIOS[scenario][2] else "0.7")
            ax.scatter(np.full(len(values), x), values, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylim(0, 1)
        ax.set_title(f"{scenario} ({seeds}+ seeds)", fontsize=10)
        ax.set_ylabel("personalized accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"any of {list(SCENARIOS)} (default all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--report", action="store_true",
                        help="only redo the statistics and the PNG from comparisons.json")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")
    args.scenarios = args.scenarios or list(SCENARIOS)
    path = OUT / "comparisons.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = previous.get("runs", {})
    # Seed-major: a run cut short still has every strategy of its first seeds.
    for scenario in [] if args.report else args.scenarios:
        shared, strategies, _ = SCENARIOS[scenario]
        runs[scenario] = {label: [] for label in strategies}
        for seed in range(args.seeds):
            for label, overrides in strategies.items():
                config = {**shared, **overrides, "seed": seed}
                summary = run_once(config)
                row = {"seed": seed, **{key: summary.get(key) for key in KEPT}}
                runs[scenario][label].append(row)
                print(f"{scenario} seed {seed} {label}: {row}", flush=True)
                document = {
                    "command": "nice -n 5 python benchmarks/comparisons.py "
                               + " ".join(argv if argv is not None else sys.argv[1:]),
                    "num_clients": NUM_CLIENTS,
                    "configs": {
                        name: {"shared": s, "strategies": st}
                        for name, (s, st, _) in SCENARIOS.items()
                    },
                    "runs": runs,
                    "report": analyse(runs),
                }
                path.write_text(json.dumps(document, indent=2))
    if args.report:
        previous["report"] = analyse(runs)
        path.write_text(json.dumps(previous, indent=2))
    plot(runs, OUT / "comparisons.png")
    print(markdown(analyse(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
