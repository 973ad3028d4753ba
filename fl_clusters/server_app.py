"""The fl-clusters ServerApp: run a strategy, score the result, write the results folder."""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy
from rich.console import Console
from rich.table import Table

from fl_clusters import protocol as p
from fl_clusters.checkpoint import Checkpoint, CheckpointedRounds
from fl_clusters.config import parse_run_config
from fl_clusters.data import DATASET_SHAPES
from fl_clusters.errors import ConfigurationError, report_configuration_errors_in_one_line
from fl_clusters.handshake import NodeIdentities, identify_nodes
from fl_clusters.metrics import (
    MeteredGrid,
    density_clustering_scores,
    intra_inter_accuracy,
    labelling_scores,
    mcfl_scores,
    recovery_scores,
    rounds_to_target,
    soft_clustering_scores,
)
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.placement import NOWHERE, PLACEMENT
from fl_clusters.placement import SEPARATOR as PLACE_SEPARATOR
from fl_clusters.plots import write_run_plots
from fl_clusters.progress import RoundProgress
from fl_clusters.strategies.base import ClusteredStrategy, key_order, log_identity_problems
from fl_clusters.strategies.registry import build_strategy

NODE_WAIT_S = 60.0
NODE_QUIET_S = 1.0
NODE_SETTLE_MAX_S = 10.0
NODE_POLL_S = 0.2


def wait_for_nodes(grid: Grid, minimum: int) -> list[int]:
    """Wait until at least ``minimum`` nodes are connected, then while their count grows.

    Nodes register asynchronously; a run that sampled the first two to arrive
    would silently leave the rest out of round 1. Once ``minimum`` nodes are
    there, the wait goes on only while new nodes keep arriving (no arrival for
    ``NODE_QUIET_S``), and never longer than ``NODE_SETTLE_MAX_S``, so a
    federation that is already complete costs one quiet period, not a fixed wait.

    Parameters
    ----------
    grid : Grid
        The grid whose connected nodes are counted.
    minimum : int
        Nodes the run needs (run-config key ``min-nodes``).

    Returns
    -------
    list[int]
        The connected node ids, sorted.
    """
    start = time.monotonic()
    seen, changed_at, reached_at = -1, start, None
    while True:
        now = time.monotonic()
        nodes = sorted(grid.get_node_ids())
        if len(nodes) != seen:
            seen, changed_at = len(nodes), now
        if len(nodes) >= minimum:
            reached_at = now if reached_at is None else reached_at
            if now - changed_at >= NODE_QUIET_S or now - reached_at >= NODE_SETTLE_MAX_S:
                return nodes
        elif now - start > NODE_WAIT_S:
            raise RuntimeError(
                f"only {len(nodes)} nodes connected after {NODE_WAIT_S:.0f} s; the run needs "
                f"{minimum} (run-config key 'min-nodes')"
            )
        time.sleep(NODE_POLL_S)


def check_can_start(
    strategy: Strategy, nodes: list[int], identities: NodeIdentities
) -> None:
    """Stop before round 1 when the run cannot work, naming the problem and the fix.

    Raises
    ------
    ConfigurationError
        If every node says it cannot take part (its data set is missing, its
        partition is impossible...), or the strategy cannot run on this many nodes.
    """
    if isinstance(strategy, ClusteredStrategy):
        problem = strategy.federation_problem(len(nodes))
        if problem is not None:
            raise ConfigurationError(problem)
    if nodes and len(identities.startup_problems) == len(nodes):
        node, reason = sorted(identities.startup_problems.items())[0]
        raise ConfigurationError(f"no node can take part; node {node} said: {reason}")
    for node, reason in sorted(identities.startup_problems.items()):
        log(WARNING, "node %d cannot take part: %s", node, reason)


def build_configured_strategy(settings: Mapping[str, Any]) -> Strategy:
    """The strategy the run config names; a value it refuses is a configuration error."""
    try:
        return build_strategy(settings)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(str(err)) from err


def train_config(settings: Mapping[str, Any]) -> ConfigRecord:
    """The per-round training config every strategy sends to the clients."""
    return ConfigRecord(
        {
            p.CFG_LR: settings["lr"],
            p.CFG_EPOCHS: settings["local-epochs"],
            p.CFG_STEPS: settings["local-steps"],
            p.CFG_BATCH: settings["batch-size"],
        }
    )


def initial_arrays(settings: Mapping[str, Any]) -> ArrayRecord:
    """A freshly initialized model for the configured data set (seeded).

    Sized from :data:`~fl_clusters.data.DATASET_SHAPES`: the server never loads
    the data set itself.
    """
    input_shape, num_classes = DATASET_SHAPES[settings["dataset"]]
    model = build_model(settings["model"], input_shape, num_classes, seed=settings["seed"])
    return model_to_arrays(model)


def report_fields(num_models: int) -> dict[str, p.MetricField]:
    """The fields of a node's final report that :func:`summarize` reads."""
    scores = p.MetricField(length=num_models)
    return {
        "test-accuracy": p.MetricField(length=num_models, low=0.0, high=1.0),
        "test-loss": scores,
        # Only from nodes the server sent no cluster (they choose by it).
        "train-loss": p.MetricField(length=num_models, required=False),
        "num-test": p.MetricField(low=1.0, integer=True),
        "local-accuracy": p.MetricField(low=0.0, high=1.0, required=False),
    }


def collect_report(
    grid: Grid, strategy: Strategy, arrays: ArrayRecord, nodes: list[int], settings: Mapping
) -> tuple[list[dict[str, Any]], set[int]]:
    """Ask every node to score every final cluster model on its held-out test split.

    Returns the usable reports, sorted by partition, and the nodes that answered at
    all (a malformed or error reply counts as an answer, silence does not).
    """

    def report_query(node: int) -> Message:
        assigned = getattr(strategy, "assignment_for", lambda _: None)(node)
        config = ConfigRecord(
            {
                p.CFG_ASSIGNED: -1 if assigned is None else int(assigned),
                p.CFG_NUM_SAMPLES: settings["mcfl-feature-samples"],
                # FedEM: the node also scores its mixture of the clusters.
                p.CFG_MIXTURE: bool(getattr(strategy, "mixture", False)),
            }
        )
        content = RecordDict({p.CLUSTERS: arrays, p.CONFIG: config})
        return Message(content=content, dst_node_id=node, message_type=p.QUERY_REPORT)

    rows = []
    fields = report_fields(len(p.unpack_clusters(arrays)))
    timeout = settings["round-timeout"]
    replies = list(grid.send_and_receive([report_query(n) for n in nodes], timeout=timeout))
    for node in sorted(set(nodes) - {r.metadata.src_node_id for r in replies}):
        log(WARNING, "report: node %d did not answer within round-timeout (%.0f s)", node,
            settings["round-timeout"])
    for reply in replies:
        node = reply.metadata.src_node_id
        if reply.has_error():
            log(WARNING, "report: node %d failed: %s", node, reply.error.reason)
            continue
        metrics = reply.content.metric_records.get(p.METRICS)
        problem = f"no '{p.METRICS}' record" if metrics is None else p.check_metrics(
            metrics, fields
        )
        if problem is not None:
            log(WARNING, "report: rejected reply from node %d: %s", node, problem)
            continue
        assigned = getattr(strategy, "assignment_for", lambda _: None)(node)
        if assigned is None and "train-loss" not in metrics:
            log(WARNING, "report: rejected reply from node %d: no 'train-loss' to choose its "
                "cluster by", node)
            continue
        row = {key: metrics[key] for key in metrics}
        row["node-id"] = node
        row.update(placement_fields(reply))
        row["assigned"] = (
            int(assigned) if assigned is not None else int(np.argmin(row["train-loss"]))
        )
        rows.append(row)
    answered = {r.metadata.src_node_id for r in replies}
    return sorted(rows, key=lambda r: r.get("partition-id", r["node-id"])), answered


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


def placement_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Training tasks per Ray node and per device over every reporting client."""
    nodes: Counter[str] = Counter()
    devices: Counter[str] = Counter()
    for row in rows:
        for place, tasks in row["tasks_by_place"].items():
            node, device = place.split(PLACE_SEPARATOR, 1)
            nodes[node] += tasks
            devices[device] += tasks
    return {"ray_nodes": dict(sorted(nodes.items())), "devices": dict(sorted(devices.items()))}


def accuracy_by_round(result: Result) -> dict[int, float]:
    """Round -> personalized accuracy of the evaluated nodes (rounds that have one)."""
    return {
        r: float(m[p.M_ACCURACY]) for r, m in result.evaluate_metrics_clientapp.items()
        if p.M_ACCURACY in m
    }


def summarize(
    rows: list[dict[str, Any]], result: Result, strategy_name: str, settings: Mapping
) -> dict[str, Any]:
    """Turn the nodes' reports and the round history into ``summary.json``'s content."""
    accuracy = np.array([r["test-accuracy"] for r in rows], dtype=float)  # (N, k)
    num_test = np.array([r["num-test"] for r in rows], dtype=float)
    assigned = np.array([r["assigned"] for r in rows], dtype=int)
    truth = np.array([r.get("true-cluster", 0) for r in rows], dtype=int)
    n, k = accuracy.shape
    # A FedEM node's mixture of the cluster models; a node's own kept model when it
    # has one (local-only, FedSoft); otherwise the cluster model it uses (e.g. a
    # FedSoft node that was never drawn to train).
    personal = np.array(
        [
            r.get("mixture-accuracy", r.get("local-accuracy", accuracy[i, assigned[i]]))
            for i, r in enumerate(rows)
        ]
    )
    cluster_accuracy = []
    for j in range(k):
        members = assigned == j
        cluster_accuracy.append(
            float(np.average(accuracy[members, j], weights=num_test[members]))
            if members.any()
            else None
        )
    ari, nmi = recovery_scores(truth, assigned)
    intra, inter = intra_inter_accuracy(accuracy, truth, np.repeat(assigned[:, None], n, axis=1))
    history = accuracy_by_round(result)
    return {
        "strategy": strategy_name,
        "num_clients": n,
        "num_cluster_models": k,
        "num_clusters_found": len(np.unique(assigned)),
        "ari": ari,
        "nmi": nmi,
        "personalized_accuracy": float(np.average(personal, weights=num_test)),
        "per_client_accuracy": [float(a) for a in personal],
        "cluster_accuracy": cluster_accuracy,
        "intra_cluster_accuracy": intra,
        "inter_cluster_accuracy": inter,
        "rounds_to_target": rounds_to_target(history, settings["target-accuracy"]),
        "target_accuracy": settings["target-accuracy"],
        "num_rounds": settings["num-rounds"],
    }


def node_fields(
    start: list[int], final: list[int], seen: set[int], rows: list[dict[str, Any]],
    answered: set[int],
) -> dict[str, Any]:
    """Which nodes left, joined late, or sent no usable report (node ids).

    Parameters
    ----------
    start : list[int]
        Nodes connected when the run started.
    final : list[int]
        Nodes connected at the final report.
    seen : set[int]
        Every node the grid listed during the run.
    rows : list[dict[str, Any]]
        The usable reports (their ``node-id``).
    answered : set[int]
        Nodes that replied to the report at all (a usable report, an error, or a
        malformed one).
    """
    everyone = set(start) | set(seen) | set(final)
    reported = {int(r["node-id"]) for r in rows}
    late = sorted(everyone - set(start))
    # Gone from the grid, or still listed but silent at the report (a node that dies
    # stays listed until the SuperLink misses its heartbeats).
    lost = sorted((everyone - set(final)) | (set(final) - answered))
    for node in lost:
        log(WARNING, "node %d left during the run: its cluster kept its model; no report", node)
    for row in rows:
        row["late"] = int(row["node-id"]) in late
    return {
        "lost_nodes": lost,
        "late_nodes": late,
        "unreported_nodes": sorted((set(final) & answered) - reported),
    }


def strategy_fields(strategy: Strategy, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Strategy-specific ``summary.json`` entries and their scores against ground truth.

    The strategy reports what it decided (:meth:`ClusteredStrategy.summary_fields`);
    only here, after training, are those decisions compared with the ground truth
    the nodes reported.
    """
    fields = strategy.summary_fields() if isinstance(strategy, ClusteredStrategy) else {}
    # FedSoft's u and FedEM's pi are both a node's soft weight of each cluster model.
    soft = fields.get("importance_weights", fields.get("mixture_weights"))
    fields.update(soft_clustering_scores(rows, soft))
    fields.update(labelling_scores(rows, fields))
    if "cluster_labels" in fields:  # a density clustering (FLDC) with noise labels
        fields.update(density_clustering_scores(rows, fields["cluster_labels"]))
    if isinstance(strategy, ClusteredStrategy) and strategy.mcfl:
        features = strategy.mcfl_cluster_features(len(rows[0]["test-accuracy"]))
        if features is not None:
            fields.update(mcfl_scores(rows, features))
    return fields


def history_fields(strategy: Strategy, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-round cluster use and accuracy, in the clients' order of ``summary.json``.

    ``assignment_history[r][i]`` is the cluster client ``i`` used in round ``r + 1``
    (``None`` when it was not evaluated); ``cluster_accuracy_history[r][j]`` the
    accuracy of cluster ``j``'s users that round (``None`` when it had none). Empty
    for strategies that are not clustered (FedAvg, FedProx).
    """
    if not isinstance(strategy, ClusteredStrategy):
        return {}
    nodes = [row["node-id"] for row in rows]
    rounds = sorted(strategy.assignment_history)
    num_clusters = len(rows[0]["test-accuracy"])
    return {
        "assignment_history": [
            [strategy.assignment_history[r].get(node) for node in nodes] for r in rounds
        ],
        "cluster_accuracy_history": [
            [strategy.cluster_accuracy_history[r].get(j) for j in range(num_clusters)]
            for r in rounds
        ],
    }


def similarity_in_row_order(
    strategy: Strategy, rows: list[dict[str, Any]]
) -> np.ndarray | None:
    """The strategy's final client similarity reordered to the rows' clients, if it has one.

    Clients the strategy did not compare (e.g. never sampled) get NaN rows.
    """
    found = strategy.similarity_matrix() if isinstance(strategy, ClusteredStrategy) else None
    if found is None:
        return None
    node_ids, matrix = found
    position = {node: i for i, node in enumerate(node_ids)}
    index = np.array([position.get(row["node-id"], -1) for row in rows])
    full = np.asarray(matrix, dtype=float)[np.ix_(np.maximum(index, 0), np.maximum(index, 0))]
    full[index < 0, :] = np.nan
    full[:, index < 0] = np.nan
    return full


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """Standard JSON: an undefined metric (NaN, e.g. inter-cluster accuracy with one
    group) becomes ``null`` instead of the non-standard ``NaN`` token."""
    return json.dumps(_finite_or_none(value), indent=indent, allow_nan=False)


def write_results(
    folder: Path,
    settings: Mapping[str, Any],
    result: Result,
    grid: MeteredGrid,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    round_seconds: Mapping[int, float] | None = None,
) -> None:
    """Write run config, per-round metrics, assignments, models and summary.

    ``round_seconds`` (absolute round -> wall seconds) gives rounds.jsonl its
    ``seconds`` field; a round it lacks (run before a resume) gets ``null``.

    Raises
    ------
    RuntimeError
        If ``result`` holds no model: an empty models.npz would look like a
        finished run.
    """
    if len(result.arrays) == 0:
        raise RuntimeError(
            "the run produced no model (no valid client reply was aggregated); nothing is "
            "written. See the log for the clients' errors"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run_config.json").write_text(json.dumps(dict(settings), indent=2))
    with (folder / "rounds.jsonl").open("w") as out:
        for server_round in range(1, settings["num-rounds"] + 1):
            train = result.train_metrics_clientapp.get(server_round, {})
            evaluate = result.evaluate_metrics_clientapp.get(server_round, {})
            line = {
                "round": server_round,
                "train": {k: train[k] for k in train},
                "evaluate": {k: evaluate[k] for k in evaluate},
                "bytes_sent": grid.sent.get(server_round, 0),
                "bytes_received": grid.received.get(server_round, 0),
                "seconds": (round_seconds or {}).get(server_round),
            }
            out.write(strict_json(line) + "\n")
    with (folder / "assignments.csv").open("w") as out:
        out.write("partition_id,node_id,true_cluster,assigned_cluster,personal_accuracy,late,"
                  "ray_node,device\n")
        for row, acc in zip(rows, summary["per_client_accuracy"], strict=True):
            out.write(
                f"{row.get('partition-id', -1)},{row['node-id']},{row.get('true-cluster', -1)},"
                f"{row['assigned']},{acc:.6f},{int(row.get('late', False))},"
                f"{row.get('ray_node', '')},{row.get('device', '')}\n"
            )
    np.savez(
        folder / "models.npz", **{key: result.arrays[key].numpy() for key in result.arrays}
    )
    (folder / "summary.json").write_text(strict_json(summary, indent=2))


def print_summary(summary: dict[str, Any], folder: Path) -> None:
    """The closing table, then the results folder's path on the last line."""
    table = Table(title=f"fl-clusters: {summary['strategy']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for j, acc in enumerate(summary["cluster_accuracy"]):
        table.add_row(f"cluster {j} accuracy", "-" if acc is None else f"{acc:.4f}")
    table.add_row("personalized accuracy", f"{summary['personalized_accuracy']:.4f}")
    table.add_row("clusters found", str(summary["num_clusters_found"]))
    table.add_row("ARI / NMI", f"{summary['ari']:.3f} / {summary['nmi']:.3f}")
    table.add_row("MB sent / received",
                  f"{summary['bytes_sent'] / 1e6:.2f} / {summary['bytes_received'] / 1e6:.2f}")
    placement = summary.get("placement") or {}
    if placement.get("devices"):
        nodes = [node for node in placement["ray_nodes"] if node != NOWHERE]
        table.add_row("trained on", (f"{len(nodes)} Ray node(s), " if nodes else "") + ", ".join(
            f"{device} {tasks}" for device, tasks in placement["devices"].items()
        ) + " tasks")
    table.add_row("wall time (s)", f"{summary['wall_time_s']:.1f}")
    Console(file=sys.stdout, width=100).print(table)
    print(f"results: {folder.resolve()}", flush=True)


def report_round(
    progress: RoundProgress,
    strategy: Strategy,
    server_round: int,
    seconds: float,
    metrics: MetricRecord | None,
) -> None:
    """Print ``server_round``'s progress line from what the strategy recorded."""
    accuracy = None if metrics is None else metrics.get(p.M_ACCURACY)
    used = None
    num_clusters = 1
    if isinstance(strategy, ClusteredStrategy):
        used = strategy.assignment_history.get(server_round)
        num_clusters = len(set(used.values())) if used else len(set(
            strategy.assignments.values())) or 1
    progress.round_done(
        server_round, seconds, None if accuracy is None else float(accuracy),  # type: ignore[arg-type]
        used, num_clusters,
    )


def results_folder(settings: Mapping[str, Any]) -> Path:
    """A new results folder's path: time stamp, strategy, and a random suffix."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(settings["results-dir"]) / f"{stamp}-{settings['strategy']}-{uuid.uuid4().hex[:6]}"


def run_federation(grid: Grid, settings: Mapping[str, Any]) -> Path:
    """Run the configured strategy on ``grid`` and write its results folder.

    With ``resume-from`` it continues an interrupted run from its checkpoint
    (:mod:`fl_clusters.checkpoint`) and writes a new results folder.
    """
    start = time.time()
    # A bad resume-from fails before any wait for nodes.
    resumed = None
    if settings["resume-from"]:
        resumed = Checkpoint.load(settings["resume-from"], settings)
    metered = MeteredGrid(grid, settings["max-in-flight"] or None)
    nodes = wait_for_nodes(metered, settings["min-nodes"])
    # min-nodes is the floor a round needs, not the start-up count: rounds go
    # on with the nodes that are there when one leaves.
    full = {**settings, "min-available-nodes": settings["min-nodes"]}
    strategy = build_configured_strategy(full) if resumed is None else resumed.strategy
    identities = identify_nodes(metered, nodes, settings["round-timeout"])
    check_can_start(strategy, nodes, identities)
    log_identity_problems(identities.problems)
    keys = identities.keys
    if resumed is not None:
        # A resumed run maps the checkpoint's node ids to this run's by key.
        resumed.move_to(keys, metered)
    if isinstance(strategy, ClusteredStrategy):
        strategy.node_keys.update(keys)
        strategy.rejected_replies += len(identities.problems)
    else:
        # Flower's FedAvg/FedProx draw nodes with Python's random among the nodes the
        # grid lists, and sum replies in arrival order; simulated node ids are random
        # per run. Listing nodes and replies in handshake-key order and seeding random
        # makes the same seed repeat the run, without touching Flower's strategy.
        metered.node_order = lambda node: key_order(keys, node)
        if resumed is None:
            random.seed(settings["seed"])
        else:
            random.setstate(resumed.python_random)
    folder = results_folder(settings)
    # Time left comes from the rounds this process ran: a resumed run's earlier
    # rounds have no time here.
    progress = RoundProgress(settings["num-rounds"], identities.groups)
    rounds = CheckpointedRounds(
        strategy, settings, folder,
        node_keys=lambda: strategy.node_keys if isinstance(strategy, ClusteredStrategy) else keys,
        start_nodes=nodes if resumed is None else resumed.start_nodes,
        resumed=resumed,
        on_round_end=lambda server_round, seconds, metrics: report_round(
            progress, strategy, server_round, seconds, metrics
        ),
    )
    result = rounds.start(
        grid=metered,
        initial_arrays=initial_arrays(settings),
        num_rounds=settings["num-rounds"],
        train_config=train_config(settings),
        timeout=settings["round-timeout"],
    )
    # The report goes to the nodes connected now: one that left would only hold it
    # up to the timeout, one that joined mid-run is scored like the others.
    final_nodes = sorted(metered.get_node_ids())
    rows, answered = collect_report(metered, strategy, result.arrays, final_nodes, settings)
    if not rows:
        raise RuntimeError("no node answered the final report; see the log for their errors")
    summary = summarize(rows, result, settings["strategy"], settings)
    summary.update(strategy_fields(strategy, rows))
    summary.update(node_fields(rounds.start_nodes, final_nodes, metered.nodes_seen, rows,
                               answered))
    summary.update(history_fields(strategy, rows))
    summary["placement"] = placement_summary(rows)
    summary.update(
        wall_time_s=time.time() - start,
        bytes_sent=metered.bytes_sent,
        bytes_received=metered.bytes_received,
        rejected_replies=getattr(strategy, "rejected_replies", 0),
        unanswered_messages=metered.unanswered,
        resumed_after_round=None if resumed is None else resumed.server_round,
    )
    write_results(folder, settings, result, metered, rows, summary, rounds.round_seconds)
    if isinstance(strategy, ClusteredStrategy):
        strategy.write_artifacts(folder)
    if settings["plots"]:
        truth = [row.get("true-cluster", 0) for row in rows]
        write_run_plots(folder, summary, accuracy_by_round(result), truth,
                        similarity_in_row_order(strategy, rows),
                        data=f"{settings['dataset']}, {settings['cluster-structure']}")
    print_summary(summary, folder)
    return folder


def build_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """The ServerApp; ``overrides`` win over ``context.run_config`` (see the ClientApp's)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        report_configuration_errors_in_one_line()
        settings = parse_run_config({**context.run_config, **(overrides or {})})
        run_federation(grid, settings)

    return app


app = build_server_app()
