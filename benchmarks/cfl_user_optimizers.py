"""CFL with default settings on a user's own training: SGD with momentum, Adam, more epochs.

The federation is a user's app shaped like Flower's quickstart-pytorch (the
ClientApp of ``tests/test_cfl_gate.py``): 6 clients in two groups whose labels
conflict, the app's own ``train()`` with its own optimizer, wrapped by
``ClusteredClient``; fl-clusters' ServerApp runs CFL with its defaults. For
comparison, the built-in ClientApp (plain SGD) on 20 digits clients of the
clustering matrix's structures (seeds 0-2). Each case records the summary's
clustering figures and CFL's one-line gate log of every round (what the gate
compared, and why a cluster did or did not split), and ``history_gate`` what
decided the cluster-rounds that a largest-norm test against the first rounds'
norms (``cfl-max-ratio`` 0.6) would have closed.

    PYTHONPATH=$PWD python benchmarks/cfl_user_optimizers.py

writes ``benchmarks/measured/cfl_user_optimizers.json``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flwr.clientapp import ClientApp

from benchmarks.clustering_matrix import STRUCTURES
from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "measured" / "cfl_user_optimizers.json"
# (optimizer, local epochs) of the user's train()
CASES = [("momentum", 1), ("momentum", 5), ("adam", 1), ("adam", 5)]
ROUNDS = 10
# The clustering matrix's digits cells, built-in ClientApp (MLP, 20 clients, 25 rounds).
BUILTIN_STRUCTURES = ("rotation", "label-permutation", "none")
BUILTIN_SEEDS = (0, 1, 2)
# The largest-norm test's former default: max norm > this x the first rounds' largest.
HISTORY_RATIO = 0.6


class GateLines(logging.Handler):
    """Keeps CFL's gate lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("CFL round"):
            self.lines.append(message)


def history_gate(gate_log: list[str], reference_norm: float) -> dict[str, Any]:
    """What decided the cluster-rounds after the warm-up that ``HISTORY_RATIO`` would close.

    Counts the cluster-rounds whose coherence passed but whose largest norm was
    at most ``HISTORY_RATIO`` x ``reference_norm``, and the range of the split
    test's figure that refused (or accepted) each.
    """
    outcome: dict[str, list[float]] = {}
    for line in gate_log:
        for part in line.split(" | "):
            figures = re.search(r"norm ([\d.]+) <[^,]*, max ([\d.e+-]+) ", part)
            if "warm-up" in part or not figures:
                continue
            if float(figures.group(2)) > HISTORY_RATIO * reference_norm:
                continue
            if "SPLIT" in part:
                key, pattern = "split (silhouette)", r"group silhouette ([-\d.]+)"
            elif "no split: cross similarity" in part:
                key, pattern = "cross similarity", r"cross similarity ([-\d.]+)"
            else:
                key, pattern = "group silhouette", r"no split: group silhouette ([-\d.]+)"
            value = re.search(pattern, part)
            outcome.setdefault(key, []).append(float(value.group(1)) if value else float("nan"))
    return {key: {"count": len(values), "min": min(values), "max": max(values)}
            for key, values in outcome.items()}


def run_case(
    overrides: dict[str, Any], num_clients: int, client_app: ClientApp | None = None
) -> dict[str, Any]:
    """One simulated CFL federation; the summary's figures and the gate lines.

    ``client_app`` ``None`` runs fl-clusters' own ClientApp with ``overrides``.
    """
    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.server_app import build_server_app

    gate = GateLines()
    logging.getLogger("flwr").addHandler(gate)
    start = time.time()
    try:
        with tempfile.TemporaryDirectory() as folder:
            settings = {"strategy": "cfl", "min-nodes": num_clients, "results-dir": folder,
                        **overrides}
            run_simulation(
                server_app=build_server_app(settings),
                client_app=client_app or build_client_app(settings),
                num_supernodes=num_clients,
                backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
            )
            summary = json.loads(next(Path(folder).glob("*/summary.json")).read_text())
    finally:
        logging.getLogger("flwr").removeHandler(gate)
    return {
        "history_gate": history_gate(gate.lines, summary.get("reference_norm") or 0.0),
        "ari": summary.get("ari"),
        "num_clusters_found": summary.get("num_clusters_found"),
        "split_rounds": summary.get("split_rounds"),
        "personalized_accuracy": summary.get("personalized_accuracy"),
        "reference_norm": summary.get("reference_norm"),
        "num_rounds": settings.get("num-rounds"),
        "wall_time_s": round(time.time() - start, 1),
        "gate_log": gate.lines,
    }


def main() -> None:
    """Run every case and write the results file."""
    # Ray's workers unpickle the test module's ClientApp by importing it.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    sys.path.insert(0, str(ROOT / "tests"))
    from tests.test_cfl_gate import QUICKSTART_CLIENTS, quickstart_client_app

    source = measurement_provenance()
    results = {
        f"quickstart|{optimizer}|{epochs} epochs": run_case(
            {"num-rounds": ROUNDS}, QUICKSTART_CLIENTS, quickstart_client_app(optimizer, epochs)
        )
        for optimizer, epochs in CASES
    }
    for seed in BUILTIN_SEEDS:
        for structure in BUILTIN_STRUCTURES:
            results[f"builtin|digits|mlp|{structure}|{seed}"] = run_case(
                {**STRUCTURES[structure], "dataset": "digits", "model": "mlp", "seed": seed,
                 "num-rounds": 25}, 20)
    OUT.write_text(json.dumps({"provenance": source, **results}, indent=1, sort_keys=True))
    for case, row in results.items():
        print(case, {k: v for k, v in row.items() if k != "gate_log"})


if __name__ == "__main__":
    main()
