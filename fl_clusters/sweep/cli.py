"""``fl-clusters sweep FILE.toml`` runs a sweep file (the command: :mod:`fl_clusters.cli`).

``python -m fl_clusters.sweep FILE.toml`` is the same command without the
``sweep`` word. docs/sweeps.md describes the file and what a sweep writes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from fl_clusters.sweep.cells import Sweep
from fl_clusters.sweep.lock import SweepFolderInUse, sweep_folder_lock
from fl_clusters.sweep.runner import (
    RUNS_FILE,
    pending_cells,
    read_runs,
    run_sweep,
    sweep_folder,
)
from fl_clusters.sweep.spec import SweepFileError, load_sweep, parse_only
from fl_clusters.sweep.twins import SAME_RUN_AS, SameRuns, latest_by_key

# Runs to do above which a sweep starts only with --yes.
LARGE_SWEEP_RUNS = 1000


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep command's arguments, on ``parser``."""
    parser.add_argument("file", type=Path, help="the sweep file (TOML; docs/sweeps.md)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="the sweep's folder (default: results/sweeps/NAME under the current folder)",
    )
    parser.add_argument(
        "--retry-failed", action="store_true",
        help="run the cells whose recorded run failed again (they are skipped by default)",
    )
    parser.add_argument(
        "--only", action="append", default=[], metavar="AXIS=LABEL[,LABEL...]",
        help="run only the cells with one of these labels on this axis (repeatable, "
             "e.g. --only model=mlp --only seed=1,2); the table still lists every cell",
    )
    parser.add_argument(
        "--stop-after", type=_minutes, default=None, metavar="MINUTES",
        help="start no run after this many minutes; the run under way finishes, and "
             "the same command later runs the rest",
    )
    parser.add_argument(
        "--yes", action="store_true",
        help=f"start even when more than {LARGE_SWEEP_RUNS} runs are to do (without it such "
             "a sweep names its size and stops)",
    )
    parser.add_argument(
        "--dry-run", action="store_true",
        help="check the file and list its cells, recorded or not; run nothing",
    )
    parser.add_argument(
        "--report", action="store_true",
        help="only rewrite the table and plots from runs.jsonl",
    )
    parser.add_argument(
        "--merge", action="append", default=[], type=Path, metavar="FOLDER",
        help="add the runs another machine wrote for this sweep (its --out folder) to "
             "this sweep's folder, then rewrite the table and plots; run nothing",
    )


def _minutes(text: str) -> float:
    """``--stop-after``'s value: minutes > 0."""
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes > 0, e.g. 90")
    return minutes


def sweep_command(args: argparse.Namespace) -> int:
    """Run (or check, or report) the sweep ``args.file``; the exit status."""
    from rich.console import Console

    console = Console(file=sys.stderr)
    try:
        sweep = load_sweep(args.file)
    except SweepFileError as err:
        return _refuse(console, "bad sweep file", err)
    try:
        only = parse_only(sweep, args.only)
    except SweepFileError as err:
        return _refuse(console, "bad --only", err)
    folder = sweep_folder(sweep, args.out)
    if args.dry_run:
        _dry_run(sweep, folder, args.retry_failed, only)
        return 0
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return _refuse(console, "cannot write the sweep's folder",
                       f"{folder}: {err.strerror or err}; name a folder you can write with --out")
    runs = read_runs(folder / RUNS_FILE)
    recorded = len(runs)
    if not (args.yes or args.merge or args.report):
        size = _size_problem(runs, len(pending_cells(sweep, runs, args.retry_failed, only)))
        if size is not None:
            return _refuse(console, "large sweep", size)
    try:
        if args.merge:
            return _merge(sweep, folder, args.merge, console)
        if args.report:
            _report(sweep, folder)
            return 0
        run_sweep(sweep, args.out, args.retry_failed, command=sys.argv, console=console,
                  only=only,
                  stop_after_s=None if args.stop_after is None else args.stop_after * 60)
    except SweepFileError as err:
        return _refuse(console, "bad sweep file", err)
    except SweepFolderInUse as err:
        return _refuse(console, "sweep folder in use", err)
    return _failed_runs_status(console, read_runs(folder / RUNS_FILE)[recorded:])


def _size_problem(runs: list[dict[str, Any]], to_do: int) -> str | None:
    """Why a sweep of ``to_do`` runs should not start unasked, or ``None`` when it may.

    A grid's axes multiply: one axis too many turns a morning's sweep into weeks,
    and the first word of that should come before the first run, not after.
    """
    if to_do <= LARGE_SWEEP_RUNS:
        return None
    seconds = [float(r["seconds"]) for r in runs if isinstance(r.get("seconds"), int | float)]
    took = (f"at the {statistics.median(seconds):.0f} s its recorded runs took, about "
            f"{to_do * statistics.median(seconds) / 3600:,.0f} h on this machine"
            if seconds else "none of its runs is recorded yet to time it")
    return (f"{to_do:,} runs to do ({took}); --dry-run lists them, --only and --stop-after "
            f"run a part, and --yes starts all of them")


def _dry_run(
    sweep: Sweep, folder: Path, retry_failed: bool, only: dict[str, set[str]]
) -> None:
    """``--dry-run``: each cell's key, state and name, then the counts.

    A cell to run whose run another cell makes (:mod:`fl_clusters.sweep.twins`) is
    listed as ``same run as KEY``; a recorded one as ``recorded (same run as KEY)``.
    """
    runs = read_runs(folder / RUNS_FILE)
    latest = latest_by_key(runs)
    todo = pending_cells(sweep, runs, retry_failed, only)
    planned = SameRuns(sweep).plan(todo, latest)
    to_run = {cell.key for cell in todo}
    unrecorded = {cell.key for cell in pending_cells(sweep, runs, retry_failed)}
    for cell in sweep.cells:
        repeats = latest.get(cell.key, {}).get(SAME_RUN_AS)
        state = (f"same run as {planned[cell.key]}" if cell.key in planned
                 else "to run  " if cell.key in to_run
                 else "left out" if cell.key in unrecorded
                 else f"recorded (same run as {repeats})" if repeats else "recorded")
        print(f"{cell.key}  {state}  {cell.name}")
    print(f"{len(sweep.cells)} cells, {len(todo)} to run"
          + (f" ({len(planned)} the same run as another cell: recorded from its run, "
             f"{len(todo) - len(planned)} run)" if planned else "")
          + f"; results in {folder}")


def _failed_runs_status(console: Any, ran: list[dict[str, Any]]) -> int:
    """The exit status after running ``ran`` (their lines): 1, said in one line, if one failed.

    A failed run is recorded and skipped by the next plain start, so a script that
    runs the sweep must learn it from the exit status.
    """
    failed = [line for line in ran if line["status"] != "ok"]
    if not failed:
        return 0
    console.print(
        f"{len(failed)} of {len(ran)} runs failed (their logs: "
        f"{', '.join(line['log'] for line in failed[:3])}{' ...' if len(failed) > 3 else ''}); "
        "--retry-failed runs them again", markup=False, soft_wrap=True, highlight=False,
    )
    return 1


def _report(sweep: Sweep, folder: Path) -> None:
    """``--report``: rewrite the table and plots, holding the folder's lock."""
    from fl_clusters.sweep.report import write_report

    folder.mkdir(parents=True, exist_ok=True)
    with sweep_folder_lock(folder):
        for path in write_report(sweep, read_runs(folder / RUNS_FILE), folder):
            print(path)


def _refuse(console: Any, what: str, error: Exception) -> int:
    """Print ``what`` and the error on one line; the command's exit status 2."""
    from rich.markup import escape

    console.print(f"[red]{what}[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
    return 2


def _merge(sweep: Sweep, folder: Path, others: list[Path], console: Any) -> int:
    """``--merge``: add each folder's runs, say what was kept out, rewrite the report.

    The folder's lock is held throughout, as a sweep holds it.
    """
    from fl_clusters.sweep.merge import MergeError, merge_runs
    from fl_clusters.sweep.report import write_report

    folder.mkdir(parents=True, exist_ok=True)
    with sweep_folder_lock(folder):
        for other in others:
            try:
                result = merge_runs(sweep, folder, other)
            except MergeError as err:
                return _refuse(console, "cannot merge", err)
            print(f"{other}: {len(result.added)} runs added, {len(result.already_recorded)} "
                  f"already recorded here, {len(result.not_in_sweep)} not cells of "
                  f"{sweep.path} (left out)")
            if result.not_in_sweep:
                print("  left out: " + ", ".join(result.not_in_sweep))
            if result.repeat_other_runs:
                print("  left out, the same run as a cell this folder holds another run of "
                      "(the next sweep records them from it): "
                      + ", ".join(result.repeat_other_runs))
        write_report(sweep, read_runs(folder / RUNS_FILE), folder)
    print(f"table: {folder / 'table.md'}")
    return 0


def sweep_main(argv: list[str] | None = None) -> int:
    """``python -m fl_clusters.sweep FILE.toml [options]``."""
    parser = argparse.ArgumentParser(
        prog="python -m fl_clusters.sweep", description="Run a sweep file (docs/sweeps.md)."
    )
    add_sweep_arguments(parser)
    return sweep_command(parser.parse_args(argv))
