"""Flower's round loop from any round, writing a checkpoint every few rounds.

:class:`CheckpointedRounds` runs the strategy's rounds through Flower's own
``Strategy.start``, numbers them as the run does (a resumed run continues after
its checkpoint's round), and writes a :class:`~fl_clusters.checkpoint.Checkpoint`
with what each client keeps between rounds, stored by stable key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fl_clusters import protocol as p
from fl_clusters.checkpoint import CHECKPOINT_FILE, Checkpoint
from fl_clusters.client_errors import describe_error
from fl_clusters.grid import MeteredGrid
from fl_clusters.strategies.kit.evaluation import per_cluster_evaluate
from fl_clusters.strategies.kit.interface import ServerStrategy


class CheckpointedRounds(Strategy):
    """Flower's round loop around ``strategy``, with checkpoints, from any round.

    Flower's ``Strategy.start`` numbers rounds from 1; this wrapper hands the
    strategy the run's absolute round numbers (a resumed run continues at the
    checkpoint's round + 1), records the history across the interruption, and
    every ``every`` rounds writes a :class:`Checkpoint` to ``folder``.

    Parameters
    ----------
    strategy : ServerStrategy
        The strategy the run config built.
    settings : Mapping[str, Any]
        The run's validated run config (stored in the checkpoint).
    folder : Path
        The results folder that receives ``checkpoint.zip``.
    start_nodes : list[int]
        Nodes connected when the run first started.
    resumed : Checkpoint | None
        The checkpoint this run continues from, already moved to this run's
        node ids (:meth:`Checkpoint.move_to`).
    on_round_end : Callable[[int, float, MetricRecord | None], None] | None
        Called after every round with its absolute number, its seconds and its
        evaluation metrics (the ServerApp's progress line).
    """

    def __init__(
        self,
        strategy: ServerStrategy,
        settings: Mapping[str, Any],
        folder: Path,
        start_nodes: list[int],
        resumed: Checkpoint | None = None,
        on_round_end: Callable[[int, float, MetricRecord | None], None] | None = None,
    ) -> None:
        self.strategy = strategy
        self.on_round_end = on_round_end
        self.settings = dict(settings)
        self.folder = folder
        self.every = int(settings["checkpoint-every"])
        self.start_nodes = list(start_nodes)
        self.resumed = resumed
        self.offset = 0 if resumed is None else resumed.server_round
        self.arrays = ArrayRecord() if resumed is None else resumed.arrays
        self.train_metrics = {} if resumed is None else dict(resumed.train_metrics)
        self.evaluate_metrics = {} if resumed is None else dict(resumed.evaluate_metrics)
        self.timeout = float(settings["round-timeout"])
        self._grid: MeteredGrid | None = None
        # Absolute round -> seconds from its configure_train to the end of its
        # aggregate_evaluate, for the rounds this process ran (not kept in checkpoints).
        self.round_seconds: dict[int, float] = {}
        self._round_started = 0.0

    def summary(self) -> None:
        """Log the wrapped strategy's summary, and where checkpoints go."""
        self.strategy.summary()
        if self.every:
            log(INFO, "\t├── Checkpoint every %d rounds to %s", self.every,
                self.folder / CHECKPOINT_FILE)
        if self.resumed is not None:
            log(INFO, "\t└── Resumed after round %d", self.resumed.server_round)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, at the absolute round."""
        if self.offset:
            # Flower's loop counts the resumed rounds from 1; say which round it is.
            log(INFO, "(resumed run: round %d of the run)", server_round + self.offset)
        self._round_started = time.monotonic()
        return self.strategy.configure_train(server_round + self.offset, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy's, at the absolute round; remembers what it returns."""
        arrays, metrics = self.strategy.aggregate_train(server_round + self.offset, replies)
        if arrays is not None:
            self.arrays = arrays
        if metrics is not None:
            self.train_metrics[server_round + self.offset] = metrics
        return arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The wrapped strategy's, at the absolute round."""
        return self.strategy.configure_evaluate(server_round + self.offset, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's, at the absolute round; then a checkpoint when due.

        Flower calls it once at the end of every round (with no replies when the
        round evaluated no one), so the checkpoint holds the whole round.
        """
        absolute = server_round + self.offset
        metrics = self.strategy.aggregate_evaluate(absolute, replies)
        if metrics is not None:
            self.evaluate_metrics[absolute] = metrics
        self.round_seconds[absolute] = time.monotonic() - self._round_started
        if self.every and absolute % self.every == 0:
            self.write_checkpoint(absolute)
        if self.on_round_end is not None:
            self.on_round_end(absolute, self.round_seconds[absolute], metrics)
        return metrics

    def start(  # type: ignore[override]
        self,
        grid: MeteredGrid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run rounds up to ``num_rounds`` (absolute), continuing a checkpoint if given.

        Parameters are those of Flower's ``Strategy.start``; ``num_rounds`` counts
        the rounds before the checkpoint too. The last round evaluates its sample
        like the others: the final report (:mod:`fl_clusters.report`) scores every
        node once more anyway. ``evaluate_fn`` gets absolute rounds.
        """
        self._grid = grid
        self.timeout = timeout
        self.strategy.prepare(grid, timeout, num_rounds)
        # A strategy in the user's own ServerApp evaluates every node in its last
        # round, for lack of a report; here that would message every node twice.
        self.strategy.final_round = None
        arrays = initial_arrays
        if self.resumed is not None:
            arrays = self.resumed.arrays
            self._restore_client_states(grid, self.resumed.client_states)
        else:
            self.arrays = initial_arrays
        offset_fn = None
        if evaluate_fn is not None:
            # Once per cluster model; a plain model passes through unchanged.
            inner = per_cluster_evaluate(evaluate_fn)

            def offset_fn(server_round: int, record: ArrayRecord) -> MetricRecord | None:
                return inner(server_round + self.offset, record)

        result = super().start(
            grid, arrays, num_rounds=num_rounds - self.offset, timeout=timeout,
            train_config=train_config, evaluate_config=evaluate_config, evaluate_fn=offset_fn,
        )
        return Result(
            arrays=self.arrays,
            train_metrics_clientapp=dict(sorted(self.train_metrics.items())),
            evaluate_metrics_clientapp=dict(sorted(self.evaluate_metrics.items())),
            evaluate_metrics_serverapp={
                r + self.offset: m for r, m in result.evaluate_metrics_serverapp.items()
            },
        )

    def write_checkpoint(self, server_round: int) -> Path:
        """Collect the clients' kept state and write the checkpoint of ``server_round``."""
        grid = self._grid
        assert grid is not None, "write_checkpoint runs inside start()"
        path = Checkpoint(
            server_round=server_round,
            settings=self.settings,
            strategy=self.strategy,
            arrays=self.arrays,
            train_metrics=self.train_metrics,
            evaluate_metrics=self.evaluate_metrics,
            client_states=self._client_states(grid),
            start_nodes=self.start_nodes,
            nodes_seen=set(grid.nodes_seen),
            sent=dict(grid.sent),
            received=dict(grid.received),
            unanswered=grid.unanswered,
        ).write(self.folder)
        log(INFO, "checkpoint: round %d written to %s", server_round, path)
        return path

    def _client_states(self, grid: Grid) -> dict[int, RecordDict]:
        """Ask every connected node for what it keeps between rounds, by stable key."""
        keys = self.strategy.nodes.keys
        nodes = sorted(grid.get_node_ids())
        queries = [
            Message(content=RecordDict(), dst_node_id=node, message_type=p.QUERY_STATE)
            for node in nodes
        ]
        replies = list(grid.send_and_receive(queries, timeout=self.timeout))
        states: dict[int, RecordDict] = {}
        for node in sorted(set(nodes) - {r.metadata.src_node_id for r in replies}):
            log(WARNING, "checkpoint: node %d did not send its kept state in time; resumed, "
                "it starts without it", node)
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                source = self.strategy.nodes.describe(node)
                log(WARNING, "checkpoint: %s did not send its kept state (%s); resumed, it "
                    "starts without it", source, describe_error(reply.error.reason, source))
            elif keys.get(node) is None:
                log(WARNING, "checkpoint: node %d has no stable key; its kept state cannot be "
                    "given back to it after a resume", node)
            elif len(reply.content) > 0:
                states[int(keys[node])] = reply.content  # type: ignore[arg-type]
        return states

    def _restore_client_states(self, grid: Grid, states: Mapping[int, RecordDict]) -> None:
        """Give each connected node the state it kept at the checkpoint."""
        keys = self.strategy.nodes.keys
        queries = [
            Message(content=states[keys[node]], dst_node_id=node,  # type: ignore[index]
                    message_type=p.QUERY_RESTORE)
            for node in sorted(grid.get_node_ids()) if keys.get(node) in states
        ]
        if not queries:
            return
        replies = list(grid.send_and_receive(queries, timeout=self.timeout))
        restored = {r.metadata.src_node_id for r in replies if not r.has_error()}
        for query in queries:
            if query.metadata.dst_node_id not in restored:
                log(WARNING, "resume: node %d did not take back its kept state; it goes on "
                    "without it", query.metadata.dst_node_id)
        log(INFO, "resume: %d of %d nodes took back their kept state", len(restored),
            len(queries))
