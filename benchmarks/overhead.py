"""Cost of a simulated federation against the same local work in one plain PyTorch loop.

For every (data set, strategy, number of clients) job, runs the app's own federation
(``flwr run`` from the project root, or ``flwr.simulation.run_simulation`` in a fresh
process) and then the same work without Flower: the same partitions, model, seeds and
local SGD steps per client per round, FedAvg with Flower's own averaging (or
IFCA's loss-based choice and fl-clusters' per-cluster averaging) and every client's
test evaluation each round, one client after the other in one process with one torch
thread (a client's ``torch-threads``).

Round times are the ServerApp's own (``seconds`` in the run's rounds.jsonl: from
sending a round's training messages to aggregating its evaluation). Start-up is
measured from the start of the federation's (or the plain loop's) process to the
arrival of Flower's ``[ROUND 1/N]`` log line, which ``flwr run --stream`` delivers in
batches every 0.2 to 0.5 s; Flower's own time of all rounds (``strategy_s``, round 1
included) is recorded next to them. Bytes, ARI and accuracy come
from the run's ``summary.json``. Peak memory is reported twice: ``getrusage``'s maxrss
of one process (see the ``memory`` entries' ``rusage`` text) and the peak summed RSS of
the process tree, sampled every 0.5 s from /proc (shared pages count once per process).
Writes JSON to ``--out`` (the run's ``provenance``, the machine and the jobs) and
prints a markdown table.

    python benchmarks/overhead.py [--clients 20 100 1000] [--datasets digits fashion-mnist]
        [--strategies fedavg ifca] [--rounds 5] [--via flwr-run|simulation]
        [--max-in-flight 0 32 512] [--model mlp|cnn] [--num-gpus 0.1] [--data-root DIR]
        [--out benchmarks/measured/overhead.json]

The federation's runners are benchmarks/federation_runs.py's, the plain loop is
benchmarks/plain_loop.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from benchmarks.federation_runs import (
    federation_flwr_run,
    federation_simulation,
    run_config,
)
from benchmarks.plain_loop import plain_loop
from fl_clusters.files import atomic_output
from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "measured" / "overhead.json"


def measure(
    dataset: str, strategy: str, clients: int, rounds: int, via: str,
    max_in_flight: int = 0, plain: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None, num_gpus: float = 0.0,
) -> dict[str, Any]:
    """One job: the federation, then the plain loop, and their ratio of round times.

    ``plain`` reuses a plain-loop result of the same job (another message window
    does not change the plain loop's work).
    """
    results_dir = tempfile.mkdtemp(prefix="overhead-")
    config = run_config(dataset, strategy, clients, rounds, results_dir, max_in_flight,
                        overrides)
    try:
        if via == "flwr-run":
            federation = federation_flwr_run(config, clients)
        else:
            federation = federation_simulation(config, clients, num_gpus)
    finally:
        shutil.rmtree(results_dir)
    plain = plain or plain_loop(config, clients)
    return {
        "dataset": dataset,
        "strategy": strategy,
        "clients": clients,
        "rounds": rounds,
        "via": via,
        "max_in_flight": max_in_flight,
        "num_gpus_per_client": num_gpus,
        "run_config_overrides": overrides or {},
        "federation": federation,
        "plain_loop": plain,
        "round_ratio": federation["round_mean_s"] / plain["round_mean_s"],
        "startup_to_round1_end_ratio": federation["startup_to_round1_end_s"]
        / plain["startup_to_round1_end_s"],
    }


def machine_info() -> dict[str, Any]:
    """Where the numbers were taken."""
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "flwr": version("flwr"),
        "cuda": torch.cuda.is_available(),
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per job: round times, their ratio, start-up, bytes, memory and scores."""
    lines = [
        "| data set | strategy | clients | via | max in flight | fed s/round | plain s/round "
        "| ratio | fed s/round, Flower clock, all rounds | fed start..R1 end s "
        "| plain start..R1 end s | MB sent / recv | fed tree RSS MB | plain RSS MB "
        "| ARI | fed acc | plain acc |",
        "|" + "---|" * 17,
    ]
    for row in rows:
        fed, plain, summary = row["federation"], row["plain_loop"], row["federation"]["summary"]
        lines.append(
            f"| {row['dataset']} | {row['strategy']} | {row['clients']} | {row['via']} "
            f"| {row.get('max_in_flight') or 'default'} "
            f"| {fed['round_mean_s']:.2f} | {plain['round_mean_s']:.3f} "
            f"| {row['round_ratio']:.1f} | {fed['strategy_round_mean_s']:.2f} "
            f"| {fed['startup_to_round1_end_s']:.1f} "
            f"| {plain['startup_to_round1_end_s']:.1f} "
            f"| {summary['bytes_sent'] / 1e6:.2f} / {summary['bytes_received'] / 1e6:.2f} "
            f"| {fed['memory']['tree_peak_rss_mb']:.0f} "
            f"| {plain['memory']['rusage_maxrss_mb']:.0f} | {summary['ari']:.3f} "
            f"| {summary['personalized_accuracy']:.4f} | {plain['accuracy']:.4f} |"
        )
    return "\n".join(lines)


def write_results(
    out: Path, provenance: dict[str, Any], info: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """Write the run's provenance, the machine facts and the jobs measured so far to ``out``
    (atomically: a run killed while writing leaves the file as it was)."""
    with atomic_output(out) as stream:
        stream.write((json.dumps({"provenance": provenance, "machine": info, "jobs": rows},
                                 indent=2) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--datasets", nargs="+", default=["digits", "fashion-mnist"])
    parser.add_argument("--strategies", nargs="+", choices=("fedavg", "ifca"),
                        default=["fedavg", "ifca"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--via", choices=("flwr-run", "simulation"), default="flwr-run")
    parser.add_argument("--max-in-flight", type=int, nargs="+", default=[0],
                        help="run-config max-in-flight values to try (0 = the app's default)")
    parser.add_argument("--data-root", default="",
                        help="folder of the data set's files ('' = the loader's default)")
    parser.add_argument("--model", default="mlp", help="the run-config key model (mlp, cnn)")
    parser.add_argument("--num-gpus", type=float, default=0.0,
                        help="GPUs per client with --via simulation (0.1: ten clients a GPU)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.num_gpus and args.via != "simulation":
        parser.error("--num-gpus needs --via simulation (flwr run takes the federation's "
                     "client-resources-num-gpus)")
    overrides = {"model": args.model, "data-root": args.data_root}
    source = measurement_provenance()
    info = {**machine_info(), "load_average_before": os.getloadavg()}
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        for strategy in args.strategies:
            for clients in args.clients:
                plain = None
                for window in args.max_in_flight:
                    rows.append(measure(dataset, strategy, clients, args.rounds, args.via,
                                        window, plain, overrides, args.num_gpus))
                    plain = rows[-1]["plain_loop"]
                    # Written after every job: a run cut short keeps what it measured.
                    info["load_average_after"] = os.getloadavg()
                    write_results(args.out, source, info, rows)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
