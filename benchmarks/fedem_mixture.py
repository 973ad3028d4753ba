"""FedEM against FedAvg and IFCA on a label-permutation mixture (FedEM's acceptance setting).

The setting of ``tests/test_fedem.py``: digits, 20 clients, MLP, two sources that
name the digits differently, mixed in every client by Dirichlet(0.5) proportions,
8 rounds, every strategy on its defaults (M = k = 2). Every run is one real Flower
simulation; results are appended to ``benchmarks/measured/fedem_mixture.json``.
FedEM's rows hold the ARI of its own clustering (argmax pi, ``mixture_ari``) beside
that of its warm start's k-means groups (``warm_start_ari``).
Runs with the same seed still differ: the built-in learner seeds its batch order
with the node ids, which the simulation draws at random.

    python benchmarks/fedem_mixture.py                        # fedem fedavg ifca, seeds 0-2
    python benchmarks/fedem_mixture.py fedem --seeds 2 --repeats 2
    python benchmarks/fedem_mixture.py fedem --seeds 0 1 --fedem-init random
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

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "measured" / "fedem_mixture.json"
SETTING = {
    "cluster-structure": "label-permutation-mixture",
    "num-clusters": 2,
    "num-rounds": 8,
}
CLIENTS = 20
FIELDS = ("personalized_accuracy", "ari", "mixture_ari", "warm_start_ari",
          "importance_weight_error", "wall_time_s")


def run(strategy: str, seed: int, extra: dict[str, Any]) -> dict[str, Any]:
    """One simulation; returns the summary fields the comparison needs."""
    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.server_app import build_server_app

    with tempfile.TemporaryDirectory() as folder:
        settings = {**SETTING, **extra, "strategy": strategy, "seed": seed,
                    "results-dir": folder, "min-nodes": CLIENTS}
        run_simulation(
            server_app=build_server_app(settings),
            client_app=build_client_app(settings),
            num_supernodes=CLIENTS,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        summary = json.loads(next(Path(folder).glob("*/summary.json")).read_text())
    return {"strategy": strategy, "seed": seed, **extra,
            **{k: summary.get(k) for k in FIELDS}}


def main(argv: list[str]) -> None:
    """Run the selected strategies and seeds, appending each result as it finishes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("strategies", nargs="*", default=["fedem", "fedavg", "ifca"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--fedem-init", choices=["local-kmeans", "random"],
                        help="FedEM's start (default: the run config's)")
    args = parser.parse_args(argv)
    from fl_clusters.sweep.provenance import git_state

    source = {"command": "python benchmarks/fedem_mixture.py " + " ".join(argv),
              **git_state(), "cores": os.cpu_count()}
    extra = {"fedem-init": args.fedem_init} if args.fedem_init else {}
    results = json.loads(OUT.read_text()) if OUT.exists() else []
    for seed in args.seeds:
        for strategy in args.strategies:
            for _ in range(args.repeats):
                row = {**run(strategy, seed, extra), "date": time.strftime("%Y-%m-%d %H:%M"),
                       **source}
                print(json.dumps(row), flush=True)
                results.append(row)
                OUT.parent.mkdir(parents=True, exist_ok=True)
                OUT.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
