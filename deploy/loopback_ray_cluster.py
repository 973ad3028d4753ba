"""A two-node Ray cluster on this machine, on loopback only (tests, GPU check).

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_TMPDIR=<own dir> \\
        python deploy/loopback_ray_cluster.py [--num-cpus 1] [--num-gpus 0]

Starts a head and one worker node (Ray's own ``ray.cluster_utils.Cluster``, what
Ray's multi-node tests use on one machine), prints ``address <gcs address>`` and
``nodes <head id> <worker id>``, then reads commands on standard input:
``kill-worker`` kills the worker node's processes at once (a machine lost), and
the end of input stops the cluster.

Why not two ``ray start`` commands: Ray replaces ``--node-ip-address=127.0.0.1``
with the machine's network address, and a worker started by ``ray start`` always
advertises that address. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` Ray takes
127.0.0.1 for every node and driver, and ``Cluster`` starts the worker in-process
where ``ray start`` would refuse that setting. ``RAY_TMPDIR`` keeps the session
folders and Ray's ``ray_current_cluster`` file out of Ray's default temp folder,
where a file left behind would make every later plain ``ray.init()`` on the
machine join this dead cluster.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

# The environment of every process that joins the cluster: Ray on 127.0.0.1.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


class LoopbackCluster:
    """This script in a subprocess: the cluster's address and node ids, and its end.

    Parameters
    ----------
    folder : Path
        The cluster's own temp folder (``RAY_TMPDIR``); keep it short, Ray's
        socket paths must stay under the 107 characters of AF_UNIX.
    num_cpus, num_gpus : int
        What each of the two nodes declares.
    """

    def __init__(self, folder: Path, num_cpus: int = 1, num_gpus: int = 0) -> None:
        self.folder = folder
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, start_new_session=True,
            env={**os.environ, **LOOPBACK, "RAY_TMPDIR": str(folder)},
        )
        assert self.process.stdout is not None
        self.address = self._field("address")[0]
        self.head, self.worker = self._field("nodes")

    def _field(self, name: str) -> list[str]:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith(name + " "), f"cluster said {line!r} instead of {name!r}"
        return line.split()[1:]

    def kill_worker(self) -> None:
        """Kill the worker node's processes at once, as a lost machine."""
        self.process.stdin.write("kill-worker\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        assert self._field("worker") == ["killed"]

    def stop(self) -> None:
        """Shut the cluster down; kill what is left of its processes (raylets ignore TERM)."""
        if self.process.poll() is None:
            self.process.stdin.close()  # type: ignore[union-attr]
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        for pid in self.processes():
            os.kill(pid, signal.SIGKILL)

    def processes(self) -> list[int]:
        """Processes whose command line names this cluster's folder."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(self.folder).encode() in (
                    entry / "cmdline"
                ).read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found




def main() -> None:
    """Start the cluster, report it, and obey standard input until it closes."""
    from ray.cluster_utils import Cluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-cpus", type=int, default=1, help="CPUs each node declares")
    parser.add_argument("--num-gpus", type=int, default=0,
                        help="GPUs each node declares (on a one-GPU machine both share it)")
    args = parser.parse_args()
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0" or not os.environ.get(
        "RAY_TMPDIR"
    ):
        sys.exit("set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (loopback) and RAY_TMPDIR "
                 "(a folder of the caller's) first")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": args.num_cpus, "num_gpus": args.num_gpus, "include_dashboard": False,
    })
    worker = cluster.add_node(num_cpus=args.num_cpus, num_gpus=args.num_gpus)
    cluster.wait_for_nodes()
    print("address", cluster.address, flush=True)
    print("nodes", cluster.head_node.node_id, worker.node_id, flush=True)
    for line in sys.stdin:
        if line.strip() == "kill-worker":
            cluster.remove_node(worker, allow_graceful=False)
            print("worker killed", flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    main()
