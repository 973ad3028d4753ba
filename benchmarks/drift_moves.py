"""Do the strategies move clients whose data change group mid-run? (issue 31)

An in-process federation (no Ray, no SuperLink): 10 digits clients in 2 groups,
10 rounds, fl-clusters' own ClientApp and ServerApp loop. From round
``SWAP_ROUND`` the nodes of partitions 0 and 1 (groups 0 and 1) swap their data,
so each should end in the cluster of its new group. For seeds 0 and 1, on
label-permutation and on rotation, it runs WeCFL with 10 and 100 local steps,
IFCA and CFL (every other setting at its default) and records per run: WeCFL's
``reassigned_per_round``, the cluster each swapped node used in every round
(``assignment_history``), whether each ended in the cluster of its new group's
other members, and the final ARI.

Writes ``benchmarks/measured/drift_moves.json``::

    nice -n 10 .venv/bin/python benchmarks/drift_moves.py
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from flwr.app import Message
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.flower_log import show_warnings_only
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.server_app import run_federation
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).resolve().parent / "measured" / "drift_moves.json"
NUM_CLIENTS = 10
NUM_ROUNDS = 10
SWAP_ROUND = 4
SWAPPED = (1000, 1001)  # the nodes of partitions 0 and 1: groups 0 and 1
SEEDS = (0, 1)
STRUCTURES = ("label-permutation", "rotation")
CASES = (("wecfl", 10), ("wecfl", 100), ("ifca", None), ("cfl", None))


class SwappingGrid(LoopbackGrid):
    """Nodes ``1000 + i`` with ``partition-id`` ``i``, each a ClientApp called in process.

    From the first message of round ``swap_round`` on, the two ``SWAPPED`` nodes
    hold each other's partition.
    """

    def __init__(self, client_app: ClientApp, run_config: dict[str, Any], swap_round: int) -> None:
        super().__init__(client_app, NUM_CLIENTS, run_config)
        self.swap_round = swap_round

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Swap the data once the round is due, then answer every message now."""
        messages = list(messages)
        for message in messages:
            config = message.content.config_records.get("config")
            if config is not None and int(config.get(p.CFG_ROUND, 0)) >= self.swap_round:
                first, second = SWAPPED
                self.contexts[first].node_config["partition-id"] = 1
                self.contexts[second].node_config["partition-id"] = 0
        return super().push_messages(messages)


def swapped_outcome(folder: Path) -> dict[str, Any]:
    """Per swapped node: its cluster each round, and whether it ended with its new group.

    ``assignment_history`` lists clients in the row order of ``assignments.csv``,
    whose ``true_cluster`` is each node's group at the end (after the swap).
    """
    summary = json.loads((folder / "summary.json").read_text())
    with (folder / "assignments.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    order = [int(row["node_id"]) for row in rows]
    history = summary.get("assignment_history") or []
    nodes = {}
    for node in SWAPPED:
        row = rows[order.index(node)]
        peers = [r["assigned_cluster"] for r in rows
                 if int(r["node_id"]) not in SWAPPED and r["true_cluster"] == row["true_cluster"]]
        peer_cluster = Counter(peers).most_common(1)[0][0]
        nodes[str(node)] = {
            "new_group": int(row["true_cluster"]),
            "cluster_per_round": [used[order.index(node)] for used in history],
            "final_cluster": int(row["assigned_cluster"]),
            "new_group_peers_cluster": int(peer_cluster),
            "joined_new_group": row["assigned_cluster"] == peer_cluster,
        }
    return {
        "reassigned_per_round": summary.get("reassigned_per_round"),
        "swapped_nodes": nodes,
        "ari": summary["ari"],
        "num_clusters_found": summary.get("num_clusters_found"),
    }


def run_case(strategy: str, local_steps: int | None, structure: str, seed: int) -> dict[str, Any]:
    """One federation; its settings and :func:`swapped_outcome`."""
    with tempfile.TemporaryDirectory() as results:
        overrides: dict[str, Any] = {
            "strategy": strategy, "dataset": "digits", "cluster-structure": structure,
            "num-clusters": 2, "num-rounds": NUM_ROUNDS, "plots": False, "seed": seed,
            "min-nodes": NUM_CLIENTS, "results-dir": results,
        }
        if local_steps is not None:
            overrides["local-steps"] = local_steps
        settings = parse_run_config(overrides)
        torch.manual_seed(seed)
        grid = SwappingGrid(build_client_app(settings), settings, SWAP_ROUND)
        with contextlib.redirect_stdout(io.StringIO()):
            folder = run_federation(grid, settings)
        outcome = swapped_outcome(folder)
    return {"strategy": strategy, "structure": structure,
            "local_steps": settings["local-steps"], "seed": seed, **outcome}


def main() -> None:
    """Run every case and write ``OUT``."""
    show_warnings_only()
    # Message() needs the run identity Flower gives an app process.
    for name in ("_run_id", "_node_id", "_task_id"):
        setattr(TaskIdentity, name, 1)
    provenance = measurement_provenance()
    runs = []
    for structure in STRUCTURES:
        for seed in SEEDS:
            for strategy, steps in CASES:
                run = run_case(strategy, steps, structure, seed)
                joined = [n["joined_new_group"] for n in run["swapped_nodes"].values()]
                print(f"{structure:17} seed {seed} {strategy:5} steps {run['local_steps']:3}: "
                      f"ARI {run['ari']:.3f}, swapped joined {joined}, "
                      f"reassigned {run['reassigned_per_round']}", flush=True)
                runs.append(run)
    document = {
        "provenance": provenance,
        "setup": {"dataset": "digits", "num_clients": NUM_CLIENTS, "num_groups": 2,
                  "num_rounds": NUM_ROUNDS, "swap_round": SWAP_ROUND,
                  "swapped_nodes": {str(n): {"partition_before": i, "partition_after": 1 - i}
                                    for i, n in enumerate(SWAPPED)}},
        "runs": runs,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
