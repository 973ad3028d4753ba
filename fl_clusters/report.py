"""The final report: every node scores every cluster model on its held-out test split."""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.client_errors import describe_error
from fl_clusters.placement import PLACEMENT
from fl_clusters.strategies.kit.interface import ServerStrategy


def report_fields(num_models: int) -> dict[str, p.MetricField]:
    """The fields of a node's final report that :mod:`fl_clusters.results` reads."""
    # A diverged cluster model's loss is +Inf (protocol.reported_loss).
    losses = p.MetricField(length=num_models, infinite=True)
    return {
        "test-accuracy": p.MetricField(length=num_models, low=0.0, high=1.0),
        "test-loss": losses,
        # Only from nodes the server sent no cluster (they choose by it).
        "train-loss": p.MetricField(length=num_models, required=False, infinite=True),
        "num-test": p.MetricField(low=1.0, integer=True),
        "local-accuracy": p.MetricField(low=0.0, high=1.0, required=False),
        # A simulation with attack clients (fl_clusters.attack_scores reads them).
        p.M_BACKDOOR_SUCCESS: p.MetricField(length=num_models, low=0.0, high=1.0,
                                            required=False),
        "local-backdoor-success": p.MetricField(low=0.0, high=1.0, required=False),
        "backdoor-inputs": p.MetricField(low=1.0, integer=True, required=False),
        "num-partitions": p.MetricField(low=1.0, integer=True, required=False),
        "attacker": p.MetricField(low=0.0, high=1.0, integer=True, required=False),
    }


def report_query(
    strategy: ServerStrategy, arrays: ArrayRecord, node: int, settings: Mapping[str, Any]
) -> Message:
    """The report query to ``node``: every cluster model, and the node's cluster if known."""
    assigned = strategy.assignment_for(node)
    config = ConfigRecord(
        {
            p.CFG_ASSIGNED: -1 if assigned is None else int(assigned),
            p.CFG_NUM_SAMPLES: settings["mcfl-feature-samples"],
            # FedEM: the node also scores its mixture of the clusters.
            p.CFG_MIXTURE: strategy.scoring().report_mixture,
        }
    )
    content = RecordDict({p.CLUSTERS: arrays, p.CONFIG: config})
    return Message(content=content, dst_node_id=node, message_type=p.QUERY_REPORT)


# Stream of the report's sample, mixed with the seed (data streams use 0-6).
REPORT_SAMPLE_STREAM = 101


def report_sample(
    strategy: ServerStrategy, nodes: list[int], settings: Mapping[str, Any]
) -> list[int]:
    """The nodes the final report asks: every one, or ``report-clients`` drawn with the seed.

    Drawn among the nodes in key order, so the same seed asks the same clients.
    """
    count = int(settings["report-clients"])
    if count == 0 or count >= len(nodes):
        return nodes
    ordered = strategy.nodes.in_order(nodes)
    rng = np.random.default_rng([int(settings["seed"]), REPORT_SAMPLE_STREAM])
    return [ordered[int(i)] for i in np.sort(rng.choice(len(ordered), count, replace=False))]


def collect_report(
    grid: Grid, strategy: ServerStrategy, arrays: ArrayRecord, nodes: list[int],
    settings: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], set[int]]:
    """Ask every node to score every final cluster model on its held-out test split.

    Returns the usable reports, sorted by partition, and the nodes that answered at
    all (a malformed or error reply counts as an answer, silence does not).
    """
    timeout = settings["round-timeout"]
    queries = [report_query(strategy, arrays, node, settings) for node in nodes]
    replies = list(grid.send_and_receive(queries, timeout=timeout))
    for node in sorted(set(nodes) - {r.metadata.src_node_id for r in replies}):
        log(WARNING, "report: node %d did not answer within round-timeout (%.0f s)", node,
            timeout)
    fields = report_fields(len(p.unpack_clusters(arrays)))
    rows = [row for reply in replies if (row := report_row(reply, strategy, fields))]
    answered = {r.metadata.src_node_id for r in replies}
    return sorted(rows, key=lambda r: r.get("partition-id", r["node-id"])), answered


def report_row(
    reply: Message, strategy: ServerStrategy, fields: Mapping[str, p.MetricField]
) -> dict[str, Any] | None:
    """One node's report as a row of the results, or ``None`` (logged) if unusable."""
    node = reply.metadata.src_node_id
    if reply.has_error():
        source = strategy.nodes.describe(node)
        log(WARNING, "report: %s failed: %s", source, describe_error(reply.error.reason, source))
        return None
    metrics = reply.content.metric_records.get(p.METRICS)
    problem = f"no '{p.METRICS}' record" if metrics is None else p.check_metrics(metrics, fields)
    # A report that claims another node's key or partition would file its numbers
    # under that node's row.
    problem = problem or strategy.nodes.claim_problem(node, metrics)  # type: ignore[arg-type]
    if problem is not None:
        log(WARNING, "report: rejected reply from %s: %s", strategy.nodes.describe(node), problem)
        return None
    assigned = strategy.assignment_for(node)
    if assigned is None and "train-loss" not in metrics:  # type: ignore[operator]
        log(WARNING, "report: rejected reply from %s: no 'train-loss' to choose its "
            "cluster by", strategy.nodes.describe(node))
        return None
    row = {key: metrics[key] for key in metrics}  # type: ignore[union-attr,index]
    row["node-id"] = node
    change = strategy.nodes.partition_change(node, metrics)  # type: ignore[arg-type]
    if change is not None:
        log(WARNING, "report: %s", change)
    # The handshake's partition, never the report's claim; a plug-in app's report
    # carries none at all.
    partition = strategy.nodes.partitions.get(node)
    if partition is not None:
        row["partition-id"] = partition
    row.update(placement_fields(reply))
    row["assigned"] = (
        int(assigned) if assigned is not None else int(np.argmin(row["train-loss"]))
    )
    return row


def placement_fields(reply: Message) -> dict[str, Any]:
    """Where the node trained (:mod:`fl_clusters.placement`): its last Ray node and
    device, and its training tasks per place; empty values for a client that keeps
    no placement (a plug-in app's own report, an older client)."""
    record = reply.content.config_records.get(PLACEMENT)
    if record is None:
        return {"ray_node": "", "device": "", "tasks_by_place": {}}
    places = [str(place) for place in record.get("places", [])]  # type: ignore[union-attr]
    tasks = [int(n) for n in record.get("tasks", [])]  # type: ignore[union-attr]
    return {
        "ray_node": str(record.get("ray-node", "")),
        "device": str(record.get("device", "")),
        "tasks_by_place": dict(zip(places, tasks, strict=False)),
    }
