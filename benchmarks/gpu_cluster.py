"""GPU check: fractional GPUs, and a two-node Ray cluster, against the plain loop.

    PYTHONPATH=$PWD python benchmarks/gpu_cluster.py [--clients 100 1000] [--rounds 5] \\
        [--data-root DIR] [--out benchmarks/measured/gpu_cluster.json]

For FedAvg and IFCA with the CNN on Fashion-MNIST, at each client count, two
federations run on the machine's GPU, each against the same work in one plain
PyTorch loop on that GPU (benchmarks/overhead.py measures both):

- one Ray node, each client asking for ``--gpus-per-client`` of a GPU (0.1: ten
  clients share it);
- a two-node Ray cluster on this machine (deploy/loopback_ray_cluster.py), each
  node declaring one GPU (on a one-GPU machine both share it) and half the cores,
  the simulation joining it through ``RAY_ADDRESS`` as docs/cluster.md does, each
  client asking for ``--cluster-gpus-per-client``.

The results name the card and say where the clients trained (the summary's
``placement``: training tasks per Ray node and device). On a machine without a
CUDA GPU the script says so and measures nothing; ``--cpu`` runs the same jobs on
the CPU (digits, the MLP, no GPU requested) to check the script itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from benchmarks.overhead import machine_info, markdown_table, measure, write_results
from deploy.loopback_ray_cluster import LOOPBACK, LoopbackCluster
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).parent / "measured" / "gpu_cluster.json"


@contextmanager
def two_node_cluster(num_cpus: int, num_gpus: int) -> Iterator[LoopbackCluster]:
    """A loopback two-node Ray cluster, joined by every simulation started inside."""
    cluster = LoopbackCluster(Path(tempfile.mkdtemp(prefix="flc-gpu-")), num_cpus, num_gpus)
    saved = {key: os.environ.get(key) for key in (*LOOPBACK, "RAY_ADDRESS")}
    os.environ.update(LOOPBACK, RAY_ADDRESS=cluster.address)
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cluster.stop()


def job_row(row: dict[str, Any], layout: str) -> dict[str, Any]:
    """One measured job, labelled with its layout and where its clients trained."""
    return {**row, "layout": layout,
            "placement": row["federation"]["summary"].get("placement", {})}


def main() -> None:
    """Measure every job, writing after each one; print the table at the end."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--strategies", nargs="+", choices=("fedavg", "ifca"),
                        default=["fedavg", "ifca"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-root", default="",
                        help="folder of Fashion-MNIST's IDX files ('' = the loader's default)")
    parser.add_argument("--gpus-per-client", type=float, default=0.1)
    parser.add_argument("--cluster-gpus-per-client", type=float, default=0.2)
    parser.add_argument("--cpu", action="store_true",
                        help="check the script on the CPU: digits, the MLP, no GPU asked for")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_cluster: no CUDA GPU on this machine (torch.cuda.is_available() is "
              "False); nothing measured. Run it on a GPU machine, or with --cpu to check "
              "the script.")
        return
    dataset, model = ("digits", "mlp") if args.cpu else ("fashion-mnist", "cnn")
    per_client = 0.0 if args.cpu else args.gpus_per_client
    cluster_per_client = 0.0 if args.cpu else args.cluster_gpus_per_client
    overrides = {"model": model, "data-root": args.data_root}
    info = {
        **machine_info(),
        "card": "cpu only (--cpu)" if args.cpu else torch.cuda.get_device_name(0),
        "command": " ".join(sys.argv),
    }
    cores = os.cpu_count() or 2
    source = measurement_provenance()
    rows: list[dict[str, Any]] = []
    for clients in args.clients:
        for strategy in args.strategies:
            single = measure(dataset, strategy, clients, args.rounds, "simulation",
                             overrides=overrides, num_gpus=per_client)
            rows.append(job_row(single, f"1 Ray node, {per_client} GPU a client"))
            write_results(args.out, source, info, rows)
            with two_node_cluster(max(1, cores // 2), 0 if args.cpu else 1):
                joined = measure(dataset, strategy, clients, args.rounds, "simulation",
                                 plain=single["plain_loop"], overrides=overrides,
                                 num_gpus=cluster_per_client)
            rows.append(job_row(joined, f"2 Ray nodes, {cluster_per_client} GPU a client"))
            write_results(args.out, source, info, rows)
    print(f"card: {info['card']}")
    print(markdown_table(rows))
    for row in rows:
        print(row["layout"], row["strategy"], row["clients"], "placement:", row["placement"])


if __name__ == "__main__":
    main()
