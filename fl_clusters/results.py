"""A run's results: its summary, the results folder's files, and the closing table.

``models.npz`` holds every cluster model as plain numpy arrays (no pickles). It is
written atomically and its SHA-256 goes into ``summary.json`` as
``models_sha256``; :func:`load_models` reads it back only if it matches.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from rich.console import Console
from rich.table import Table

from fl_clusters import protocol as p
from fl_clusters.attack_scores import attack_fields
from fl_clusters.config import parse_run_config
from fl_clusters.files import atomic_output, sha256_of, strict_json
from fl_clusters.grid import MeteredGrid
from fl_clusters.metrics import (
    density_clustering_scores,
    intra_inter_accuracy,
    labelling_scores,
    mcfl_scores,
    recovery_scores,
    rounds_to_target,
    soft_clustering_scores,
)
from fl_clusters.placement import NOWHERE
from fl_clusters.placement import SEPARATOR as PLACE_SEPARATOR
from fl_clusters.placement_regret import placement_fields, table_rows
from fl_clusters.report import collect_report
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.interface import ClusterFeatureSource as FeatureSource
from fl_clusters.strategies.kit.interface import ServerStrategy, SimilaritySource

MODELS_FILE = "models.npz"
SUMMARY_FILE = "summary.json"


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
    cluster_accuracy = [
        float(np.average(accuracy[assigned == j, j], weights=num_test[assigned == j]))
        if (assigned == j).any() else None
        for j in range(k)
    ]
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
    answered: set[int], asked: list[int] | None = None,
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
    asked : list[int] | None
        The nodes the report asked (``report-clients`` of them); ``None``: ``final``.
    """
    asked = final if asked is None else asked
    everyone = set(start) | set(seen) | set(final)
    reported = {int(r["node-id"]) for r in rows}
    late = sorted(everyone - set(start))
    # Gone from the grid, or still listed but silent at the report (a node that dies
    # stays listed until the SuperLink misses its heartbeats).
    lost = sorted((everyone - set(final)) | (set(asked) - answered))
    for node in lost:
        log(WARNING, "node %d left during the run: its cluster kept its model; no report", node)
    for row in rows:
        row["late"] = int(row["node-id"]) in late
    return {
        "lost_nodes": lost,
        "late_nodes": late,
        "unreported_nodes": sorted((set(asked) & answered) - reported),
        # The report's sample: the scores of this summary are over its clients.
        "report_asked": len(asked),
        "report_of": len(final),
    }


def strategy_fields(strategy: ServerStrategy, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Strategy-specific ``summary.json`` entries and their scores against ground truth.

    The strategy reports what it decided (:meth:`ServerStrategy.summary_fields`);
    only here, after training, are those decisions compared with the ground truth
    the nodes reported.
    """
    fields = {**strategy.preset_fields(), **strategy.summary_fields()}
    scoring = strategy.scoring()
    fields.update(soft_clustering_scores(rows, scoring.soft_weights))
    fields.update(labelling_scores(rows, scoring.labellings))
    if scoring.density_labels is not None:
        fields.update(density_clustering_scores(rows, scoring.density_labels))
    if isinstance(strategy, FeatureSource) and (features := strategy.mcfl_cluster_features(
            len(rows[0]["test-accuracy"]))) is not None:
        fields.update(mcfl_scores(rows, features))
    return fields


def history_fields(strategy: ServerStrategy, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-round cluster use and accuracy, in the clients' order of ``summary.json``.

    ``assignment_history[r][i]`` is the cluster client ``i`` used in round ``r + 1``
    (``None`` when it was not evaluated); ``cluster_accuracy_history[r][j]`` the
    accuracy of cluster ``j``'s users that round (``None`` when it had none). Empty
    for strategies that keep no clusters (FedAvg, FedProx).
    """
    history = strategy.round_history()
    if history is None:
        return {}
    used, accuracy = history
    nodes = [row["node-id"] for row in rows]
    num_clusters = len(rows[0]["test-accuracy"])
    return {
        "assignment_history": [[used[r].get(node) for node in nodes] for r in sorted(used)],
        "cluster_accuracy_history": [
            [accuracy[r].get(j) for j in range(num_clusters)] for r in sorted(used)
        ],
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


def run_summary(
    rows: list[dict[str, Any]],
    result: Result,
    strategy: ServerStrategy,
    settings: Mapping[str, Any],
    grid: MeteredGrid,
    nodes: tuple[list[int], list[int], set[int]],
    *,
    wall_time_s: float,
    resumed_after_round: int | None,
) -> dict[str, Any]:
    """Everything ``summary.json`` holds.

    Parameters
    ----------
    rows : list[dict[str, Any]]
        The usable final reports (:func:`fl_clusters.report.collect_report`).
    result : Result
        The round loop's result.
    strategy : ServerStrategy
        The strategy that ran.
    settings : Mapping[str, Any]
        The run's validated run config.
    grid : MeteredGrid
        The run's grid: its traffic and the nodes it listed.
    nodes : tuple[list[int], list[int], list[int], set[int]]
        The nodes connected at the start and at the report, those the report
        asked, and those that answered it (see :func:`node_fields`).
    wall_time_s : float
        Seconds the run took so far.
    resumed_after_round : int | None
        The round of the checkpoint the run resumed from, if any.
    """
    start_nodes, final_nodes, asked, answered = nodes
    summary = summarize(rows, result, settings["strategy"], settings)
    summary.update(strategy_fields(strategy, rows))
    summary.update(node_fields(start_nodes, final_nodes, grid.nodes_seen, rows, answered, asked))
    summary.update(history_fields(strategy, rows))
    summary.update(placement_fields(rows, summary["per_client_accuracy"], strategy.round_history()))
    summary["placement"] = placement_summary(rows)
    summary.update(attack_fields(settings, rows, summary["per_client_accuracy"]))
    summary.update(
        wall_time_s=wall_time_s,
        bytes_sent=grid.bytes_sent,
        bytes_received=grid.bytes_received,
        rejected_replies=strategy.rejected_replies,
        unanswered_messages=grid.unanswered,
        resumed_after_round=resumed_after_round,
    )
    return summary


def similarity_in_row_order(
    strategy: ServerStrategy, rows: list[dict[str, Any]]
) -> np.ndarray | None:
    """The strategy's final client similarity reordered to the rows' clients, if it has one.

    Clients the strategy did not compare (e.g. never sampled) get NaN rows.
    """
    found = strategy.similarity_matrix() if isinstance(strategy, SimilaritySource) else None
    if found is None:
        return None
    node_ids, matrix = found
    position = {node: i for i, node in enumerate(node_ids)}
    index = np.array([position.get(row["node-id"], -1) for row in rows])
    full = np.asarray(matrix, dtype=float)[np.ix_(np.maximum(index, 0), np.maximum(index, 0))]
    full[index < 0, :] = np.nan
    full[:, index < 0] = np.nan
    return full


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

    The summary gets ``models_sha256``, the SHA-256 of ``models.npz``.
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
    models = folder / MODELS_FILE
    with atomic_output(models) as out:
        np.savez(out, allow_pickle=False,
                 **{key: result.arrays[key].numpy() for key in result.arrays})
    summary = {**summary, "models_sha256": sha256_of(models)}
    (folder / SUMMARY_FILE).write_text(strict_json(summary, indent=2))


def write_plugin_results(
    folder: str | Path, grid: Grid, strategy: object, result: Result, num_rounds: int,
    *, target_accuracy: float = 0.8,
) -> dict[str, Any]:
    """Write, from an app's own ServerApp, the results folder fl-clusters' ServerApp writes.

    Call it after ``strategy.start`` returns, with the same grid: every node
    scores every cluster model on its test loader (the ``query.report`` that
    ``ClusteredClient`` answers), and ``folder`` receives ``assignments.csv``,
    ``summary.json``, ``rounds.jsonl``, ``models.npz`` and ``run_config.json``
    (docs/results.md). Bytes count the whole run only when ``strategy.start``
    was given the grid wrapped in :class:`~fl_clusters.grid.MeteredGrid`
    (otherwise the report's alone); the wall time is not measured (``null``).

    Parameters
    ----------
    folder : str | Path
        The results folder; created if missing.
    grid : Grid
        The run's grid.
    strategy : ClusteredStrategy
        The fl-clusters strategy that ran.
    result : Result
        What ``strategy.start`` returned.
    num_rounds : int
        The run's rounds, as given to ``strategy.start``.
    target_accuracy : float (default: 0.8)
        Personalized accuracy that ``rounds_to_target`` counts rounds to.

    Returns
    -------
    dict[str, Any]
        What ``summary.json`` holds.
    """
    if not isinstance(strategy, ClusteredStrategy):
        raise TypeError(
            f"write_plugin_results needs an fl-clusters strategy (fl_clusters.strategies); "
            f"got {type(strategy).__name__}, which keeps no clusters to report"
        )
    settings = {
        "strategy": strategy.name,
        "num-rounds": num_rounds,
        "target-accuracy": target_accuracy,
        "round-timeout": strategy.round_timeout,
        "mcfl-feature-samples": parse_run_config({})["mcfl-feature-samples"],
    }
    metered = grid if isinstance(grid, MeteredGrid) else MeteredGrid(grid)
    nodes = sorted(metered.get_node_ids())
    rows, answered = collect_report(metered, strategy, result.arrays, nodes, settings)
    if not rows:
        raise RuntimeError("no node answered the final report; see the log for their errors")
    summary = run_summary(rows, result, strategy, settings, metered,
                          (nodes, nodes, nodes, answered),
                          wall_time_s=float("nan"), resumed_after_round=None)
    write_results(Path(folder), settings, result, metered, rows, summary)
    strategy.write_artifacts(Path(folder))
    return summary


def load_models(folder: Path) -> dict[str, np.ndarray]:
    """The models of the results folder ``folder``, checked against its summary's SHA-256.

    Parameters
    ----------
    folder : Path
        A results folder (it holds ``models.npz`` and ``summary.json``).

    Raises
    ------
    ValueError
        If a file is missing, ``summary.json`` records no ``models_sha256``,
        ``models.npz`` does not match it, or it holds an array only a pickle reads.
    """
    models, summary_file = folder / MODELS_FILE, folder / SUMMARY_FILE
    for path in (models, summary_file):
        if not path.is_file():
            raise ValueError(f"{path} does not exist; pass a results folder of a finished run")
    try:
        expected = json.loads(summary_file.read_text()).get("models_sha256")
    except (ValueError, AttributeError) as error:
        raise ValueError(f"{summary_file} is not a readable summary ({error})") from None
    if expected is None:
        raise ValueError(f"{summary_file} records no models_sha256 (a results folder of an "
                         f"earlier fl-clusters), so {models} cannot be checked")
    if sha256_of(models) != expected:
        raise ValueError(f"{models} is damaged: checksum mismatch with the models_sha256 "
                         f"that {summary_file} records")
    try:
        with np.load(models, allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}
    except ValueError as error:  # an object array: it would need a pickle
        raise ValueError(f"{models} is not plain arrays ({error}); it is not loaded") from None


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
    for name, value in table_rows(summary):
        table.add_row(name, value)
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
