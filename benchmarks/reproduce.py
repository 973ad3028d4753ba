"""Reproduction benchmark: every strategy on its acceptance federations.

Each scenario is one real Flower simulation (Ray backend, the fl-clusters ServerApp
and ClientApp) on scikit-learn's bundled digits, or on Fashion-MNIST for the scenarios
named ``*-fashion-mnist`` (Debian's ``dataset-fashion-mnist``). The script writes one
JSON file per scenario (the run's ``summary.json`` plus the scenario's settings) and a
Markdown table of all scenarios measured so far to ``benchmarks/measured/``.

    python benchmarks/reproduce.py                 # every scenario (about 25 minutes)
    python benchmarks/reproduce.py ifca-rotation fedavg-rotation
    python benchmarks/reproduce.py --repeat 6 cfl-rotation-copies acfl-rotation-copies
    python benchmarks/reproduce.py --list

``--repeat N`` runs each named scenario N times and writes the figures of every run
to ``benchmarks/measured/repeats/`` instead. Simulated node ids are random per run,
but sampling, trials and client seeds follow each node's stable key
(docs/robustness.md, "Same seed, same result"): runs of one scenario should agree,
and a spread over runs is a determinism bug to look at, not a margin to cover.

Numbers are for 2 CPU cores; ``wall_time_s`` includes Ray's start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from flwr.simulation import run_simulation

from fl_clusters.client_app import build_client_app
from fl_clusters.server_app import build_server_app
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured"
REPEATS = OUT / "repeats"

ROTATION = {"cluster-structure": "rotation", "num-clusters": 4}
IID = {"cluster-structure": "none", "num-clusters": 1}
# ACFL in the paper's data regime (~2,400-2,800 train samples per client).
FASHION_MNIST = {"dataset": "fashion-mnist", "acfl-trial-epochs": 3}
MIXTURE = {"cluster-structure": "rotation-mixture", "num-clusters": 2}
SKEW = {"cluster-structure": "none", "dirichlet-alpha": 0.3, "num-clusters": 1}
# Every rotation group (mixture source) with its own rotated copy of the digits.
ROTATION_COPIES = {**ROTATION, "copy-per-group": True}
SKEWED_ROTATION_COPIES = {**ROTATION_COPIES, "dirichlet-alpha": 0.3}
# FedSoft's acceptance setting (tests/test_fedsoft.py).
MIXTURE_COPIES = {
    **MIXTURE, "rotation-step": 90, "mixture-alpha": 0.1, "validation-fraction": 0.0,
    "copy-per-group": True, "local-steps": 20, "num-rounds": 100,
}

# name -> (run-config overrides, number of clients). Each strategy's acceptance
# federation, plus the FedAvg run it is compared with.
SCENARIOS: dict[str, tuple[dict[str, Any], int]] = {
    "ifca-rotation": ({**ROTATION, "strategy": "ifca", "num-rounds": 15}, 20),
    "ifca-gradient-rotation": (
        {**ROTATION, "strategy": "ifca", "ifca-mode": "gradient", "lr": 0.5, "num-rounds": 15},
        20,
    ),
    "ifca-shared-rotation": (
        {**ROTATION, "strategy": "ifca", "ifca-head-layers": 1, "num-rounds": 15}, 20
    ),
    "fedavg-rotation": ({**ROTATION, "strategy": "fedavg", "num-rounds": 15}, 20),
    "fedprox-rotation": ({**ROTATION, "strategy": "fedprox", "num-rounds": 15}, 20),
    "local-rotation": ({**ROTATION, "strategy": "local", "num-rounds": 15}, 20),
    "cfl-rotation": ({**ROTATION, "strategy": "cfl", "num-rounds": 30}, 20),
    "acfl-rotation": ({**ROTATION, "strategy": "acfl", "num-rounds": 20}, 20),
    "cfl-iid": ({**IID, "strategy": "cfl", "num-rounds": 30}, 20),
    "acfl-iid": ({**IID, "strategy": "acfl", "num-rounds": 20}, 20),
    "fedsoft-mixture": (
        {**MIXTURE, "strategy": "fedsoft", "fedsoft-init": "random", "num-rounds": 30}, 20
    ),
    "fedavg-mixture": ({**MIXTURE, "strategy": "fedavg", "num-rounds": 30}, 20),
    "fldc-skew": ({**SKEW, "strategy": "fldc", "num-rounds": 20}, 20),
    "fedavg-skew": ({**SKEW, "strategy": "fedavg", "num-rounds": 20}, 20),
    "ifca-awcfl-rotation": (
        {**ROTATION, "strategy": "ifca", "awcfl-beta": 0.5, "num-rounds": 15}, 20
    ),
    "ifca-mcfl-rotation": ({**ROTATION, "strategy": "ifca", "mcfl": True, "num-rounds": 15}, 20),
    # MCFL and AWCFL's acceptance setting (tests/test_awcfl_mcfl.py).
    "acfl-mcfl-rotation-copies": (
        {**ROTATION_COPIES, "strategy": "acfl", "mcfl": True, "num-rounds": 10,
         "acfl-phase1-rounds": 9}, 20
    ),
    "acfl-awcfl-rotation-copies": (
        {**ROTATION_COPIES, "strategy": "acfl", "awcfl-beta": 0.5, "num-rounds": 10,
         "acfl-phase1-rounds": 9}, 20
    ),
    "cfl-rotation-copies": ({**ROTATION_COPIES, "strategy": "cfl", "num-rounds": 10}, 20),
    # Phase 1 budget 9 (below the 10 rounds, as the start requires): the relative gate
    # ends phase 1 at round 4-5 here, so the budget is never reached.
    "acfl-rotation-copies": (
        {**ROTATION_COPIES, "strategy": "acfl", "num-rounds": 10, "acfl-phase1-rounds": 9}, 20
    ),
    "fedavg-rotation-copies": ({**ROTATION_COPIES, "strategy": "fedavg", "num-rounds": 10}, 20),
    # 12 rounds: the default relative gate ends phase 1 once the update norms level
    # off (round 5-6 here); with 4 or 7 rounds ACFL never clustered.
    "acfl-iid-fashion-mnist": (
        {**IID, **FASHION_MNIST, "strategy": "acfl", "num-rounds": 12}, 20
    ),
    "acfl-rotation-fashion-mnist": (
        {**ROTATION, **FASHION_MNIST, "strategy": "acfl", "num-rounds": 12}, 20
    ),
    "fedsoft-mixture-copies-warm": (
        {**MIXTURE_COPIES, "strategy": "fedsoft", "fedsoft-init": "local-kmeans",
         "fedsoft-lambda": 0.01},
        20,
    ),
    "fedavg-mixture-copies": ({**MIXTURE_COPIES, "strategy": "fedavg"}, 20),
    "fldc-skew-rotation-copies": (
        {**SKEWED_ROTATION_COPIES, "strategy": "fldc", "num-rounds": 20}, 20
    ),
    "fedavg-skew-rotation-copies": (
        {**SKEWED_ROTATION_COPIES, "strategy": "fedavg", "fraction-train": 0.2,
         "num-rounds": 20},
        20,
    ),
}

# What the folder's README says every file in it records (tests/test_provenance.py).
PROVENANCE_NOTE = (
    "Every JSON file in this folder and its subfolders records where its numbers come "
    "from in its top-level `\"provenance\"`: the command that wrote it, the git commit "
    "(and whether tracked files differed from it), the UTC date, the CPU cores and the "
    "GPU (`null`: none), and, where the script recorded them, platform, Python and "
    "package versions (`fl_clusters.sweep.provenance.measurement_provenance`). A file "
    "whose numbers are a list keeps them under `\"rows\"`. Files measured before the "
    "scripts recorded this carry a record rebuilt from git and the file itself, marked "
    "`\"retrofitted\"` with how it was rebuilt. A sweep's folder under `sweeps/` records "
    "the same per session in `manifest.json` and the commit of every run in "
    "`runs.jsonl`. `tests/test_provenance.py` fails when a file lacks any of it."
)
COLUMNS = (
    "strategy", "num_clusters_found", "ari", "personalized_accuracy",
    "intra_cluster_accuracy", "inter_cluster_accuracy", "rounds_to_target", "num_rounds",
    "bytes_sent", "wall_time_s",
)
# What --repeat keeps of every run: the clustering found and what it cost.
REPEAT_FIELDS = (
    "num_clusters_found", "ari", "personalized_accuracy", "trial_evaluations",
    "clustering_round", "split_rounds", "rounds_to_target", "wall_time_s",
)


def run_scenario(name: str) -> dict[str, Any]:
    """Run one scenario and return its summary with the settings that produced it.

    The result's ``provenance`` is the record of this process (command, commit,
    date, cores, GPU).
    """
    overrides, num_clients = SCENARIOS[name]
    source = measurement_provenance()
    with tempfile.TemporaryDirectory() as folder:
        settings = {"results-dir": folder, "min-nodes": num_clients, **overrides}
        run_simulation(
            server_app=build_server_app(settings),
            client_app=build_client_app(settings),
            num_supernodes=num_clients,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        summaries = list(Path(folder).glob("*/summary.json"))
        if len(summaries) != 1:
            raise RuntimeError(f"scenario {name!r} wrote no summary.json; see the log above")
        summary = json.loads(summaries[0].read_text())
    return {"provenance": source, "scenario": name, "num_clients": num_clients,
            "run_config": overrides, **summary}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)


def write_table() -> Path:
    """Write the Markdown table of every measured scenario and return its path."""
    rows = [
        json.loads((OUT / f"{name}.json").read_text())
        for name in SCENARIOS
        if (OUT / f"{name}.json").is_file()
    ]
    lines = [
        "| scenario | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for row in rows:
        lines.append(
            f"| {row['scenario']} | " + " | ".join(_cell(row.get(c)) for c in COLUMNS) + " |"
        )
    table = OUT / "README.md"
    table.write_text(
        "# Measured by benchmarks/reproduce.py\n\n"
        "Digits, 2 CPU cores; one JSON per scenario beside this file.\n\n"
        + PROVENANCE_NOTE + "\n\n"
        + "\n".join(lines) + "\n"
    )
    return table


def _spread(values: list[Any]) -> str:
    """One cell of the repeats table: the value, or min..max over runs."""
    if all(v is None for v in values):
        return "-"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        low, high = min(values), max(values)
        return _cell(low) if low == high else f"{_cell(low)}..{_cell(high)}"
    return ", ".join(sorted({_cell(v) for v in values}))


def write_repeats_table() -> Path:
    """Write the Markdown table of every repeated scenario and return its path."""
    # Wall time stays in the JSON files: it measures the machine, not the clustering.
    columns = REPEAT_FIELDS[:-1]
    lines = [
        "| scenario | runs | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 2) + "|",
    ]
    for name in SCENARIOS:
        path = REPEATS / f"{name}.json"
        if not path.is_file():
            continue
        runs = json.loads(path.read_text())["runs"]
        cells = [_spread([run.get(c) for run in runs]) for c in columns]
        lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
    table = REPEATS / "README.md"
    table.write_text(
        "# Repeated runs, measured by benchmarks/reproduce.py --repeat N\n\n"
        "2 CPU cores; each cell is the value, or min..max over the runs (lists: every "
        "value seen). Every run of a scenario uses the same settings and seed and new "
        "simulated node ids, so the runs should agree. One JSON per scenario beside "
        "this file.\n\n"
        + "\n".join(lines) + "\n"
    )
    return table


def repeat_scenario(name: str, repeats: int) -> None:
    """Run one scenario ``repeats`` times and write the figures of every run."""
    overrides, num_clients = SCENARIOS[name]
    source = measurement_provenance()
    runs = []
    for _ in range(repeats):
        summary = run_scenario(name)
        runs.append({field: summary.get(field) for field in REPEAT_FIELDS})
        print(f"{name} run {len(runs)}: {runs[-1]}", flush=True)
    (REPEATS / f"{name}.json").write_text(
        json.dumps(
            {"provenance": source, "scenario": name, "num_clients": num_clients,
             "run_config": overrides, "runs": runs},
            indent=2,
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Run the named scenarios (all by default) and rewrite the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="N > 1: run each scenario N times and write every run's figures to "
        "measured/repeats/ (default 1: one run each, to measured/)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be >= 1")
    if args.list:
        for name, (overrides, clients) in SCENARIOS.items():
            print(f"{name}: {clients} clients, {overrides}")
        return 0
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; see --list")
    names = args.scenarios or list(SCENARIOS)
    if args.repeat > 1:
        REPEATS.mkdir(parents=True, exist_ok=True)
        for name in names:
            repeat_scenario(name, args.repeat)
        print(f"table: {write_repeats_table()}")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        result = run_scenario(name)
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
        print(f"{name}: " + ", ".join(f"{c}={_cell(result.get(c))}" for c in COLUMNS), flush=True)
    print(f"table: {write_table()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
