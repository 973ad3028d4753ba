"""Put the runs of one sweep made on other machines into its folder.

A sweep can be shared between machines: each runs a slice (``--only``) into a
folder of its own, e.g. the GPU machine the CNN cells and the laptop the rest.
:func:`merge_runs` brings such a folder's runs into the sweep's folder: the lines
of ``runs.jsonl`` whose cells the sweep file has and the folder lacks, with each
run's results folder and log, and the other folder's sessions into
``manifest.json`` (the machine, commit and command those runs came from). A cell
key does not depend on the machine (:func:`fl_clusters.sweep.cells.cell_key`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_clusters.sweep.cells import Sweep
from fl_clusters.sweep.provenance import append_session
from fl_clusters.sweep.runner import (
    LOGS_FOLDER,
    MANIFEST_FILE,
    RUNS_FILE,
    RUNS_FOLDER,
    append_run,
    read_runs,
)
from fl_clusters.sweep.twins import line_changes, source_changes


class MergeError(ValueError):
    """A folder that cannot be merged: not a sweep folder, or another sweep's."""


@dataclass
class MergeResult:
    """What :func:`merge_runs` did with one folder's lines.

    Parameters
    ----------
    added : list[str]
        Keys of the runs added (their lines, results folders and logs).
    already_recorded : list[str]
        Keys the sweep's folder has an ``ok`` line for already: kept as they are.
    not_in_sweep : list[str]
        Keys that are no cell of the sweep file as it is now: left out.
    repeat_other_runs : list[str]
        Keys whose line repeats another cell's run (``same_run_as``) of which the
        sweep's folder holds another run: left out; the next sweep records them
        from the folder's own run.
    """

    added: list[str] = field(default_factory=list)
    already_recorded: list[str] = field(default_factory=list)
    not_in_sweep: list[str] = field(default_factory=list)
    repeat_other_runs: list[str] = field(default_factory=list)


def _sweep_name_of(folder: Path) -> str | None:
    manifest = folder / MANIFEST_FILE
    if not manifest.exists():
        return None
    return json.loads(manifest.read_text()).get("sweep")


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    elif source.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _check_other(sweep: Sweep, folder: Path, other: Path) -> None:
    """Refuse ``other`` unless it is another folder of ``sweep`` (:class:`MergeError`)."""
    if not (other / RUNS_FILE).exists():
        raise MergeError(f"{other}: no {RUNS_FILE}; name the folder a sweep wrote (its --out)")
    if other.resolve() == folder.resolve():
        raise MergeError(f"{other} is the sweep's own folder; name another machine's folder")
    name = _sweep_name_of(other)
    if name is not None and name != sweep.name:
        raise MergeError(
            f"{other} holds sweep {name!r}, not {sweep.name!r}; merge it with its own file"
        )


def merge_runs(sweep: Sweep, folder: Path, other: Path) -> MergeResult:
    """Add the runs of ``other`` (a folder of the same sweep) to ``folder``.

    A run is added when its key is a cell of ``sweep`` and ``folder`` has no line
    for it, or only a failed or stale one (:func:`fl_clusters.sweep.twins.line_changes`)
    while ``other``'s run is ``ok`` and current (the later line is the one the table
    reads, as after ``--retry-failed``). A line that repeats another cell's run
    (``same_run_as``) is added only when ``folder``'s line of that cell is that run
    (it came along, or was there already). The table and plots are not rewritten here.
    The caller holds ``folder``'s lock (:func:`fl_clusters.sweep.lock.sweep_folder_lock`).

    Parameters
    ----------
    sweep : Sweep
        The loaded sweep file.
    folder : Path
        The sweep's folder, created when missing.
    other : Path
        A folder the same sweep wrote on another machine.

    Returns
    -------
    MergeResult
        The keys added, kept and left out.
    """
    _check_other(sweep, folder, other)
    folder.mkdir(parents=True, exist_ok=True)
    cells = {cell.key: cell for cell in sweep.cells}
    ours = {line["key"]: line for line in read_runs(folder / RUNS_FILE) if line["key"] in cells}

    def current(line: dict[str, Any]) -> bool:
        # A line that repeats another cell's run is current here when this folder's
        # line of that cell is the run it repeats.
        latest = {**ours, line["key"]: line}
        return line["status"] == "ok" and not line_changes(cells[line["key"]], line, latest,
                                                           cells)

    result = MergeResult()
    for line in read_runs(other / RUNS_FILE):
        key = line["key"]
        if key not in cells:
            result.not_in_sweep.append(key)
            continue
        if key in ours and (current(ours[key]) or not current(line)):
            result.already_recorded.append(key)
            continue
        if source_changes(line, {**ours, key: line}, cells):
            result.repeat_other_runs.append(key)
            continue
        _copy(other / RUNS_FOLDER / key, folder / RUNS_FOLDER / key)
        _copy(other / LOGS_FOLDER / f"{key}.log", folder / LOGS_FOLDER / f"{key}.log")
        append_run(folder / RUNS_FILE, line)
        ours[key] = line
        result.added.append(key)
    if result.added:
        _merge_sessions(folder / MANIFEST_FILE, other / MANIFEST_FILE, sweep.name)
    return result


def _merge_sessions(manifest: Path, other_manifest: Path, sweep_name: str) -> None:
    """Append the sessions of ``other_manifest`` that ``manifest`` lacks."""
    ours = json.loads(manifest.read_text())["sessions"] if manifest.exists() else []
    theirs = json.loads(other_manifest.read_text())["sessions"] if other_manifest.exists() else []
    for entry in theirs:
        if entry not in ours:
            append_session(manifest, sweep_name, entry)
