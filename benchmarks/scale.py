"""Cross-device scale: N simulated clients of which a fixed number take part in a round.

For every (strategy, N) job, runs the app's own federation with ``fraction-train``
and ``fraction-evaluate`` both ``--sampled / N`` (the last round evaluates every
client, the final report asks every client: docs/performance.md, "What a round
messages") and measures start-up to the end of round 1, seconds a round after it,
bytes sent and received, and peak memory, with benchmarks/overhead.py's
measurements (``benchmarks/federation_runs.py``: its ``flwr run`` or
``run_simulation`` runner and round marks; ``benchmarks/processes.py``:
process-tree memory). A round's seconds are reported for the rounds
that message only their samples (2..N-1) and for the last round apart. Then the
same sampled work in one plain PyTorch loop: each round the same number of
clients, drawn with the run's seed, train and evaluate one after the other in
one process, their data loaded only when first drawn (``plain_loop``): what the
round would cost without Flower. The rows go to ``--out`` after every job (a run
cut short keeps what it measured), with the run's provenance, and a markdown
table is printed. Jobs already in ``--out`` are kept (a job measured again replaces its
row); each job records the provenance and machine load it was measured under.

    python benchmarks/scale.py [--clients 1000 3000 10000] [--sampled 100]
        [--strategies fedavg ifca] [--rounds 10] [--dataset fashion-mnist]
        [--data-root DIR] [--via flwr-run|simulation] [--out benchmarks/measured/scale.json]
        [--pool P] [--pfl-python .venv-pfl/bin/python] [--run-config KEY=VALUE ...]

The default job is issue 46's: Fashion-MNIST in four rotation groups with a copy of
the data set per group (IFCA's rotated set), the MLP, 10 rounds. ``--pool P``: the N
clients are logical (run-config ``num-clients``) on a pool of P SuperNodes
(docs/performance.md, "Clients that are not nodes"). ``--pfl-python``: then
pfl-research runs the same N (benchmarks/pfl_peer.py, in a Python of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.clustering_matrix import run_config_overrides
from benchmarks.federation_runs import (
    federation_flwr_run,
    federation_simulation,
    round_stats,
    run_config,
)
from benchmarks.overhead import machine_info, write_results
from benchmarks.plain_loop import client_learner, plain_evaluate, plain_round
from benchmarks.processes import in_fresh_process, maxrss_mb
from fl_clusters.config import parse_run_config
from fl_clusters.learner import TorchLearner
from fl_clusters.server_app import initial_arrays
from fl_clusters.sweep.provenance import measurement_provenance

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "measured" / "scale.json"
PFL_OUT = ROOT / "benchmarks" / "measured" / "scale-pfl.json"
# Issue 46's job: rotation groups with a copy of the data set per group.
JOB = {"cluster-structure": "rotation", "num-clusters": 4, "copy-per-group": True,
       "model": "mlp"}


def sampled_config(
    dataset: str, strategy: str, clients: int, sampled: int, rounds: int, results_dir: str,
    overrides: dict[str, Any], pool: int = 0,
) -> dict[str, Any]:
    """The job's run config: ``sampled`` of ``clients`` train and evaluate a round.

    ``pool`` > 0: the clients are logical (``num-clients``), served by ``pool`` nodes.
    """
    fraction = sampled / clients
    logical = {"num-clients": clients, "min-nodes": pool} if pool else {}
    return run_config(dataset, strategy, clients, rounds, results_dir, overrides={
        **JOB, "fraction-train": fraction, "fraction-evaluate": fraction, **logical,
        **overrides,
    })


def _plain_child(config: dict[str, Any], clients: int, sampled: int, t0: float,
                 conn: Any) -> None:
    settings = parse_run_config(config)
    torch.set_num_threads(settings["torch-threads"])
    num_clusters = settings["num-clusters"] if settings["strategy"] == "ifca" else 1
    rng = np.random.default_rng(settings["seed"])
    start = time.monotonic()
    learners: dict[int, TorchLearner] = {}
    known: dict[int, dict[bytes, float]] = {}

    def drawn() -> list[int]:
        """``sampled`` clients, each client's learner built when it is first drawn."""
        chosen = sorted(int(c) for c in rng.choice(clients, size=sampled, replace=False))
        shared = next(iter(learners.values())).model if learners else None
        for client in chosen:
            if client not in learners:
                learners[client] = client_learner(settings, client, clients, shared)
                shared = learners[client].model
                known[client] = {}
        return chosen

    models, round_s, accuracy = [initial_arrays(settings)], [], 0.0
    for server_round in range(1, settings["num-rounds"] + 1):
        round_start = time.monotonic()
        train = drawn()
        models = plain_round([learners[c] for c in train], models, settings, server_round,
                             num_clusters, [known[c] for c in train])
        if settings["fraction-evaluate"] > 0:  # the federation's rounds evaluate too
            evaluate = drawn()
            accuracy = plain_evaluate([learners[c] for c in evaluate], models,
                                      [known[c] for c in evaluate])
        round_s.append(time.monotonic() - round_start)
    conn.send({
        "start": start,
        "round_s": round_s,
        "accuracy": accuracy,
        "clients_loaded": len(learners),
        "maxrss_mb": maxrss_mb(resource.getrusage(resource.RUSAGE_SELF)),
    })


def plain_loop(config: dict[str, Any], clients: int, sampled: int) -> dict[str, Any]:
    """The job's sampled work in one plain PyTorch loop, in a fresh process."""
    result, t0, tree_mb = in_fresh_process(_plain_child, config, clients, sampled)
    return {
        "work": f"each round {sampled} clients drawn (seeded) train, then {sampled} drawn "
        "evaluate, one after the other; a client's data are loaded when first drawn and "
        "count in the round that draws it",
        # Process start and imports, then round 1 (its clients' data loaded in it): the
        # federation's start-up to the end of its round 1 covers the same.
        "startup_to_round1_end_s": result["start"] - t0 + result["round_s"][0],
        **round_stats(result["round_s"]),
        "accuracy": result["accuracy"],
        "clients_loaded": result["clients_loaded"],
        "memory": {
            "rusage_maxrss_mb": result["maxrss_mb"],
            "rusage": "maxrss of the plain loop's process (RUSAGE_SELF)",
            "tree_peak_rss_mb": tree_mb,
        },
    }


def measure(
    dataset: str, strategy: str, clients: int, sampled: int, rounds: int, via: str,
    overrides: dict[str, Any], pool: int = 0,
) -> dict[str, Any]:
    """One job: the federation, then the plain loop of the same sampled work.

    ``pool`` > 0: logical clients on that many SuperNodes; 0: a SuperNode a client.
    """
    results_dir = tempfile.mkdtemp(prefix="scale-")
    config = sampled_config(dataset, strategy, clients, sampled, rounds, results_dir,
                            overrides, pool)
    nodes = pool or clients
    try:
        federation = (federation_flwr_run(config, nodes) if via == "flwr-run"
                      else federation_simulation(config, nodes))
    finally:
        shutil.rmtree(results_dir)
    plain = plain_loop(config, clients, sampled)
    round_s = federation["round_s"]
    # Rounds 2..N-1 message their samples only; round N also evaluates every client.
    sampled_rounds = round_s[1:-1] or round_s
    return {
        "dataset": dataset,
        "strategy": strategy,
        "clients": clients,
        "mode": f"logical clients on a pool of {pool} nodes" if pool else "a node a client",
        "sampled": sampled,
        "rounds": rounds,
        "via": via,
        "run_config": {key: value for key, value in config.items() if key != "results-dir"},
        "federation": federation,
        "sampled_round_mean_s": float(np.mean(sampled_rounds)),
        "sampled_rounds": "rounds 2..N-1" if len(round_s) > 2 else "every round (fewer than 3)",
        "final_round_s": round_s[-1],
        "plain_loop": plain,
        "round_ratio": float(np.mean(sampled_rounds)) / plain["round_mean_s"],
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One line per job: start-up, seconds a round against the plain loop, bytes, memory."""
    lines = [
        "| strategy | clients | mode | sampled a round | start..R1 end s | s/sampled round | "
        "last round s (every client evaluated) | plain s/round | MB sent / recv "
        "| tree peak RSS MB | ARI |",
        "|" + "---|" * 11,
    ]
    for row in rows:
        fed, summary = row["federation"], row["federation"]["summary"]
        lines.append(
            f"| {row['strategy']} | {row['clients']} | {row.get('mode', 'a node a client')} "
            f"| {row['sampled']} "
            f"| {fed['startup_to_round1_end_s']:.1f} | {row['sampled_round_mean_s']:.2f} "
            f"| {row['final_round_s']:.2f} "
            f"| {row['plain_loop']['round_mean_s']:.2f} "
            f"| {summary['bytes_sent'] / 1e6:.0f} / {summary['bytes_received'] / 1e6:.0f} "
            f"| {fed['memory']['tree_peak_rss_mb']:.0f} | {summary['ari']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--sampled", type=int, default=100,
                        help="clients that train (and evaluate) a round, at every N")
    parser.add_argument("--strategies", nargs="+", choices=("fedavg", "ifca"),
                        default=["fedavg", "ifca"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--data-root", default="",
                        help="folder of the data set's files ('' = the loader's default)")
    parser.add_argument("--via", choices=("flwr-run", "simulation"), default="flwr-run")
    parser.add_argument("--pool", type=int, default=0,
                        help="logical clients (num-clients) on this many SuperNodes; "
                             "0 = a SuperNode a client")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--pfl-python", type=Path, default=None,
                        help="a Python with pfl-research installed (benchmarks/pfl_peer.py): "
                             "after these jobs, pfl runs the same N with 1 and 2 processes")
    parser.add_argument("--pfl-out", type=Path, default=PFL_OUT)
    parser.add_argument("--run-config", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more run-config keys for every job, as `flwr run --run-config` "
                             "reads them (e.g. validation-fraction=0.0 at 10,000 clients)")
    args = parser.parse_args()
    if any(args.sampled > clients for clients in args.clients):
        parser.error(f"--sampled {args.sampled} exceeds the smallest --clients")
    source = measurement_provenance()
    info = machine_info()
    rows = earlier_jobs(args.out)
    for strategy in args.strategies:
        for clients in args.clients:
            load_before = os.getloadavg()
            row = measure(args.dataset, strategy, clients, args.sampled, args.rounds, args.via,
                          {"data-root": args.data_root, **run_config_overrides(args.run_config)},
                          args.pool)
            row["measured"] = {"provenance": source, "load_average_before": load_before,
                               "load_average_after": os.getloadavg()}
            rows = [kept for kept in rows if job_key(kept) != job_key(row)] + [row]
            write_results(args.out, source, info, rows)
    print(markdown_table(rows))
    if args.pfl_python is not None:
        # The peer in the same run, on the same machine (issue 54): its own venv.
        subprocess.run([str(args.pfl_python), str(ROOT / "benchmarks" / "pfl_peer.py"),
                        "--users", *map(str, args.clients), "--sampled", str(args.sampled),
                        "--rounds", str(args.rounds), "--processes", "1", "2",
                        "--evaluate", "none", "--out", str(args.pfl_out)], check=True)


def job_key(row: dict[str, Any]) -> str:
    """What a job measured: its strategy, clients, sampled clients and run config."""
    return json.dumps([row["strategy"], row["clients"], row["sampled"], row["run_config"]],
                      sort_keys=True)


def earlier_jobs(out: Path) -> list[dict[str, Any]]:
    """The jobs ``out`` already holds, each with the provenance it was measured under; a
    job measured again replaces its row, the others are kept."""
    if not out.exists():
        return []
    return list(json.loads(out.read_text())["jobs"])


if __name__ == "__main__":
    main()
