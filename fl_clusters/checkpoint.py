"""Checkpoint a federation every few rounds and resume it where it stopped.

A checkpoint holds everything the next round depends on: the strategy object
(cluster models, assignments, CFL's split tree, FedSoft's importance weights,
FLDC's strata, its random generator), the model record Flower's round loop
passes on, the metric history, the traffic counters, and what each client keeps
between rounds (its ``context.state``: FedSoft's and local-only's own model,
FedEM's mixture weights). Clients seed their training from (round, node key), so the rounds
after a resume repeat the uninterrupted run's rounds exactly.

A resumed run is a new Flower run, and node ids are not stable across runs
(simulated ids are random per run). Every node id in the checkpoint is mapped to
the node that now answers the handshake with the same stable key
(:meth:`~fl_clusters.handshake.NodeRegistry.moved_ids`). The round loop that
writes checkpoints and resumes from one is :mod:`fl_clusters.rounds`.

The checkpoint is a pickle: resume only from folders you wrote yourself.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fl_clusters.grid import MeteredGrid
from fl_clusters.strategies.interface import ServerStrategy

CHECKPOINT_FILE = "checkpoint.pkl"
# Changes whenever what a checkpoint holds changes: another version is refused.
CHECKPOINT_VERSION = 2
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
    strategy : ServerStrategy
        The strategy object, with everything it decided so far (its node keys,
        its random state).
    arrays : ArrayRecord
        The model record Flower's round loop passes to the next round.
    train_metrics, evaluate_metrics : dict[int, MetricRecord]
        The aggregated metrics of every round so far.
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
    version : int
        Format version; a checkpoint of another version is refused.
    """

    server_round: int
    settings: dict[str, Any]
    strategy: ServerStrategy
    arrays: ArrayRecord
    train_metrics: dict[int, MetricRecord]
    evaluate_metrics: dict[int, MetricRecord]
    client_states: dict[int, RecordDict]
    start_nodes: list[int]
    nodes_seen: set[int]
    sent: dict[int, int]
    received: dict[int, int]
    unanswered: int
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

        Remaps the strategy's state (its node registry included) and the node lists
        in place, and gives ``grid`` the checkpoint's traffic counters and seen nodes.

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
        mapping = self.strategy.nodes.moved_ids(keys_now)
        state = remap_node_ids(dict(vars(self.strategy)), mapping)
        vars(self.strategy).update(state)
        self.start_nodes = remap_node_ids(self.start_nodes, mapping)
        self.nodes_seen = remap_node_ids(self.nodes_seen, mapping)
        grid.sent.update(self.sent)
        grid.received.update(self.received)
        grid.unanswered += self.unanswered
        grid.nodes_seen.update(self.nodes_seen)
        return mapping


