"""A sweep against the same runs as separate ``flwr run`` commands: time and results.

The same N configurations (digits, 20 clients, 3 rounds; strategies x seeds) run
twice: once as one sweep (``python -m fl_clusters.sweep``: one process, one Ray
session) and once as N ``flwr run . --stream`` commands in a row (each given every
run-config key of its cell), as a user would script them, in a copy of the checkout.
The local SuperLink the first starts serves the others and is stopped at the end
with ``deploy/stop-local-superlink.sh``; before, the script waits until no other
SuperLink runs. Every run's config, summary.json outcome (accuracies, ARI,
clusters, traffic, histories) and models must agree between the two, else the
script fails. Writes the wall times, the per-run seconds and the provenance to
``benchmarks/measured/sweep_speed.json`` (``--cells 2``: ``sweep_speed-2cells.json``).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_speed.py             # 20 cells, ~15 min
    PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_speed.py --cells 2   # the check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_clusters.results import load_models
from fl_clusters.sweep.cells import Cell
from fl_clusters.sweep.provenance import measurement_provenance
from fl_clusters.sweep.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "benchmarks" / "measured"
STRATEGIES = ("fedavg", "ifca", "cfl", "fedprox", "local")
CLIENTS = 20
ROUNDS = 3
# summary.json fields that make a run's outcome, all in the clients' order (fields
# keyed by node id, or holding the run's wall time or Ray node, differ between any
# two runs); the models must also be equal.
OUTCOME_FIELDS = (
    "strategy", "num_clients", "num_cluster_models", "num_clusters_found", "ari", "nmi",
    "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
    "intra_cluster_accuracy", "inter_cluster_accuracy", "rounds_to_target", "bytes_sent",
    "bytes_received", "assignment_history", "cluster_accuracy_history",
)
ENV = {
    **os.environ,
    # As the Makefile sets them: no per-run dependency install, prompt task pick-up.
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
}


def sweep_file(cells: int) -> str:
    """A sweep of ``cells`` runs: every strategy for seed 0, then seed 1, ..."""
    variants = [
        f'{strategy}-seed{seed} = {{strategy = "{strategy}", seed = {seed}}}'
        for seed in range(cells // len(STRATEGIES) + 1) for strategy in STRATEGIES
    ][:cells]
    return "\n".join([
        f'name = "sweep-speed-{cells}"',
        "[base]",
        'dataset = "digits"',
        f"num-rounds = {ROUNDS}",
        "plots = false",
        "[grid.run]",
        *variants,
        "[federation]",
        f"num-supernodes = {CLIENTS}",
        "client-resources-num-cpus = 1",
    ]) + "\n"


SUPERLINK_WAIT_S = 1800.0


def _stop_local_superlink() -> None:
    subprocess.run([ROOT / "deploy" / "stop-local-superlink.sh", "--quiet"], check=True)


def _wait_for_no_superlink() -> None:
    """Wait until no ``flower-superlink`` runs: on a shared machine it may be another
    job's, which stopping would break (benchmarks/overhead.py does the same)."""
    deadline = time.monotonic() + SUPERLINK_WAIT_S
    while True:
        found = subprocess.run(["pgrep", "-f", "flower-superlink"], capture_output=True,
                               text=True, check=False).stdout.split()
        if not found:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"a flower-superlink (PIDs {found}) still runs; if it is a "
                               "leftover, stop it with deploy/stop-local-superlink.sh")
        print(f"waiting for flower-superlink {found} to end", file=sys.stderr, flush=True)
        time.sleep(10.0)


def run_as_sweep(path: Path, out: Path) -> dict[str, Any]:
    """``python -m fl_clusters.sweep`` in a process of its own; wall time and its lines."""
    command = [sys.executable, "-m", "fl_clusters.sweep", str(path), "--out", str(out)]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"the sweep failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    lines = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    failed = [line for line in lines if line["status"] != "ok"]
    if failed:
        raise RuntimeError(f"sweep runs failed: {[line['error'] for line in failed]}")
    return {"command": command, "wall_s": wall, "lines": lines}


def app_copy(folder: Path) -> tuple[Path, dict[str, str]]:
    """The checkout's files (tracked and new) in ``folder/app`` and an environment whose
    home is ``folder/home``.

    ``flwr run`` may move the federations out of the app's pyproject.toml into the
    home's Flower config: it does that to a copy, never to the checkout (as the
    tests' ``fresh_checkout`` fixture does).
    """
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")
    app = folder / "app"
    for name in filter(None, names):
        if (ROOT / name).is_file():
            (app / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, app / name)
    home = folder / "home"
    home.mkdir()
    return app, {**ENV, "HOME": str(home)}


def flwr_run(
    run_config: dict[str, Any], results_dir: Path, app: Path, env: dict[str, str]
) -> dict[str, Any]:
    """One ``flwr run . --stream`` of ``run_config`` in ``app``; its wall time and results
    folder."""
    overrides = " ".join(
        f"{key}={json.dumps(value) if isinstance(value, bool) else repr(value)}"
        for key, value in {**run_config, "results-dir": str(results_dir)}.items()
    )
    command = [
        "flwr", "run", ".", "--stream",
        "--federation-config", f"num-supernodes={CLIENTS} client-resources-num-cpus=1",
        "--run-config", overrides,
    ]
    start = time.monotonic()
    done = subprocess.run(command, cwd=app, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    folders = list(results_dir.glob("*/summary.json"))
    # flwr run exits 0 when the run fails: the summary tells.
    if len(folders) != 1:
        raise RuntimeError(f"flwr run wrote no summary.json ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return {"command": command, "wall_s": wall, "folder": folders[0].parent}


def outcome(folder: Path) -> dict[str, Any]:
    """A run's config (without its results folder), outcome fields and model arrays."""
    run_config = json.loads((folder / "run_config.json").read_text())
    run_config.pop("results-dir")
    summary = json.loads((folder / "summary.json").read_text())
    arrays = {name: model.tolist() for name, model in load_models(folder).items()}
    return {
        "run_config": run_config,
        "summary": {field: summary.get(field) for field in OUTCOME_FIELDS},
        "models": arrays,
    }


def run_separately(cells: Sequence[Cell], folder: Path) -> tuple[list[dict[str, Any]], float]:
    """Every cell as its own ``flwr run`` in a copy of the checkout; the runs and their
    wall time together."""
    app, env = app_copy(folder)
    _wait_for_no_superlink()
    separate = []
    start = time.monotonic()
    try:
        for i, cell in enumerate(cells):
            # Every key: the app's pyproject.toml defaults must not decide the config.
            separate.append(flwr_run(cell.settings, folder / f"flwr-run-{i}", app, env))
    finally:
        _stop_local_superlink()
    return separate, time.monotonic() - start


def compare_runs(
    cells: Sequence[Cell], swept: dict[str, Any], separate: list[dict[str, Any]], folder: Path
) -> list[dict[str, Any]]:
    """Each cell's run in the sweep and by itself, which must agree; their times and scores.

    Raises
    ------
    RuntimeError
        Naming the cell and the fields where the two runs differ.
    """
    by_key = {line["key"]: line for line in swept["lines"]}
    runs = []
    for cell, alone in zip(cells, separate, strict=True):
        line = by_key[cell.key]
        in_sweep = outcome(folder / "sweep" / line["results_folder"])
        by_itself = outcome(alone["folder"])
        if in_sweep != by_itself:
            differing = sorted(
                key for part in ("run_config", "summary", "models")
                for key in set(in_sweep[part]) | set(by_itself[part])
                if in_sweep[part].get(key) != by_itself[part].get(key)
            )
            raise RuntimeError(f"{cell.name}: the sweep and flwr run differ in {differing}")
        runs.append({
            "cell": cell.name, "run_config": cell.run_config,
            "sweep_run_s": line["seconds"], "flwr_run_s": alone["wall_s"],
            "ari": in_sweep["summary"]["ari"],
            "personalized_accuracy": in_sweep["summary"]["personalized_accuracy"],
        })
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20, help="runs (default 20)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default benchmarks/measured/sweep_speed.json, "
                             "or sweep_speed-Ncells.json for another --cells)")
    args = parser.parse_args()
    out = args.out or MEASURED / (
        "sweep_speed.json" if args.cells == 20 else f"sweep_speed-{args.cells}cells.json"
    )
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        path = folder / "sweep.toml"
        path.write_text(sweep_file(args.cells))
        sweep = load_sweep(path)
        provenance = measurement_provenance()
        provenance["load_average_before"] = os.getloadavg()
        swept = run_as_sweep(path, folder / "sweep")
        provenance["load_average_after_sweep"] = os.getloadavg()
        separate, separate_wall = run_separately(sweep.cells, folder)
        provenance["load_average_after_flwr_runs"] = os.getloadavg()
        runs = compare_runs(sweep.cells, swept, separate, folder)
    result = {
        "provenance": provenance,
        "what": f"{args.cells} runs (digits, {CLIENTS} clients, {ROUNDS} rounds) as one sweep "
                "and as separate `flwr run . --stream` commands; run_config.json and "
                "summary.json outcome fields and models identical for every run",
        "cells": args.cells,
        "sweep_command": swept["command"],
        "sweep_wall_s": swept["wall_s"],
        "flwr_run_command_example": separate[0]["command"],
        "flwr_runs_wall_s": separate_wall,
        "speedup": separate_wall / swept["wall_s"],
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.cells} runs: sweep {swept['wall_s']:.1f} s, separate flwr run "
          f"{separate_wall:.1f} s ({result['speedup']:.2f}x); same results; {out}")


if __name__ == "__main__":
    main()
