"""Give the recorded runs of sweep folders the keys :func:`cell_key` gives them now.

A cell's key once hashed its full run config, defaults included; it now hashes the
run-config keys the sweep file sets and the federation (docs/sweeps.md, "Keys and
resuming"). Every line of ``runs.jsonl`` records both (``run_config``,
``federation``), so its key is computed from the line itself, with nothing run
again: this rewrites each line's ``key``, ``log`` and ``results_folder`` and renames
the run's ``runs/KEY/`` folder and ``logs/KEY.log`` where the folder has them
(benchmarks/measured/sweeps/ keeps neither). A line already under its key is left
as it is, so running this twice changes nothing the second time.

    python benchmarks/rekey_sweeps.py [FOLDER ...]

FOLDER is a sweep's folder (``results/sweeps/NAME``); by default every folder
under benchmarks/measured/sweeps/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fl_clusters.sweep.cells import cell_key
from fl_clusters.sweep.runner import LOGS_FOLDER, RUNS_FILE, RUNS_FOLDER, read_runs

MEASURED_SWEEPS = Path(__file__).resolve().parent / "measured" / "sweeps"


def _rekeyed(line: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``line`` under its key of today, its run folder and log renamed to match."""
    old, new = line["key"], cell_key(line["run_config"], line["federation"])
    if old == new:
        return line
    for kind, field, name in ((RUNS_FOLDER, "results_folder", "{}"),
                              (LOGS_FOLDER, "log", "{}.log")):
        before, after = Path(kind, name.format(old)), Path(kind, name.format(new))
        if (folder / before).exists():
            (folder / before).rename(folder / after)
        if line.get(field):
            line[field] = line[field].replace(str(before), str(after), 1)
    return {**line, "key": new}


def rekey(folder: Path) -> int:
    """Rewrite ``folder/runs.jsonl`` (atomically) under today's keys; lines changed."""
    runs = read_runs(folder / RUNS_FILE)
    lines = [_rekeyed(dict(line), folder) for line in runs]
    changed = sum(old["key"] != new["key"] for old, new in zip(runs, lines, strict=True))
    if changed:
        partial = folder / f"{RUNS_FILE}.partial"
        partial.write_text("".join(json.dumps(line, allow_nan=False) + "\n" for line in lines))
        os.replace(partial, folder / RUNS_FILE)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Rekey each folder named (every measured sweep by default); say what changed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path,
                        help="sweep folders (default: benchmarks/measured/sweeps/*)")
    args = parser.parse_args(argv)
    folders = args.folders or sorted(p for p in MEASURED_SWEEPS.iterdir() if p.is_dir())
    for folder in folders:
        if not (folder / RUNS_FILE).is_file():
            print(f"{folder}: no {RUNS_FILE}; name a sweep's folder", file=sys.stderr)
            return 2
        print(f"{folder}: {rekey(folder)} of {len(read_runs(folder / RUNS_FILE))} lines rekeyed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
