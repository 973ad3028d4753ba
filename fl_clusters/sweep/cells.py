"""What a sweep is made of: its axes, its cells and their keys.

:mod:`fl_clusters.sweep.spec` reads a sweep file into these records; the runner
and the report read them. A cell's key is a hash of the run-config keys its sweep
sets and of its federation, so a default the app adds or changes keeps every key;
:meth:`Cell.changed_settings` says whether a recorded run is still the cell's run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_clusters.config import PAPER_RECIPE, strategy_keys
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.presets import departs

# Run-config keys the sweep sets for every run, and why a file may not: where each
# run writes (a file that set it would scatter runs), and the paper preset's training
# recipe, which is off (a sweep file is an experiment whose recipe is its own
# settings, shared by every cell, baselines included).
RESERVED_RUN_CONFIG_KEYS = {
    "results-dir": "every run writes under results/sweeps/NAME/runs/",
    PAPER_RECIPE: "a sweep's training recipe is its own settings, the same for every cell; "
    "the paper preset's recipe is off in a sweep",
}
SEED_AXIS = "seed"
GPUS_AUTO = "auto"
GPUS_KEY = "client-resources-num-gpus"
# A run line's setting beside the run config: what its strategy's preset="paper"
# computed (Declared.paper_revision_for); a line without it ran revision 1.
PAPER_REVISION = "paper-revision"
# Likewise what its preset="robust" computed (Declared.robust_revision_for).
ROBUST_REVISION = "robust-revision"


def revision_settings(settings: Mapping[str, Any]) -> dict[str, int]:
    """The revision a run with run config ``settings`` records beside it: the paper's
    under ``preset="paper"`` (:data:`PAPER_REVISION`), the robust preset's otherwise
    (:data:`ROBUST_REVISION`, recorded from its first rise past 1); none for a
    strategy that declares nothing."""
    cls = ClusteredStrategy.registry.get(settings["strategy"])
    if cls is None:
        return {}
    if settings.get("preset") == "paper":
        return {PAPER_REVISION: int(cls.paper_revision_for(settings))}
    revision = int(cls.robust_revision_for())
    return {ROBUST_REVISION: revision} if revision > 1 else {}


def keys_the_paper_sets(settings: Mapping[str, Any]) -> set[str]:
    """The run-config keys whose default ``preset="paper"`` replaces with the paper's
    value in a run with run config ``settings`` (none under another preset)."""
    cls = ClusteredStrategy.registry.get(settings["strategy"])
    if cls is None or settings.get("preset") != "paper":
        return set()
    return {str(param.key) for param in cls.declared_params()
            if param.run_config and param.key and departs(param)}


@dataclass(frozen=True)
class Axis:
    """One grid axis: its values, each a label and the run-config keys it sets.

    Parameters
    ----------
    name : str
        The axis name: a run-config key for a list axis, any name for a table of
        named variants.
    values : tuple[tuple[str, dict[str, Any]], ...]
        ``(label, run-config keys)`` per value, in the file's order.
    """

    name: str
    values: tuple[tuple[str, dict[str, Any]], ...]

    @property
    def labels(self) -> list[str]:
        """The values' labels, in order."""
        return [label for label, _ in self.values]

    @property
    def keys(self) -> set[str]:
        """Every run-config key some value of this axis sets."""
        return {key for _, settings in self.values for key in settings}


def _as_json(value: Any) -> str:
    """``value`` as runs.jsonl holds it, so a tuple and its list compare equal."""
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class SettingChange:
    """A setting a recorded run used that has another value now.

    Parameters
    ----------
    key : str
        The run-config key.
    was : Any
        Its value in the run's recorded ``settings``.
    now : Any
        The value the same cell's run config validates to today.
    """

    key: str
    was: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key}={_as_json(self.was)}, now {_as_json(self.now)}"


@dataclass(frozen=True)
class Cell:
    """One run of the sweep.

    Parameters
    ----------
    labels : dict[str, str]
        Axis name -> the label of this cell's value, in axis order.
    run_config : dict[str, Any]
        The run-config keys the sweep sets (base, then every axis' value); the
        run's own defaults fill the rest.
    settings : dict[str, Any]
        The full, validated run config (:func:`parse_run_config`), without the keys
        the sweep sets (:data:`RESERVED_RUN_CONFIG_KEYS`).
    key : str
        Hash of ``run_config`` and the federation (:func:`cell_key`).
    """

    labels: dict[str, str]
    run_config: dict[str, Any]
    settings: dict[str, Any]
    key: str

    @property
    def name(self) -> str:
        """``axis=label`` pairs, e.g. ``strategy=ifca,seed=0``."""
        return ",".join(f"{axis}={label}" for axis, label in self.labels.items())

    @property
    def recorded_settings(self) -> dict[str, Any]:
        """What a run line records as its ``settings``: the run config, and the
        strategy's revision of its preset (:func:`revision_settings`)."""
        return self.settings | revision_settings(self.settings)

    def changed_settings(self, recorded: Mapping[str, Any]) -> list[SettingChange]:
        """The settings a run recorded that this cell now gives another value.

        Only the keys the cell's strategy reads count
        (:func:`fl_clusters.config.strategy_keys`): another strategy's default changes
        nothing here. A key the run did not record is one the app added since; its
        default reproduces what the run did (the golden summaries check that), so it
        changes nothing either. The strategy's revision of the run's preset counts as
        a setting (:func:`revision_settings`, 1 where the line has none): a change to
        what the preset computes stales the runs made before it. Under
        ``preset="paper"`` a key the cell does not name and the preset sets
        (:func:`keys_the_paper_sets`) reached neither run: its default can change.

        Parameters
        ----------
        recorded : Mapping[str, Any]
            The ``settings`` of the run's ``runs.jsonl`` line.

        Returns
        -------
        list[SettingChange]
            One per changed key, in key order; empty when the run is the cell's.
        """
        read = (strategy_keys(self.settings["strategy"]) - set(RESERVED_RUN_CONFIG_KEYS)
                - (keys_the_paper_sets(self.settings) - set(self.run_config)))
        changes = [
            SettingChange(key, recorded[key], self.settings[key])
            for key in sorted(read & set(recorded) & set(self.settings))
            if _as_json(recorded[key]) != _as_json(self.settings[key])
        ]
        now = revision_settings(self.settings)
        for key in (PAPER_REVISION, ROBUST_REVISION):
            if key in now and recorded.get(key, 1) != now[key]:
                changes.append(SettingChange(key, recorded.get(key, 1), now[key]))
        return changes

    def selected_by(self, only: Mapping[str, set[str]]) -> bool:
        """Whether this cell has one of the chosen labels on every axis ``only`` names."""
        return all(self.labels[axis] in labels for axis, labels in only.items())


@dataclass(frozen=True)
class Sweep:
    """A checked sweep file and its cells.

    Parameters
    ----------
    name : str
        The results folder's name (``results/sweeps/NAME``).
    path : Path
        The sweep file.
    axes : tuple[Axis, ...]
        The grid axes, in the file's order.
    federation : dict[str, int | float | str]
        ``num-supernodes``, ``client-resources-num-cpus``, ``client-resources-num-gpus``
        (a number, or ``"auto"``: :func:`resolve_federation`).
    cells : tuple[Cell, ...]
        Every cell not excluded, in grid order (the last axis varies fastest).
    baseline_axis : str | None
        The axis the baseline is a value of.
    baselines : tuple[str, ...]
        The baseline labels on that axis.
    run_timeout_s : float | None
        Seconds a run may take before it is stopped and recorded failed.
    description : str
        Free text from the file.
    record : tuple[str, ...]
        summary.json fields each run's line keeps beside the standard ones
        (a strategy's own, e.g. ``reassigned_per_round``).
    """

    name: str
    path: Path
    axes: tuple[Axis, ...]
    federation: dict[str, int | float | str]
    cells: tuple[Cell, ...]
    baseline_axis: str | None = None
    baselines: tuple[str, ...] = ()
    run_timeout_s: float | None = None
    description: str = ""
    record: tuple[str, ...] = ()
    text: str = field(default="", repr=False)

    @property
    def group_axes(self) -> list[str]:
        """Axes that tell cells apart once the seed is left out."""
        return [axis.name for axis in self.axes if axis.name != SEED_AXIS]


def cell_key(run_config: Mapping[str, Any], federation: Mapping[str, Any]) -> str:
    """The key of a run: a hash of the run-config keys its sweep sets and its federation.

    Two cells with the same key would repeat the same run; a resumed sweep skips a
    cell whose key it has recorded (unless the run is stale:
    :meth:`Cell.changed_settings`). Defaults are not part of the key, so a key the
    app adds, or a default it changes, leaves every recorded run under its key;
    each line's ``settings`` says what the run used. The results folder is not
    part of a run's config, and the GPUs are not part of its federation: they
    decide where a run computes, not what, so a sweep resumed on a GPU machine
    skips the cells a CPU machine recorded (each line's ``federation`` says where
    it ran). The key hashes the GPU share as 0.0.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The keys the sweep file sets for the cell (``Cell.run_config``, or a
        ``runs.jsonl`` line's ``run_config``), as written.
    federation : Mapping[str, Any]
        The sweep's federation, resolved for a machine or not.
    """
    content = {
        "run_config": {k: v for k, v in run_config.items() if k not in RESERVED_RUN_CONFIG_KEYS},
        "federation": {**federation, GPUS_KEY: 0.0},
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def resolve_federation(
    federation: Mapping[str, int | float | str], resources: Mapping[str, float]
) -> dict[str, int | float]:
    """The federation a sweep runs with on a machine whose Ray has ``resources``.

    A GPU share of ``"auto"`` becomes 0 without GPUs; with GPUs, each client gets an
    equal share of them such that every client that fits on the CPUs at once
    (``CPU // client-resources-num-cpus``) holds one share, at most a whole GPU,
    rounded down to Ray's 0.0001 steps.

    Parameters
    ----------
    federation : Mapping[str, int | float | str]
        ``Sweep.federation``.
    resources : Mapping[str, float]
        ``ray.cluster_resources()``: ``"CPU"`` and, where there are any, ``"GPU"``.
    """
    resolved = dict(federation)
    if resolved[GPUS_KEY] == GPUS_AUTO:
        gpus = float(resources.get("GPU", 0.0))
        concurrent = max(1, int(float(resources.get("CPU", 1.0))
                                // float(resolved["client-resources-num-cpus"])))
        resolved[GPUS_KEY] = min(1.0, int(gpus / concurrent * 10_000) / 10_000) if gpus else 0.0
    return resolved  # type: ignore[return-value]
