"""Training recipe axis: do the strategies' defaults find the groups under the user's optimizer?

The clustering matrix trains with fl-clusters' own learner (plain SGD). Through
the plug-in path the user's ``train()`` trains, with its own optimizer and local
epochs, and every strategy's gates see the updates that recipe makes. Each cell
here is one real Flower simulation (Ray backend) of
``examples/quickstart-pytorch-clustered``: the quickstart's handlers wrapped by
``ClusteredClient``, dict batches, a small CNN on offline digits, clients in two
groups whose labels disagree (odd partitions name every digit five further
along). The cells are strategy (defaults, ``num-clusters`` = 2 where k is
given) x recipe (plain SGD, SGD with momentum 0.9, Adam) x local epochs (1, 5)
x seed (the strategy's ``seed``; the partitions are fixed). ACFL's trials need a
validation split: its cells hold ``validation-fraction`` = 0.2 of each
client's training data out of ``train()``.

Results go to ``benchmarks/measured/recipe_matrix.json`` (with the command,
commit, date, cores and GPU of every run that added cells under ``runs``, the last
one's as the file's ``provenance``; written after every cell, so an interrupted run
resumes), and the section "Training recipe axis" of
docs/clustering-matrix.md is regenerated from it.

    python benchmarks/recipe_matrix.py                                 # the full axis
    python benchmarks/recipe_matrix.py ifca cfl --recipes adam --epochs 1
    python benchmarks/recipe_matrix.py ifca --recipes adam --epochs 1 --rounds 2 \\
        --clients 4 --out /tmp/recipe-smoke.json                       # smoke run
    python benchmarks/recipe_matrix.py --table                         # rebuild the section
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quickstart-pytorch-clustered"
OUT = ROOT / "benchmarks" / "measured" / "recipe_matrix.json"
TABLE = ROOT / "docs" / "clustering-matrix.md"
SECTION = "## Training recipe axis"

STRATEGIES = ("ifca", "cfl", "acfl", "fedsoft", "fldc", "flhc", "wecfl", "fedem")
BASELINES = ("fedavg", "local")
# The user's optimizer and its learning rate: the quickstart's SGD rate for both
# SGD recipes, PyTorch's default rate for Adam.
RECIPES: dict[str, dict[str, Any]] = {
    "sgd": {"optimizer": "sgd", "learning-rate": 0.03},
    "sgd-momentum": {"optimizer": "sgd-momentum", "learning-rate": 0.03},
    "adam": {"optimizer": "adam", "learning-rate": 0.001},
}
EPOCHS = (1, 5)
# ACFL's phase 1 budget below the run's rounds, as its start requires (docs/plugin.md).
STRATEGY_SETTINGS: dict[str, dict[str, Any]] = {
    "acfl": {"validation-fraction": 0.2, "acfl-phase1-rounds": 3},
}


def cell_key(strategy: str, recipe: str, epochs: int, seed: int) -> str:
    """The cell's id in the results file."""
    return f"{strategy}|{recipe}|{epochs}|{seed}"


def provenance(argv: list[str]) -> dict[str, Any]:
    """What produced the numbers: command, commit (and whether the tree differed), machine."""
    return measurement_provenance([sys.executable, sys.argv[0], *argv])


def run_cell(
    strategy: str, recipe: str, epochs: int, seed: int, clients: int, rounds: int
) -> dict[str, Any]:
    """One simulation of the example; returns the figures the table needs."""
    from flwr.simulation import run_simulation

    # Ray's workers import the example's package too.
    paths = [str(EXAMPLE), str(ROOT)]
    known = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if not set(paths) <= set(known):
        os.environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in known if p])
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    from pytorchexample.client_app import build_client_app
    from pytorchexample.server_app import build_server_app

    with tempfile.TemporaryDirectory() as folder:
        config = {
            "strategy": strategy,
            **RECIPES[recipe],
            **STRATEGY_SETTINGS.get(strategy, {}),
            "local-epochs": epochs,
            "num-server-rounds": rounds,
            "seed": seed,
            "results-dir": folder,
        }
        start = time.time()
        run_simulation(
            server_app=build_server_app(config),
            client_app=build_client_app(config),
            num_supernodes=clients,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        summary = json.loads((Path(folder) / "summary.json").read_text())
    accuracy = summary["per_client_accuracy"]
    return {
        "ari": summary["ari"],
        "num_models": summary["num_models"],
        "mean_accuracy": float(np.mean(accuracy)),
        "min_accuracy": float(np.min(accuracy)),
        "clients": clients,
        "rounds": rounds,
        "learning_rate": RECIPES[recipe]["learning-rate"],
        "wall_time_s": round(time.time() - start, 1),
    }


def load(path: Path) -> dict[str, Any]:
    """The results file ``path`` (cells and the provenance of each run that added some)."""
    return json.loads(path.read_text()) if path.exists() else {"runs": [], "cells": {}}


def _fmt(values: list[float]) -> str:
    return "-" if not values else f"{np.mean(values):.2f}"


def section(results: dict[str, Any]) -> str:
    """The doc section: how the axis is run, then one line per strategy x recipe x epochs."""
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    errors = sorted(key for key, row in results["cells"].items() if "error" in row)
    for key, row in results["cells"].items():
        if "error" not in row:
            strategy, recipe, epochs, _ = key.split("|")
            cells.setdefault((strategy, recipe, int(epochs)), []).append(row)
    lines = [
        SECTION,
        "",
        "The strategies' defaults under the user's own training recipe, through the",
        "plug-in path (`ClusteredClient` around the quickstart's handlers,",
        "`examples/quickstart-pytorch-clustered`: small CNN, offline digits, two groups",
        "whose labels disagree). Recipes: plain SGD and SGD with momentum 0.9 at",
        "learning rate 0.03, Adam at 0.001; 1 or 5 local epochs. ACFL's cells hold 20 %",
        "of each client's training data out for its validation split. FedSoft's",
        "proximal term is off here (the example's loss does not add",
        "`clustered.regularizer`). FedEM's M-steps take as many steps as the handler's",
        "last training on the node, with its SGD settings under the SGD recipes and",
        "plain SGD at the server's learning rate under Adam (docs/plugin.md). Generated by",
        "`benchmarks/recipe_matrix.py` from `benchmarks/measured/recipe_matrix.json`",
        "(which records the command, commit, date and cores of every run):",
        "",
        "```bash",
        "PYTHONPATH=$PWD .venv/bin/python benchmarks/recipe_matrix.py   # every cell, seeds 0-2",
        "PYTHONPATH=$PWD .venv/bin/python benchmarks/recipe_matrix.py cfl --recipes adam "
        "--seeds 0",
        "```",
        "",
        "The whole axis is 180 simulations (10 strategies with the FedAvg and local-only",
        "baselines, 3 recipes, 2 epoch settings, 3 seeds) of 6 clients and 10 rounds,",
        "each 20-60 s on 2 cores; measured cells are skipped on a rerun.",
        "",
    ]
    if not cells:
        lines.append("Not measured yet.")
    else:
        lines += [
            "| strategy | recipe | local epochs | seeds | ARI | models | mean acc | min acc |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for (strategy, recipe, epochs), rows in sorted(cells.items()):
            models = sorted({r["num_models"] for r in rows})
            lines.append(
                f"| {strategy} | {recipe} | {epochs} | {len(rows)} | "
                f"{_fmt([r['ari'] for r in rows])} | {', '.join(map(str, models))} | "
                f"{_fmt([r['mean_accuracy'] for r in rows])} | "
                f"{_fmt([r['min_accuracy'] for r in rows])} |"
            )
        setting = sorted({(r["clients"], r["rounds"]) for rows in cells.values() for r in rows})
        lines += ["", "Clients and rounds: " + ", ".join(f"{c} clients, {r} rounds"
                                                         for c, r in setting) + "."]
    if errors:
        lines += ["", "Cells that raised (see recipe_matrix.json): " + ", ".join(errors)]
    return "\n".join(lines) + "\n"


def write_section(results: dict[str, Any], table: Path = TABLE) -> None:
    """Replace the section (from its heading to the end of the file), or append it."""
    text = table.read_text() if table.exists() else ""
    head = text[: text.index(SECTION)] if SECTION in text else text
    table.write_text(head.rstrip("\n") + "\n\n" + section(results))


def main(argv: list[str]) -> None:
    """Run the selected cells that are not measured yet, then rebuild the doc section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "strategies", nargs="*", default=[*STRATEGIES, *BASELINES],
        help="strategies (default: every clustered one and the baselines)",
    )
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=RECIPES)
    parser.add_argument("--epochs", nargs="*", type=int, default=list(EPOCHS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=6, help="simulated clients (>= 2)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rerun", action="store_true", help="run measured cells again")
    parser.add_argument("--table", action="store_true", help="only rebuild the doc section")
    parser.add_argument(
        "--out", type=Path, default=OUT,
        help="results file; the doc section is rebuilt only from the default one",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.strategies) - set(STRATEGIES) - set(BASELINES))
    if unknown:
        parser.error(f"unknown strategies {unknown}; allowed: {', '.join(STRATEGIES + BASELINES)}")
    if args.clients < 2:
        parser.error(f"--clients {args.clients}: the two groups need at least 2 clients")
    if any(e < 1 for e in args.epochs) or args.rounds < 1:
        parser.error("--epochs and --rounds must be >= 1")
    results = load(args.out)
    rebuild = args.out.resolve() == OUT.resolve()
    if not args.table:
        results["provenance"] = provenance(argv)
        results["runs"].append(results["provenance"])
        for seed in args.seeds:
            for epochs in args.epochs:
                for recipe in args.recipes:
                    for strategy in args.strategies:
                        key = cell_key(strategy, recipe, epochs, seed)
                        if key in results["cells"] and "error" not in results["cells"][key] \
                                and not args.rerun:
                            continue
                        print(f"running {key}", flush=True)
                        try:
                            row = run_cell(strategy, recipe, epochs, seed, args.clients,
                                           args.rounds)
                        except Exception as error:
                            # One failing cell must not lose the rest of the axis; the
                            # section lists it and the next run retries it.
                            row = {"error": repr(error)}
                        # Which run (index into "runs") measured the cell.
                        results["cells"][key] = {**row, "run": len(results["runs"]) - 1}
                        print(f"{key}: {results['cells'][key]}", flush=True)
                        args.out.parent.mkdir(parents=True, exist_ok=True)
                        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))
    if rebuild:
        write_section(results)


if __name__ == "__main__":
    main(sys.argv[1:])
