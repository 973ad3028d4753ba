"""Checkpoint a federation every few rounds and resume it where it stopped.

A checkpoint holds everything the next round depends on: the strategy's state
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

The file, ``checkpoint.zip``, is a zip archive of three parts and holds no code
(:mod:`fl_clusters.checkpoint_archive` writes and checks it):

- ``manifest.json``: the format's name, its version and the SHA-256 of each other part;
- ``state.json``: everything but arrays, as a typed JSON tree
  (:mod:`fl_clusters.state_tree`: tuples, sets, dicts with int keys, non-finite
  floats, Flower's records, numpy and Python random generators' states,
  fl-clusters' own objects by class and attributes);
- ``arrays.npz``: every numpy array the tree refers to, written and read
  without pickles.

Reading it rebuilds the strategy from the checkpoint's run config, as the run
built it, and sets back the attributes it kept once they fit it
(:mod:`fl_clusters.checkpoint_checks`); which values the tree rebuilds, and why
reading it imports nothing, is :mod:`fl_clusters.state_tree`'s. What reading may
allocate is bounded (:mod:`fl_clusters.checkpoint_limits`). A file that fails any
check (zip structure, sizes, part checksums, format version, tree, field types,
the round, finite cluster models) is refused whole with one line naming the file
and the damage. Reading writes nothing: the folder resumed from may be read-only,
or another run's.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fl_clusters.checkpoint_archive import (
    ARRAYS,
    CHECKPOINT_FILE,
    STATE,
    one_line,
    read_arrays,
    read_parts,
    write_parts,
)
from fl_clusters.checkpoint_checks import check_cluster_models, check_fields, restore_state
from fl_clusters.checkpoint_limits import CheckpointLimits
from fl_clusters.grid import MeteredGrid
from fl_clusters.state_tree import (
    TREE_ERRORS,
    DamagedCheckpoint,
    StateReader,
    StateWriter,
    qualified_name,
)
from fl_clusters.strategies.kit.interface import ServerStrategy
from fl_clusters.strategy_builder import build_strategy

# What the earlier versions wrote; refused without being opened.
PICKLED_CHECKPOINT_FILE = "checkpoint.pkl"
# Settings a resumed run may change: where results go, how long the run lasts and
# how patient it is; none changes what a round computes from the state.
# paper-recipe only decides other keys' values, which are compared themselves.
RESUMABLE_CHANGES = frozenset({
    "num-rounds", "checkpoint-every", "resume-from", "results-dir", "round-timeout",
    "plots", "min-nodes", "target-accuracy", "device", "torch-threads", "paper-recipe",
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


def read_checkpoint(path: Path, limits: CheckpointLimits | None = None) -> dict[str, Any]:
    """The fields of the :class:`Checkpoint` in the file at ``path``, the strategy's as
    ``{"class": ..., "state": ...}``.

    Reads ``path`` and nothing else, and writes nothing.

    Parameters
    ----------
    path : Path
        The checkpoint file.
    limits : CheckpointLimits | None
        What the file may make this process allocate; ``None``: the defaults.

    Raises
    ------
    DamagedCheckpoint
        If the file fails a check of :func:`read_parts` or :func:`read_arrays`,
        its state tree is not one a checkpoint writes, a field is of the wrong
        type, or a cluster model is not finite.
    """
    limits = limits or CheckpointLimits()
    parts = read_parts(path, limits)
    arrays = read_arrays(parts[ARRAYS])
    try:
        fields = StateReader(arrays, limits.max_depth).value(json.loads(parts[STATE]))
        names = {f.name for f in dataclasses.fields(Checkpoint)}
        if type(fields) is not dict or set(fields) != names:
            raise DamagedCheckpoint(f"is malformed: its {STATE} does not hold the fields "
                                    f"{sorted(names)}")
    except (*TREE_ERRORS, RecursionError) as error:
        raise DamagedCheckpoint(
            f"is malformed: its {STATE} cannot be rebuilt ({type(error).__name__}: "
            f"{one_line(error)})"
        ) from None
    check_fields(fields)
    check_cluster_models(fields)
    return fields


def _checkpoint_path(location: str | Path) -> Path:
    """The checkpoint file ``location`` (a results folder or the file) names.

    A folder with only a pickled checkpoint of the earlier versions names that
    file, so that it is refused as a pickle rather than reported missing.

    Raises
    ------
    ValueError
        If there is no checkpoint file there.
    """
    path = Path(location)
    if path.is_dir():
        if not (path / CHECKPOINT_FILE).exists() and (path / PICKLED_CHECKPOINT_FILE).exists():
            path = path / PICKLED_CHECKPOINT_FILE
        else:
            path = path / CHECKPOINT_FILE
    if not path.is_file():
        raise ValueError(
            f"resume-from: no checkpoint at {path}; pass the results folder of a run "
            f"started with checkpoint-every > 0 (it holds {CHECKPOINT_FILE})"
        )
    return path


def _check_resumable(path: Path, fields: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
    """Check the ``fields`` of the checkpoint at ``path`` fit the resumed run's ``settings``.

    Raises
    ------
    ValueError
        If its run config differs in a key that changes what a round computes, or
        it is past the run's ``num-rounds``.
    """
    found_settings = fields["settings"]
    changed = sorted(
        key for key in set(found_settings) | set(settings)
        if key not in RESUMABLE_CHANGES and found_settings.get(key) != settings.get(key)
    )
    if changed:
        detail = ", ".join(
            f"{key}={found_settings.get(key)!r} (now {settings.get(key)!r})" for key in changed
        )
        raise ValueError(
            f"resume-from: the run config of {path} differs in {detail}; resume with "
            f"the same settings (only {sorted(RESUMABLE_CHANGES)} may change)"
        )
    if fields["server_round"] > settings["num-rounds"]:
        raise ValueError(
            f"resume-from: {path} is at round {fields['server_round']}, past "
            f"num-rounds = {settings['num-rounds']}; set num-rounds >= "
            f"{fields['server_round']}"
        )


def _rebuilt_strategy(path: Path, fields: Mapping[str, Any]) -> ServerStrategy:
    """The strategy of the checkpoint at ``path``, with the state its ``fields`` hold.

    The run config builds the strategy as the run did; then it gets back what it
    had decided by the checkpoint's round (:func:`restore_state`).

    Raises
    ------
    ValueError
        If the run config builds a strategy of another class than the one kept,
        or the state does not fit the strategy built.
    """
    strategy = build_strategy(fields["settings"])
    if qualified_name(type(strategy)) != fields["strategy"]["class"]:
        raise ValueError(
            f"resume-from: {path} holds a {fields['strategy']['class']!r} strategy, but its "
            f"run config builds a {qualified_name(type(strategy))!r}; it is not loaded"
        )
    try:
        restore_state(strategy, fields["strategy"]["state"])
    except DamagedCheckpoint as error:
        raise ValueError(f"resume-from: {path} {error}; it is not loaded") from None
    return strategy


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

    def write(self, folder: Path) -> Path:
        """Write to ``folder/checkpoint.zip``, replacing the previous one atomically.

        A run killed while writing leaves the previous checkpoint intact.

        Raises
        ------
        TypeError
            If the strategy's state holds something a checkpoint cannot keep.
        """
        writer = StateWriter()
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["strategy"] = {
            "class": qualified_name(type(self.strategy)),
            "state": self.strategy.checkpoint_state(),
        }
        state = json.dumps(writer.tree(fields, "checkpoint"), allow_nan=False).encode()
        arrays = io.BytesIO()
        np.savez(arrays, allow_pickle=False, **writer.arrays)
        path = folder / CHECKPOINT_FILE
        write_parts(path, {STATE: state, ARRAYS: arrays.getvalue()})
        return path

    @classmethod
    def load(
        cls, location: str | Path, settings: Mapping[str, Any],
        limits: CheckpointLimits | None = None,
    ) -> Checkpoint:
        """Read the checkpoint at ``location`` and check it fits ``settings``.

        Writes nothing: a temporary file the interrupted run left in its folder is
        removed by the next write of a checkpoint there, never by a reader.

        Parameters
        ----------
        location : str | Path
            A results folder holding ``checkpoint.zip``, or the file itself.
        settings : Mapping[str, Any]
            The resumed run's validated run config.
        limits : CheckpointLimits | None
            What the file may make this process allocate; ``None``: the defaults.

        Raises
        ------
        ValueError
            If there is no checkpoint, it is damaged (truncated, a part that does
            not match its checksum), larger than ``limits`` allow, it is not an
            fl-clusters checkpoint of this format version, its state does not fit
            the strategy its run config builds, its run config differs in a key
            that changes what a round computes, or it is past the run's
            ``num-rounds``.
        """
        path = _checkpoint_path(location)
        try:
            fields = read_checkpoint(path, limits)
        except DamagedCheckpoint as error:
            raise ValueError(f"resume-from: {path} {error}; it is not loaded") from None
        _check_resumable(path, fields, settings)
        strategy = _rebuilt_strategy(path, fields)
        return cls(**{**fields, "strategy": strategy})

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


