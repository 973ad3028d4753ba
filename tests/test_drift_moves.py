"""Clients whose data change group mid-run: IFCA moves them, WeCFL keeps them (issue 31).

An in-process federation of 10 digits clients in 2 label-permutation groups
where, from round ``SWAP_ROUND``, the nodes of partitions 0 and 1 (groups 0 and
1) swap their data. IFCA's loss-based choice moves both to their new group's
cluster. WeCFL re-runs k-means over the trained models every round, as its
authors do, yet a model trained from a cluster model stays nearest that cluster
model, so k-means reproduces the partition it started from: nobody moves. The
WeCFL test pins that fixed point of the published algorithm; if it fails because
WeCFL now moves the swapped clients, the docs that describe the fixed point
must change with it (benchmarks/drift_moves.py measures both strategies).
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message

from fl_clusters import protocol as p
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.server_app import run_federation

NUM_CLIENTS = 10
NUM_ROUNDS = 6
SWAP_ROUND = 3
SWAPPED = (1000, 1001)  # LoopbackGrid's nodes of partitions 0 and 1: groups 0 and 1


class SwappingGrid(LoopbackGrid):
    """From round ``SWAP_ROUND`` on, the two ``SWAPPED`` nodes hold each other's partition."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Swap the data once the round is due, then deliver."""
        messages = list(messages)
        for message in messages:
            config = message.content.config_records.get("config")
            if config is not None and int(config.get(p.CFG_ROUND, 0)) >= SWAP_ROUND:
                self.contexts[SWAPPED[0]].node_config["partition-id"] = 1
                self.contexts[SWAPPED[1]].node_config["partition-id"] = 0
        return super().push_messages(messages)


def drifting_federation(strategy: str, results: Path) -> dict[str, Any]:
    """Run ``strategy`` on the swapping federation; per swapped node, its clusters.

    Returns the summary with ``"swapped"``: per swapped node, the cluster it used
    each round, its final cluster, and the final cluster of the other members of
    its group before and after the swap.
    """
    settings = parse_run_config({
        "strategy": strategy, "dataset": "digits", "cluster-structure": "label-permutation",
        "num-clusters": 2, "num-rounds": NUM_ROUNDS, "plots": False, "seed": 0,
        "min-nodes": NUM_CLIENTS, "results-dir": str(results),
    })
    torch.manual_seed(0)
    folder = run_federation(
        SwappingGrid(build_client_app(settings), NUM_CLIENTS, settings), settings
    )
    summary = json.loads((folder / "summary.json").read_text())
    with (folder / "assignments.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    # assignment_history lists clients in assignments.csv's row order; true_cluster
    # there is each node's group at the end, after the swap.
    order = [int(row["node_id"]) for row in rows]

    def peers_cluster(group: int) -> int:
        clusters = [int(r["assigned_cluster"]) for r in rows
                    if int(r["node_id"]) not in SWAPPED and int(r["true_cluster"]) == group]
        return Counter(clusters).most_common(1)[0][0]

    summary["swapped"] = {}
    for node in SWAPPED:
        row = rows[order.index(node)]
        new_group = int(row["true_cluster"])
        summary["swapped"][node] = {
            "per_round": [used[order.index(node)] for used in summary["assignment_history"]],
            "final": int(row["assigned_cluster"]),
            "new_group_cluster": peers_cluster(new_group),
            "old_group_cluster": peers_cluster(1 - new_group),
        }
    return summary


@pytest.mark.usefixtures("server_identity")
def test_ifca_moves_both_swapped_clients_to_their_new_group(tmp_path: Path) -> None:
    summary = drifting_federation("ifca", tmp_path)
    for node, swapped in summary["swapped"].items():
        assert swapped["new_group_cluster"] != swapped["old_group_cluster"], node
        # Before the swap it used its first group's cluster, after it its new group's.
        assert swapped["per_round"][SWAP_ROUND - 2] == swapped["old_group_cluster"], swapped
        assert swapped["final"] == swapped["new_group_cluster"], swapped
    assert summary["ari"] == pytest.approx(1.0)


@pytest.mark.usefixtures("server_identity")
def test_wecfl_reclustering_keeps_the_swapped_clients_where_they_were(tmp_path: Path) -> None:
    summary = drifting_federation("wecfl", tmp_path)
    assert summary["reassigned_per_round"] == [0] * NUM_ROUNDS
    for node, swapped in summary["swapped"].items():
        assert swapped["new_group_cluster"] != swapped["old_group_cluster"], node
        assert swapped["per_round"] == [swapped["old_group_cluster"]] * NUM_ROUNDS, swapped
        assert swapped["final"] == swapped["old_group_cluster"], swapped
    assert summary["ari"] < 1.0
