"""The fl-clusters ServerApp: wait for the nodes, run the strategy, report the results.

The server talks to every strategy through one interface
(:class:`~fl_clusters.strategies.kit.interface.ServerStrategy`): the clustered ones
and Flower's FedAvg/FedProx alike. The grid it runs on is :mod:`fl_clusters.grid`,
the rounds :mod:`fl_clusters.rounds`, the final report :mod:`fl_clusters.report`
and what is written and printed :mod:`fl_clusters.results`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from fl_clusters import protocol as p
from fl_clusters.attacks import NONE, deployment_refusal, simulation_grid
from fl_clusters.checkpoint import Checkpoint
from fl_clusters.client_errors import forget_shown
from fl_clusters.config import RecipeOutcome, resolve_run_config
from fl_clusters.data import DATASET_SHAPES
from fl_clusters.errors import ConfigurationError, report_configuration_errors_in_one_line
from fl_clusters.flower_log import log_client_errors_in_one_line
from fl_clusters.grid import MeteredGrid, local_cores
from fl_clusters.handshake import NodeIdentities, identify_federation
from fl_clusters.logical_grid import LogicalClientGrid, logical_identities
from fl_clusters.models import build_model, model_to_arrays
from fl_clusters.plots import write_run_plots
from fl_clusters.progress import RoundProgress
from fl_clusters.report import collect_report, report_sample
from fl_clusters.results import (
    accuracy_by_round,
    print_summary,
    run_summary,
    similarity_in_row_order,
    write_results,
)
from fl_clusters.rounds import CheckpointedRounds
from fl_clusters.strategies.kit.interface import ServerStrategy
from fl_clusters.strategy_builder import build_strategy

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
    strategy: ServerStrategy, nodes: list[int], identities: NodeIdentities
) -> None:
    """Stop before round 1 when the run cannot work, naming the problem and the fix.

    Raises
    ------
    ConfigurationError
        If every node says it cannot take part (its data set is missing...), one
        node gives a reason every node shares (its partition plan cannot be made),
        or the strategy cannot run on this many nodes.
    """
    problem = strategy.federation_problem(len(nodes))
    if problem is not None:
        raise ConfigurationError(problem)
    def name(node: int) -> str:
        partition = identities.partitions.get(node)
        return f"node {node}" if partition is None else f"partition {partition}"

    if identities.every_node or (nodes and len(identities.startup_problems) == len(nodes)):
        node = min(identities.every_node or identities.startup_problems)
        reason = identities.startup_problems[node]
        raise ConfigurationError(f"no node can take part; {name(node)} said: {reason}")
    for node, reason in sorted(identities.startup_problems.items()):
        log(WARNING, "%s cannot take part: %s", name(node), reason)


def build_configured_strategy(settings: Mapping[str, Any]) -> ServerStrategy:
    """The strategy the run config names; a value it refuses is a configuration error."""
    try:
        return build_strategy(settings)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(str(err)) from err


def train_config(settings: Mapping[str, Any]) -> ConfigRecord:
    """The per-round training config every strategy sends to the clients.

    ``optimizer`` travels only when it is not plain SGD, the protocol's default:
    a run that keeps SGD sends the same bytes as before the key existed.
    """
    config = ConfigRecord(
        {
            p.CFG_LR: settings["lr"],
            p.CFG_EPOCHS: settings["local-epochs"],
            p.CFG_STEPS: settings["local-steps"],
            p.CFG_BATCH: settings["batch-size"],
        }
    )
    if settings["optimizer"] != "sgd":
        config[p.CFG_OPTIMIZER] = settings["optimizer"]
    return config


def initial_arrays(settings: Mapping[str, Any]) -> ArrayRecord:
    """A freshly initialized model for the configured data set (seeded).

    Sized from :data:`~fl_clusters.data.DATASET_SHAPES`: the server never loads
    the data set itself.
    """
    input_shape, num_classes = DATASET_SHAPES[settings["dataset"]]
    model = build_model(settings["model"], input_shape, num_classes, seed=settings["seed"])
    return model_to_arrays(model)


def report_round(
    progress: RoundProgress,
    strategy: ServerStrategy,
    server_round: int,
    seconds: float,
    metrics: MetricRecord | None,
) -> None:
    """Print ``server_round``'s progress line from what the strategy recorded."""
    accuracy = None if metrics is None else metrics.get(p.M_ACCURACY)
    used, num_clusters = strategy.round_clusters(server_round)
    progress.round_done(
        server_round, seconds, None if accuracy is None else float(accuracy),  # type: ignore[arg-type]
        used, num_clusters,
    )


def results_folder(settings: Mapping[str, Any]) -> Path:
    """A new results folder's path: time stamp, strategy, and a random suffix."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(settings["results-dir"]) / f"{stamp}-{settings['strategy']}-{uuid.uuid4().hex[:6]}"


def create_results_folder(settings: Mapping[str, Any]) -> Path:
    """Create the run's results folder and check that it takes files, before any round.

    Everything a run writes (checkpoints, results, plots, a strategy's own files)
    goes there; a folder found unwritable only when the first of them is written
    would cost every round run until then.

    Raises
    ------
    ConfigurationError
        If the folder cannot be created or written, naming it and the fix.
    """
    folder = results_folder(settings)
    probe = folder / ".write-check"
    try:
        folder.mkdir(parents=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigurationError(
            f"results-dir: cannot write the results folder {folder} ({err.strerror or err}); "
            "set the run-config key results-dir to a folder you can write"
        ) from err
    return folder


def load_checkpoint(settings: Mapping[str, Any]) -> Checkpoint:
    """The checkpoint ``resume-from`` names; one that cannot be resumed is a configuration error.

    Its message already names the file and what to change, so it ends the run in
    one line like any other configuration error.
    """
    try:
        return Checkpoint.load(settings["resume-from"], settings)
    except (ValueError, OSError) as err:
        message = str(err) if isinstance(err, ValueError) else f"resume-from: {err}"
        raise ConfigurationError(message) from err


def start_up(
    grid: MeteredGrid, settings: Mapping[str, Any], resumed: Checkpoint | None,
    pool: Grid | None = None,
) -> tuple[ServerStrategy, list[int], NodeIdentities]:
    """Wait for the nodes, build (or resume) the strategy and run the handshake.

    With ``pool`` (Flower's grid under a :class:`LogicalClientGrid`) the nodes
    waited for are the pool's, and the clients are known by their ids
    (:func:`~fl_clusters.logical_grid.logical_identities`): one client is asked.

    Returns
    -------
    tuple[ServerStrategy, list[int], NodeIdentities]
        The strategy, knowing every node's key; the nodes connected at the start;
        what the handshake found.

    Raises
    ------
    ConfigurationError
        If the run cannot start (:func:`check_can_start`).
    """
    started = time.monotonic()
    if pool is None:
        nodes = wait_for_nodes(grid, settings["min-nodes"])
    else:
        pool_nodes = wait_for_nodes(pool, 1)
        nodes = list(grid.get_node_ids())
        log(INFO, "start-up: %d logical clients on a pool of %d nodes", len(nodes),
            len(pool_nodes))
    # Start-up's phases in the log, so that a large federation shows where its wait goes.
    log(INFO, "start-up: %d nodes connected after %.1f s", len(nodes), time.monotonic() - started)
    # min-nodes is also the floor each round needs (the strategies' min_available_nodes):
    # rounds go on with the nodes that are there when one leaves.
    strategy = build_configured_strategy(settings) if resumed is None else resumed.strategy
    asked = time.monotonic()
    identities = (identify_federation(grid, nodes, settings["round-timeout"]) if pool is None
                  else logical_identities(grid, len(nodes), settings["round-timeout"]))
    log(INFO, "start-up: handshake with %d nodes took %.1f s", len(nodes),
        time.monotonic() - asked)
    check_can_start(strategy, nodes, identities)
    if resumed is not None:
        # The checkpoint's node ids become this run's, found by key.
        resumed.move_to(identities.keys, grid)
    strategy.adopt_identities(identities)
    return strategy, nodes, identities


def run_rounds(
    grid: MeteredGrid,
    strategy: ServerStrategy,
    settings: Mapping[str, Any],
    folder: Path,
    start_nodes: list[int],
    progress: RoundProgress,
    resumed: Checkpoint | None,
) -> tuple[CheckpointedRounds, Result]:
    """Run the rounds (from the checkpoint's, if resumed), printing a line per round."""
    rounds = CheckpointedRounds(
        strategy, settings, folder,
        start_nodes=start_nodes if resumed is None else resumed.start_nodes,
        resumed=resumed,
        on_round_end=lambda server_round, seconds, metrics: report_round(
            progress, strategy, server_round, seconds, metrics
        ),
    )
    result = rounds.start(
        grid=grid,
        initial_arrays=initial_arrays(settings),
        num_rounds=settings["num-rounds"],
        train_config=train_config(settings),
        timeout=settings["round-timeout"],
    )
    return rounds, result


def run_federation(
    grid: Grid, settings: Mapping[str, Any], recipe: RecipeOutcome | None = None
) -> Path:
    """Run the configured strategy on ``grid`` and write its results folder.

    With ``resume-from`` it continues an interrupted run from its checkpoint
    (:mod:`fl_clusters.checkpoint`) and writes a new results folder. ``recipe``:
    what the paper preset did to the training recipe in ``settings``
    (:func:`~fl_clusters.config.resolve_run_config`), recorded in summary.json.
    """
    start = time.time()
    if settings["attack"] != NONE and not simulation_grid(grid):
        # The nodes refuse too (fl_clusters.attacks.node_role); this says it before
        # anything is written.
        raise ConfigurationError(deployment_refusal(settings["attack"], "ServerApp"))
    if settings["num-clients"] and not simulation_grid(grid):
        raise ConfigurationError(
            "run-config key 'num-clients' (logical clients served by a pool) is for "
            "simulations only: a deployed SuperNode is one device; set num-clients=0")
    # A bad resume-from or results-dir fails before any wait for nodes.
    resumed = load_checkpoint(settings) if settings["resume-from"] else None
    folder = create_results_folder(settings)
    try:
        return _run_into(folder, grid, settings, resumed, start, recipe)
    except BaseException:
        # A failed run leaves no results folder, unless it holds a checkpoint to resume.
        with contextlib.suppress(OSError):
            folder.rmdir()
        raise


def _run_into(
    folder: Path, grid: Grid, settings: Mapping[str, Any], resumed: Checkpoint | None,
    start: float, recipe: RecipeOutcome | None,
) -> Path:
    """:func:`run_federation` once its results folder exists."""
    logical = settings["num-clients"] > 0
    pool = grid
    if logical:
        grid = LogicalClientGrid(
            grid, settings["num-clients"],
            state_memory_bytes=int(settings["client-state-memory-mb"] * 2**20),
            workers=local_cores())
    metered = MeteredGrid(grid, settings["max-in-flight"] or None)
    strategy, nodes, identities = start_up(metered, settings, resumed,
                                           pool if logical else None)
    # Time left comes from the rounds this process ran: a resumed run's earlier
    # rounds have no time here.
    progress = RoundProgress(settings["num-rounds"], identities.groups)
    rounds, result = run_rounds(metered, strategy, settings, folder, nodes, progress, resumed)
    # The report goes to the nodes connected now: one that left would only hold it
    # up to the timeout, one that joined mid-run is scored like the others.
    final_nodes = sorted(metered.get_node_ids())
    asked = report_sample(strategy, final_nodes, settings)
    rows, answered = collect_report(metered, strategy, result.arrays, asked, settings)
    if not rows:
        raise RuntimeError("no node answered the final report; see the log for their errors")
    summary = run_summary(
        rows, result, strategy, settings, metered,
        (rounds.start_nodes, final_nodes, asked, answered),
        wall_time_s=time.time() - start,
        resumed_after_round=None if resumed is None else resumed.server_round,
    )
    if recipe is not None:
        summary.update(recipe.fields())
    write_results(folder, settings, result, metered, rows, summary, rounds.round_seconds)
    strategy.write_artifacts(folder)
    if settings["plots"]:
        truth = [row.get("true-cluster", 0) for row in rows]
        write_run_plots(folder, summary, accuracy_by_round(result), truth,
                        similarity_in_row_order(strategy, rows),
                        data=f"{settings['dataset']}, {settings['cluster-structure']}")
    print_summary(summary, folder)
    return folder


def build_server_app(
    overrides: Mapping[str, Any] | None = None,
    prepare_grid: Callable[[Grid], None] | None = None,
) -> ServerApp:
    """The ServerApp.

    Parameters
    ----------
    overrides : Mapping[str, Any] | None
        Run-config keys that win over ``context.run_config`` (see the ClientApp's).
    prepare_grid : Callable[[Grid], None] | None
        Called with Flower's grid once the run config is parsed, before the
        federation starts (a sweep puts its time limit on the grid there).
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        report_configuration_errors_in_one_line()
        log_client_errors_in_one_line()
        forget_shown()
        settings, recipe = resolve_run_config({**context.run_config, **(overrides or {})})
        if prepare_grid is not None:
            prepare_grid(grid)
        run_federation(grid, settings, recipe)

    return app


app = build_server_app()
