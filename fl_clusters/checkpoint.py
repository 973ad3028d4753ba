"""Checkpoint a federation every few rounds and resume it where it stopped.

A checkpoint holds everything the next round depends on: the strategy object
(cluster models, assignments, CFL's split tree, FedSoft's importance weights,
FLDC's strata, its random generator), the model record Flower's round loop
passes on, the metric history, the traffic counters, Python's ``random`` state
(Flower's FedAvg samples with it), and what each client keeps between rounds
(its ``context.state``: FedSoft's and local-only's own model, FedEM's mixture
weights). Clients seed their training from (round, node key), so the rounds
after a resume repeat the uninterrupted run's rounds exactly.

A resumed run is a new Flower run, and node ids are not stable across runs
(simulated ids are random per run). Every node id in the checkpoint is mapped to
the node that now answers the handshake with the same stable key
(:func:`~fl_clusters.strategies.base.ask_node_keys`).

The checkpoint is a pickle: resume only from folders you wrote yourself.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fl_clusters import protocol as p
from fl_clusters.metrics import MeteredGrid
from fl_clusters.strategies.base import ClusteredStrategy, per_cluster_evaluate

CHECKPOINT_FILE = "checkpoint.pkl"
CHECKPOINT_VERSION = 1
# Settings a resumed run may change: where results go, how long the run lasts and
# how patient it is; none changes what a round computes from the state.
RESUMABLE_CHANGES = frozenset({
    "num-rounds", "checkpoint-every", "resume-from", "results-dir", "round-timeout",
    "plots", "min-nodes", "target-accuracy", "device", "torch-threads",
})


def remap_node_ids(value: Any, mapping: Mapping[int, int]) -> Any:
    """``value`` with every node id in ``mapping`` replaced by its new id.

    Walks dicts (keys and values), lists, tuples, sets, integer arrays, dataclasses
    and fl-clusters' own objects; other objects (models, random generators) are
    returned as they are. Flower node ids are random 64-bit integers, so no
    cluster index, count or label equals one.

    Parameters
    ----------
    value : Any
        A strategy's attribute, or any structure of them.
    mapping : Mapping[int, int]
        Old node id -> new node id.
    """
    if isinstance(value, bool) or not mapping:
        return value
    if isinstance(value, int):
        return mapping.get(value, value)
    if isinstance(value, dict):
        return {remap_node_ids(k, mapping): remap_node_ids(v, mapping) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(remap_node_ids(item, mapping) for item in value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuO":
        items = value.ravel().tolist()
        if not any(isinstance(v, int) and v in mapping for v in items):
            return value
        moved = [mapping.get(v, v) if isinstance(v, int) else v for v in items]
        try:
            return np.array(moved, dtype=value.dtype).reshape(value.shape)
        except OverflowError:  # a new uint64 id does not fit an int64 array
            return np.array(moved, dtype=object).reshape(value.shape)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{
            f.name: remap_node_ids(getattr(value, f.name), mapping)
            for f in dataclasses.fields(value) if f.init
        })
    if type(value).__module__.startswith("fl_clusters") and hasattr(value, "__dict__"):
        value.__dict__.update(remap_node_ids(dict(value.__dict__), mapping))
    return value


@dataclass
class Checkpoint:
    """A federation's whole state at the end of round ``server_round``.

    Parameters
    ----------
    server_round : int
        The last round the checkpoint includes.
    settings : dict[str, Any]
        The run's validated run config.
    strategy : Strategy
        The strategy object, with everything it decided so far.
    arrays : ArrayRecord
        The model record Flower's round loop passes to the next round.
    train_metrics, evaluate_metrics : dict[int, MetricRecord]
        The aggregated metrics of every round so far.
    node_keys : dict[int, int | None]
        Node id -> stable key, at checkpoint time.
    client_states : dict[int, RecordDict]
        Stable key -> the records that node keeps between rounds.
    start_nodes : list[int]
        Nodes connected when the run first started (to tell late nodes apart).
    nodes_seen : set[int]
        Every node the grid listed so far.
    sent, received : dict[int, int]
        Bytes sent and received per round so far.
    unanswered : int
        Messages without a reply so far.
    python_random : Any
        ``random.getstate()``: Flower's FedAvg samples nodes with it.
    version : int
        Format version; a checkpoint of another version is refused.
    """

    server_round: int
    settings: dict[str, Any]
    strategy: Strategy
    arrays: ArrayRecord
    train_metrics: dict[int, MetricRecord]
    evaluate_metrics: dict[int, MetricRecord]
    node_keys: dict[int, int | None]
    client_states: dict[int, RecordDict]
    start_nodes: list[int]
    nodes_seen: set[int]
    sent: dict[int, int]
    received: dict[int, int]
    unanswered: int
    python_random: Any = field(default_factory=random.getstate)
    version: int = CHECKPOINT_VERSION

    def write(self, folder: Path) -> Path:
        """Write to ``folder/checkpoint.pkl``, replacing the previous one atomically.

        A run killed while writing leaves the previous checkpoint intact.
        """
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CHECKPOINT_FILE
        partial = path.with_suffix(".pkl.partial")
        with partial.open("wb") as out:
            pickle.dump(self, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)
        return path

    @classmethod
    def load(cls, location: str | Path, settings: Mapping[str, Any]) -> Checkpoint:
        """Read the checkpoint at ``location`` and check it fits ``settings``.

        Parameters
        ----------
        location : str | Path
            A results folder holding ``checkpoint.pkl``, or the file itself.
        settings : Mapping[str, Any]
            The resumed run's validated run config.

        Raises
        ------
        ValueError
            If there is no readable checkpoint, it has another format version, its
            run config differs in a key that changes what a round computes, or it
            is past the run's ``num-rounds``.
        """
        path = Path(location)
        path = path / CHECKPOINT_FILE if path.is_dir() else path
        if not path.is_file():
            raise ValueError(
                f"resume-from: no checkpoint at {path}; pass the results folder of a run "
                f"started with checkpoint-every > 0 (it holds {CHECKPOINT_FILE})"
            )
        try:
            with path.open("rb") as source:
                found = pickle.load(source)
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
            raise ValueError(
                f"resume-from: {path} is not a readable checkpoint ({error})"
            ) from error
        if not isinstance(found, cls) or found.version != CHECKPOINT_VERSION:
            raise ValueError(
                f"resume-from: {path} is not a version-{CHECKPOINT_VERSION} fl-clusters "
                "checkpoint; it cannot be resumed by this version"
            )
        changed = sorted(
            key for key in set(found.settings) | set(settings)
            if key not in RESUMABLE_CHANGES and found.settings.get(key) != settings.get(key)
        )
        if changed:
            detail = ", ".join(
                f"{key}={found.settings.get(key)!r} (now {settings.get(key)!r})" for key in changed
            )
            raise ValueError(
                f"resume-from: the checkpoint's run config differs in {detail}; resume with "
                f"the same settings (only {sorted(RESUMABLE_CHANGES)} may change)"
            )
        if found.server_round > settings["num-rounds"]:
            raise ValueError(
                f"resume-from: the checkpoint is at round {found.server_round}, past num-rounds "
                f"= {settings['num-rounds']}; set num-rounds >= {found.server_round}"
            )
        return found

    def move_to(self, keys_now: Mapping[int, int | None], grid: MeteredGrid) -> dict[int, int]:
        """Map the checkpoint's node ids to the nodes that hold their keys now.

        Remaps the strategy's state, the node lists and the stored keys in place,
        and gives ``grid`` the checkpoint's traffic counters and seen nodes.

        Parameters
        ----------
        keys_now : Mapping[int, int | None]
            The resumed run's node id -> stable key.
        grid : MeteredGrid
            The resumed run's grid.

        Returns
        -------
        dict[int, int]
            Old node id -> new node id, for the nodes found again.
        """
        node_by_key = {key: node for node, key in keys_now.items() if key is not None}
        mapping = {
            old: node_by_key[key] for old, key in self.node_keys.items()
            if key is not None and key in node_by_key and node_by_key[key] != old
        }
        missing = sorted(key for key in self.node_keys.values()
                         if key is not None and key not in node_by_key)
        if missing:
            log(WARNING, "resume: no node holds key(s) %s now; their clusters keep their "
                "models and the nodes count as lost", missing)
        state = remap_node_ids(dict(vars(self.strategy)), mapping)
        vars(self.strategy).update(state)
        self.node_keys = remap_node_ids(self.node_keys, mapping)
        self.start_nodes = remap_node_ids(self.start_nodes, mapping)
        self.nodes_seen = remap_node_ids(self.nodes_seen, mapping)
        grid.sent.update(self.sent)
        grid.received.update(self.received)
        grid.unanswered += self.unanswered
        grid.nodes_seen.update(self.nodes_seen)
        return mapping


class CheckpointedRounds(Strategy):
    """Flower's round loop around ``strategy``, with checkpoints, from any round.

    Flower's ``Strategy.start`` numbers rounds from 1; this wrapper hands the
    strategy the run's absolute round numbers (a resumed run continues at the
    checkpoint's round + 1), records the history across the interruption, and
    every ``every`` rounds writes a :class:`Checkpoint` to ``folder``.

    Parameters
    ----------
    strategy : Strategy
        Any Flower strategy (fl-clusters' or Flower's own).
    settings : Mapping[str, Any]
        The run's validated run config (stored in the checkpoint).
    folder : Path
        The results folder that receives ``checkpoint.pkl``.
    node_keys : Callable[[], Mapping[int, int | None]]
        The run's current node id -> stable key (clients' kept state is stored
        by key, node ids change between runs).
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
        strategy: Strategy,
        settings: Mapping[str, Any],
        folder: Path,
        node_keys: Callable[[], Mapping[int, int | None]],
        start_nodes: list[int],
        resumed: Checkpoint | None = None,
        on_round_end: Callable[[int, float, MetricRecord | None], None] | None = None,
    ) -> None:
        self.strategy = strategy
        self.on_round_end = on_round_end
        self.settings = dict(settings)
        self.folder = folder
        self.every = int(settings["checkpoint-every"])
        self.node_keys = node_keys
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
        the rounds before the checkpoint too. ``evaluate_fn`` gets absolute rounds.
        """
        self._grid = grid
        self.timeout = timeout
        if isinstance(self.strategy, ClusteredStrategy):
            self.strategy.prepare(grid, timeout)
            if evaluate_fn is not None:
                evaluate_fn = per_cluster_evaluate(evaluate_fn)
        arrays = initial_arrays
        if self.resumed is not None:
            arrays = self.resumed.arrays
            self._restore_client_states(grid, self.resumed.client_states)
        else:
            self.arrays = initial_arrays
        offset_fn = None
        if evaluate_fn is not None:
            inner = evaluate_fn

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
            node_keys=dict(self.node_keys()),
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
        keys = self.node_keys()
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
                log(WARNING, "checkpoint: node %d did not send its kept state (%s); resumed, "
                    "it starts without it", node, reply.error.reason)
            elif keys.get(node) is None:
                log(WARNING, "checkpoint: node %d has no stable key; its kept state cannot be "
                    "given back to it after a resume", node)
            elif len(reply.content) > 0:
                states[int(keys[node])] = reply.content  # type: ignore[arg-type]
        return states

    def _restore_client_states(self, grid: Grid, states: Mapping[int, RecordDict]) -> None:
        """Give each connected node the state it kept at the checkpoint."""
        keys = self.node_keys()
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
