"""Cells whose run another cell of the same sweep makes: one run under both presets.

A strategy that reads nothing the preset changes computes under ``preset =
"paper"`` exactly what it computes under ``"robust"`` (:func:`reads_preset`):
Flower's FedAvg and FedProx read no ``preset`` key at all, and a strategy that
declares no paper value and no switched rule (local-only training) builds the same
object under both. A sweep that crosses such a strategy with both presets would
run every such federation twice; the runner records the second cell from the
first one's run instead (:func:`twin_line`): a line under the cell's own key with
that run's summary, results folder, log and provenance, marked ``same_run_as``.

Such a line is the cell's run only while its source's last line is the run it
copied (:func:`line_changes`): a source run again (stale, retried, merged from
another machine) makes the line stale too, and the next sweep records the cell
again from the source's new run, or runs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fl_clusters.config import strategy_keys
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.presets import departs
from fl_clusters.strategy_builder import build_strategy
from fl_clusters.sweep.cells import Cell, SettingChange, Sweep

# The line field that names the cell whose run a line repeats (its key).
SAME_RUN_AS = "same_run_as"
PRESET_KEY = "preset"
# What a repeated line copies from its source's line: while they are equal in both,
# the source's last line is the run the repeat copied.
RUN_FIELDS = ("federation", "started", "seconds", "results_folder", "log", "git_commit",
              "git_dirty", "ray_node_id")


def reads_preset(strategy: str) -> bool:
    """Whether a run of ``strategy`` computes anything else under another preset.

    From the declarations: a strategy whose run-config keys have no ``preset``
    (Flower's baselines) does not; a registered one does when one of its
    parameters has a paper value apart from its default or one of its behaviours
    is switched (:class:`~fl_clusters.strategies.kit.presets.Declared`), the two
    things ``preset = "paper"`` changes.
    """
    if PRESET_KEY not in strategy_keys(strategy):
        return False
    cls = ClusteredStrategy.registry[strategy]
    return (any(departs(param) for param in cls.declared_params())
            or any(behaviour.switched for behaviour in cls.declared_behaviours()))


def run_identity(cell: Cell) -> str | None:
    """What the run of ``cell`` computes, as text: its full run config but the preset.

    ``None`` when its strategy reads the preset (:func:`reads_preset`): then no
    other cell's run is its run. Cells of one sweep share the federation.
    """
    if reads_preset(cell.settings["strategy"]):
        return None
    return json.dumps({key: value for key, value in cell.settings.items() if key != PRESET_KEY},
                      sort_keys=True)


@dataclass(frozen=True)
class SourceChange:
    """Why a repeated line is no longer its cell's run: the run it copied changed.

    Parameters
    ----------
    source : str
        The source cell's name (``axis=label,...``), or its key when the sweep has
        no such cell any more.
    what : str
        What happened to its run, e.g. ``"was run again"``.
    """

    source: str
    what: str

    def __str__(self) -> str:
        return f"the run of {self.source} ({SAME_RUN_AS}), which {self.what}"


Change = SettingChange | SourceChange


def source_changes(
    line: Mapping[str, Any], latest: Mapping[str, Mapping[str, Any]], cells: Mapping[str, Cell]
) -> list[SourceChange]:
    """Why ``line`` no longer repeats its source's current run; empty when it does,
    or when it is a run of its own.

    ``latest``: each key's last line; ``cells``: the sweep's cells by key.
    """
    key = line.get(SAME_RUN_AS)
    if key is None:
        return []
    cell, source = cells.get(key), latest.get(key)
    if cell is None:
        return [SourceChange(key, "is no cell of the sweep any more")]
    if source is None or any(source.get(name) != line.get(name) for name in RUN_FIELDS):
        return [SourceChange(cell.name, "was run again")]
    if changes := cell.changed_settings(source["settings"]):
        return [SourceChange(cell.name, f"is stale ({'; '.join(map(str, changes))})")]
    return []


def line_changes(
    cell: Cell, line: Mapping[str, Any], latest: Mapping[str, Mapping[str, Any]],
    cells: Mapping[str, Cell],
) -> list[Change]:
    """Why ``line`` is no longer ``cell``'s run: the settings it used that have
    another value now (:meth:`Cell.changed_settings`), and for a repeated line its
    source's run changing (:func:`source_changes`); empty when it is current."""
    return [*cell.changed_settings(line["settings"]), *source_changes(line, latest, cells)]


def latest_by_key(runs: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each key's last line of ``runs``."""
    return {line["key"]: line for line in runs}


class SameRuns:
    """The cells of a sweep grouped by what their runs compute (:func:`run_identity`).

    Parameters
    ----------
    sweep : Sweep
        The loaded sweep file.
    """

    def __init__(self, sweep: Sweep) -> None:
        self.cells = {cell.key: cell for cell in sweep.cells}
        self._identity = {cell.key: run_identity(cell) for cell in sweep.cells}
        self._groups: dict[str, list[Cell]] = {}
        for cell in sweep.cells:
            identity = self._identity[cell.key]
            if identity is not None:
                self._groups.setdefault(identity, []).append(cell)

    def source_line(
        self, cell: Cell, latest: Mapping[str, Mapping[str, Any]]
    ) -> Mapping[str, Any] | None:
        """The recorded run that is ``cell``'s run too, or ``None``.

        The current ``ok`` line of another cell with the same run, a run of its
        own (not itself a repeat), the first such in the sweep's order.
        """
        identity = self._identity[cell.key]
        for other in self._groups.get(identity, []) if identity is not None else []:
            line = latest.get(other.key)
            if (other.key != cell.key and line is not None and line["status"] == "ok"
                    and SAME_RUN_AS not in line
                    and not line_changes(other, line, latest, self.cells)):
                return line
        return None

    def plan(self, todo: Iterable[Cell], latest: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
        """Which cells of ``todo`` a sweep records from another cell's run: key -> its key.

        That cell's recorded run (:meth:`source_line`), or else the first cell of
        ``todo`` with the same run, which runs (the runner runs the cells that are
        no repeat first).
        """
        planned: dict[str, str] = {}
        running: dict[str, str] = {}
        for cell in todo:
            source = self.source_line(cell, latest)
            identity = self._identity[cell.key]
            if source is not None:
                planned[cell.key] = source["key"]
            elif identity is not None and identity in running:
                planned[cell.key] = running[identity]
            elif identity is not None:
                running[identity] = cell.key
        return planned

    def twin_line(
        self, cell: Cell, source: Mapping[str, Any], recorded: str
    ) -> dict[str, Any]:
        """``cell``'s ``runs.jsonl`` line from ``source``, the line of the run it repeats.

        The run's fields (:data:`RUN_FIELDS`: its federation, times, results
        folder, log and commit) and summary are the source's; the summary's preset
        fields are the ones this cell's strategy reports (``preset``,
        ``preset_changes``, ...: what the run would have written under this cell's
        preset). ``settings`` is this cell's (its own staleness), ``same_run_as``
        names the source, ``recorded`` says when this line was written.
        """
        source_cell = self.cells[source["key"]]
        own = build_strategy(cell.settings).preset_fields()
        preset_fields = own.keys() | build_strategy(source_cell.settings).preset_fields().keys()
        summary = {name: own.get(name) if name in preset_fields else value
                   for name, value in source["summary"].items()}
        return {
            "key": cell.key, "cell": cell.labels, "run_config": cell.run_config,
            **{name: source.get(name) for name in RUN_FIELDS},
            "status": "ok", "error": None, "summary": summary,
            "settings": cell.recorded_settings, SAME_RUN_AS: source["key"],
            "recorded": recorded,
        }
