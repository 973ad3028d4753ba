"""Time the README's ``make run`` job end to end, for IFCA and CFL.

The closest peer (Flower's legacy simulation) runs the same 20-client IFCA and CFL
jobs on 4-rotation digits in 30-48 s (``PEER_S``). This runs the job the
README gives, ``flwr run .`` with 20 SuperNodes and one CPU per client and the
default run config (15 rounds, plots included), once per strategy and repeat, from
the command to its exit, and records the run's own wall time, ARI and personalized
accuracy next to it. Writes ``benchmarks/measured/readme_jobs.json``.

    python benchmarks/readme_jobs.py [--strategies ifca cfl] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.federation_runs import federation_flwr_run
from benchmarks.overhead import machine_info
from fl_clusters.config import parse_run_config
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "readme_jobs.json"
# The legacy Flower simulation's time for the same jobs and data, for comparison.
PEER_S = (30.0, 48.0)


def job(strategy: str) -> dict[str, object]:
    """One ``flwr run`` of the README's job with ``strategy``; its times and scores."""
    results_dir = tempfile.mkdtemp(prefix="readme-job-")
    # num-rounds is passed at its default so the benchmark can check every round ran.
    config = {
        "strategy": strategy,
        "num-rounds": parse_run_config({})["num-rounds"],
        "results-dir": results_dir,
    }
    try:
        run = federation_flwr_run(config, clients=20)
    finally:
        shutil.rmtree(results_dir)
    return {
        "strategy": strategy,
        "flwr_run_s": run["wall_s"],
        "startup_to_round1_end_s": run["startup_to_round1_end_s"],
        "round_mean_s": run["round_mean_s"],
        **run["summary"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=["ifca", "cfl"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    source = measurement_provenance()
    info = {**machine_info(), "load_average_before": os.getloadavg()}
    rows = [job(s) for s in args.strategies for _ in range(args.repeats)]
    info["load_average_after"] = os.getloadavg()
    args.out.write_text(
        json.dumps({"provenance": source, "machine": info, "peer_legacy_simulation_s": PEER_S,
                    "jobs": rows}, indent=2) + "\n"
    )
    print("| strategy | `flwr run` s | start..R1 end s | s/round | ARI | accuracy |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['strategy']} | {row['flwr_run_s']:.1f} "
              f"| {row['startup_to_round1_end_s']:.1f} | {row['round_mean_s']:.2f} "
              f"| {row['ari']:.3f} | {row['personalized_accuracy']:.4f} |")


if __name__ == "__main__":
    main()
