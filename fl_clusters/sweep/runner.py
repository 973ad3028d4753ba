"""Run a sweep's cells in this process, on one Ray session, recording one line a run.

Every cell is one simulated federation (:func:`fl_clusters.sweep.simulation.simulate`),
all of them on one :class:`~fl_clusters.sweep.simulation.RaySession`.

Each finished run appends one line to ``runs.jsonl`` (flushed to disk at once), so
a sweep that is stopped and started again skips every cell whose key it finds
there (:func:`fl_clusters.sweep.cells.cell_key`), unless a setting that run used
has another value now (:meth:`fl_clusters.sweep.cells.Cell.changed_settings`). A
cell whose run another cell makes (the same run under the other preset,
:mod:`fl_clusters.sweep.twins`) is recorded from that run without running it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_clusters.ray_pool import actors_kept_between_runs
from fl_clusters.sweep.cells import Cell, Sweep, resolve_federation
from fl_clusters.sweep.lock import sweep_folder_lock
from fl_clusters.sweep.provenance import append_session, git_state, session_entry, utc_now
from fl_clusters.sweep.simulation import RaySession, output_to, simulate
from fl_clusters.sweep.twins import SAME_RUN_AS, SameRuns, latest_by_key, line_changes

RUNS_FILE = "runs.jsonl"
MANIFEST_FILE = "manifest.json"
SWEEP_COPY = "sweep.toml"
RUNS_FOLDER = "runs"
LOGS_FOLDER = "logs"
# The summary.json fields each run's line keeps (docs/results.md, "What a run writes").
SUMMARY_FIELDS = (
    "ari", "nmi", "personalized_accuracy", "num_clusters_found", "rounds_to_target",
    "bytes_sent", "bytes_received", "wall_time_s",
)


def sweep_folder(sweep: Sweep, out: Path | None = None) -> Path:
    """Where a sweep writes: ``out``, else ``results/sweeps/NAME`` under the working folder."""
    return out if out is not None else Path("results") / "sweeps" / sweep.name


def read_runs(path: Path) -> list[dict[str, Any]]:
    """The lines of ``runs.jsonl``; a last line cut off mid-write is dropped from the file.

    A sweep killed while writing leaves at most one partial line, at the end: it
    is removed so that the next line starts on a line of its own.
    """
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def append_run(path: Path, line: Mapping[str, Any]) -> None:
    """Append one run's line to ``runs.jsonl`` and put it on disk before going on."""
    with path.open("a") as out:
        out.write(json.dumps(line, allow_nan=False) + "\n")
        out.flush()
        os.fsync(out.fileno())


def _error_text(error: BaseException) -> str:
    """The error and its causes, one ``Type: message`` each, outermost first."""
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__
    return " <- ".join(parts)


def run_cell(
    cell: Cell,
    sweep: Sweep,
    folder: Path,
    ray_node_id: str,
    commit: Mapping[str, Any],
    federation: Mapping[str, int | float],
) -> dict[str, Any]:
    """Run one cell and return its ``runs.jsonl`` line (status ``ok`` or ``failed``).

    ``federation`` is the sweep's, resolved for this machine (:func:`resolve_federation`).

    The run's output goes to ``logs/KEY.log``; its results folder lies under
    ``runs/KEY/``. Any exception of the run is recorded, never raised; an
    interrupt (Ctrl-C, a kill) still stops the sweep.
    """
    results_dir = folder / RUNS_FOLDER / cell.key
    # A folder without a line is what a killed run left: start that run afresh.
    shutil.rmtree(results_dir, ignore_errors=True)
    log_path = folder / LOGS_FOLDER / f"{cell.key}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    settings = {**cell.settings, "results-dir": str(results_dir)}
    line: dict[str, Any] = {
        "key": cell.key,
        "cell": cell.labels,
        "run_config": cell.run_config,
        "federation": dict(federation),
        "started": utc_now(),
    }
    start = time.monotonic()
    with log_path.open("w") as log, output_to(log):
        try:
            results = simulate(settings, federation, sweep.run_timeout_s)
        except Exception as error:
            traceback.print_exc(file=log)
            line.update(status="failed", error=_error_text(error), summary=None,
                        results_folder=None)
        else:
            summary = json.loads((results / "summary.json").read_text())
            line.update(
                status="ok", error=None,
                summary={name: summary.get(name)
                         for name in (*SUMMARY_FIELDS, *sweep.record)},
                results_folder=str(results.relative_to(folder)),
            )
    line["seconds"] = round(time.monotonic() - start, 3)
    line.update(
        log=str(log_path.relative_to(folder)), settings=cell.recorded_settings,
        git_commit=commit["commit"], git_dirty=commit["dirty"], ray_node_id=ray_node_id,
    )
    return line


def _progress_line(line: Mapping[str, Any], cell: Cell, same_runs: SameRuns) -> str:
    """The line printed above the bar when a run ends, or a cell is recorded from
    another cell's run (rich markup, values escaped)."""
    from rich.markup import escape

    name = escape(cell.name)
    if line["status"] != "ok":
        return f"[red]failed[/red] {name} ({line['seconds']:.0f} s): {escape(line['error'])}"
    summary = line["summary"]
    figures = (f"ARI {summary['ari']:.3f}, accuracy {summary['personalized_accuracy']:.4f}, "
               f"{summary['num_clusters_found']} clusters")
    if SAME_RUN_AS in line:
        source = escape(same_runs.cells[line[SAME_RUN_AS]].name)
        return f"ok {name}: {figures} (the same run as {source}: recorded from it, not run)"
    return f"ok {name}: {figures} ({line['seconds']:.0f} s)"


def pending_cells(
    sweep: Sweep,
    runs: list[dict[str, Any]],
    retry_failed: bool,
    only: Mapping[str, set[str]] | None = None,
) -> list[Cell]:
    """The cells without a current run: none recorded, or a stale one (a setting it
    used has another value now, or the run it repeats was run again:
    :func:`fl_clusters.sweep.twins.line_changes`), or with ``retry_failed`` a failed one.

    ``only`` (axis -> labels, :func:`fl_clusters.sweep.spec.parse_only`) keeps the
    cells with one of the labels on each axis it names.
    """
    latest = latest_by_key(runs)
    cells = {cell.key: cell for cell in sweep.cells}

    def current(cell: Cell) -> bool:
        line = latest.get(cell.key)
        return (line is not None and not (retry_failed and line["status"] != "ok")
                and not line_changes(cell, line, latest, cells))

    return [cell for cell in sweep.cells
            if not current(cell) and cell.selected_by(only or {})]


def check_resources(
    sweep: Sweep, federation: Mapping[str, int | float], resources: Mapping[str, float]
) -> None:
    """Refuse a federation whose clients ask for more than this machine's Ray has."""
    from fl_clusters.sweep.spec import SweepFileError

    for key, resource in (("client-resources-num-cpus", "CPU"),
                          ("client-resources-num-gpus", "GPU")):
        wanted = float(federation[key])
        if wanted > resources.get(resource, 0.0):
            raise SweepFileError(
                f"{sweep.path}: [federation] {key} = {wanted:g}, but Ray sees "
                f"{resources.get(resource, 0.0):g} {resource}(s) here; lower it"
            )


def run_sweep(
    sweep: Sweep,
    out: Path | None = None,
    retry_failed: bool = False,
    command: list[str] | None = None,
    console: Any = None,
    only: Mapping[str, set[str]] | None = None,
    stop_after_s: float | None = None,
) -> Path:
    """Run every cell of ``sweep`` not recorded yet, then write the table and plots.

    Parameters
    ----------
    sweep : Sweep
        The checked sweep (:func:`fl_clusters.sweep.spec.load_sweep`).
    out : Path | None
        The sweep's folder; ``results/sweeps/NAME`` by default.
    retry_failed : bool
        Run cells whose recorded run failed again.
    command : list[str] | None
        The command line, for the manifest (``sys.argv`` by default).
    console : rich.console.Console | None
        Where the progress bar and one line per run go (standard error by default).
    only : Mapping[str, set[str]] | None
        Run only the cells with one of these labels on each named axis
        (:func:`fl_clusters.sweep.spec.parse_only`); the table still lists every cell.
    stop_after_s : float | None
        Start no run once this many seconds have passed since the first one
        started; the run under way finishes and is recorded, and the same command
        later runs the rest (a batch job's time limit, a machine lent for a while).

    Returns
    -------
    Path
        The sweep's folder.
    """
    from rich.console import Console

    from fl_clusters.sweep.report import write_report

    folder = sweep_folder(sweep, out)
    folder.mkdir(parents=True, exist_ok=True)
    with sweep_folder_lock(folder):
        runs = read_runs(folder / RUNS_FILE)
        todo = pending_cells(sweep, runs, retry_failed, only)
        same_runs = SameRuns(sweep)
        planned = same_runs.plan(todo, latest_by_key(runs))
        console = console or Console(file=sys.stderr)
        _record_session(sweep, folder, command if command is not None else sys.argv)
        console.print(_opening_line(sweep, runs, todo, len(planned), retry_failed, only, folder),
                      markup=False, soft_wrap=True)
        if todo:
            # The cells that repeat another's run last: by then that run is recorded.
            ordered = ([cell for cell in todo if cell.key not in planned]
                       + [cell for cell in todo if cell.key in planned])
            _run_cells(sweep, ordered, folder, runs, console, stop_after_s, same_runs)
        write_report(sweep, runs, folder, plots=True)
        console.print(f"table: {folder / 'table.md'}", markup=False)
    return folder


def _opening_line(
    sweep: Sweep, runs: list[dict[str, Any]], todo: list[Cell], repeats: int,
    retry_failed: bool, only: Mapping[str, set[str]] | None, folder: Path,
) -> str:
    """What the sweep has recorded and will run (:func:`run_sweep`'s first line);
    ``repeats``: the cells of ``todo`` recorded from another cell's run."""
    unrecorded = len(pending_cells(sweep, runs, retry_failed))
    # Failed runs count as recorded: a run that fails for a reason of its own
    # (a timeout, a bad setting) fails again; say how to run them anyway.
    failed = 0 if retry_failed else len(pending_cells(sweep, runs, True)) - unrecorded
    return (
        f"sweep {sweep.name}: {len(sweep.cells)} cells, {len(sweep.cells) - unrecorded} recorded"
        + (f" ({failed} failed; --retry-failed runs them again)" if failed else "")
        + f", {len(todo)} to run{' (--only)' if only else ''}"
        + (f" ({repeats} the same run as another cell: recorded from its run)"
           if repeats else "")
        + f"; results in {folder}"
    )


def _record_session(sweep: Sweep, folder: Path, command: list[str]) -> None:
    """Keep the sweep file's text and this session's entry in the manifest."""
    (folder / SWEEP_COPY).write_text(sweep.text)
    append_session(
        folder / MANIFEST_FILE, sweep.name,
        session_entry(command, sweep.path, hashlib.sha256(sweep.text.encode()).hexdigest()),
    )


class _Ray(contextlib.ExitStack):
    """The sweep's Ray session and kept actors, started on the first run that needs them:
    a session that only records repeated runs starts no Ray."""

    def __init__(self, sweep: Sweep) -> None:
        super().__init__()
        self._sweep = sweep
        self.session: RaySession | None = None
        self.federation: dict[str, int | float] = {}

    def start(self) -> RaySession:
        """The running session (started, and the federation checked, on first call)."""
        if self.session is None:
            session = self.enter_context(RaySession())
            self.enter_context(actors_kept_between_runs())
            self.federation = resolve_federation(self._sweep.federation, session.resources)
            check_resources(self._sweep, self.federation, session.resources)
            self.session = session
        return self.session


def _run_cells(
    sweep: Sweep, todo: list[Cell], folder: Path, runs: list[dict[str, Any]], console: Any,
    stop_after_s: float | None, same_runs: SameRuns,
) -> None:
    """Run ``todo`` on one Ray session, each run appended to ``runs`` and runs.jsonl
    (:func:`run_sweep`); a cell whose run another cell recorded is recorded from it
    (:meth:`SameRuns.twin_line`), even past ``stop_after_s``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from fl_clusters.sweep.report import write_report

    runs_path = folder / RUNS_FILE
    commit = git_state()
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
    )
    with _Ray(sweep) as ray, Progress(*columns, console=console) as progress:
        task = progress.add_task(sweep.name, total=len(todo))
        started: float | None = None  # when the first run started
        not_started = 0
        for cell in todo:
            source = same_runs.source_line(cell, latest_by_key(runs))
            if (source is None and stop_after_s is not None and started is not None
                    and time.monotonic() - started >= stop_after_s):
                not_started += 1
                continue
            progress.update(task, description=cell.name)
            if source is not None:
                line = same_runs.twin_line(cell, source, utc_now())
            else:
                session = ray.start()
                started = time.monotonic() if started is None else started
                line = run_cell(cell, sweep, folder, session.node_id, commit, ray.federation)
            append_run(runs_path, line)
            runs.append(line)
            progress.console.print(_progress_line(line, cell, same_runs), soft_wrap=True)
            progress.advance(task)
            write_report(sweep, runs, folder, plots=False)
        if not_started and stop_after_s is not None:
            progress.console.print(
                f"stopped after {stop_after_s / 60:g} min (--stop-after): "
                f"{not_started} of {len(todo)} runs not started; the same "
                "command runs them", markup=False, soft_wrap=True,
            )
