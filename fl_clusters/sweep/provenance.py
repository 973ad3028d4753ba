"""Where a measured number comes from: code version, machine, software, command.

Every invocation of a sweep appends one entry to ``manifest.json`` beside
``runs.jsonl``, and every run's line carries the commit it ran on, so a number in
the table can be traced to the code, the machine and the command that made it.
Every other file a benchmark writes under ``benchmarks/measured/`` carries the same
facts as its top-level ``"provenance"`` record (:func:`measurement_provenance`);
:func:`measured_folder_problems` lists the files of such a folder that lack them.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# The checkout that holds the fl_clusters package being run.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
VERSIONED_PACKAGES = ("fl-clusters", "flwr", "torch", "ray", "numpy", "scikit-learn")
# What every provenance record names, at least.
REQUIRED_KEYS = ("command", "commit", "date", "cores", "gpu")
# The folder of sweep results inside a measured folder: a sweep's manifest.json and
# runs.jsonl hold its provenance, its other files are outputs.
SWEEPS_FOLDER = "sweeps"
# Where results live: nothing under it is code, whatever its suffix.
MEASURED_FOLDER = "benchmarks/measured/"
# Tracked files whose change is a change of the code that runs (git_state's "dirty").
CODE_SUFFIXES = (".py", ".toml", ".sh", ".cfg", ".txt")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(SOURCE_ROOT), *args],
            capture_output=True, text=True, check=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def changed_code(porcelain: str) -> list[str]:
    """The tracked code files ``git status --porcelain`` lists as changed.

    Code is what decides what a run computes (:data:`CODE_SUFFIXES`); measured
    files, docs and plots that differ from the commit are results, not a change to
    the code that made them: everything under :data:`MEASURED_FOLDER` too (a sweep
    writes its file's copy there as ``sweep.toml``). A renamed file counts under its
    new path.
    """
    paths = (line[3:].split(" -> ")[-1].strip('"') for line in porcelain.splitlines() if line)
    return sorted(path for path in paths
                  if path.endswith(CODE_SUFFIXES) and not path.startswith(MEASURED_FOLDER))


def git_state() -> dict[str, Any]:
    """The commit of the running code and whether tracked code files differ from it.

    ``commit`` is ``None`` outside a git checkout (an installed wheel). ``dirty``
    says whether a tracked code file differs from the commit, ``changed_code``
    lists them (:func:`changed_code`); new untracked files and changed results
    (``runs.jsonl`` of the sweep being resumed, docs) do not count.
    """
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    changed = None if status is None else changed_code(status)
    return {"commit": commit, "dirty": None if changed is None else bool(changed),
            "changed_code": changed}


def gpu_name() -> str | None:
    """The first CUDA device's name, or ``None`` on a machine without one."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def utc_now() -> str:
    """The current time, ISO 8601 in UTC, to the second."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def _machine() -> dict[str, Any]:
    """The date, cores, GPU, platform, interpreter and package versions of this process."""
    return {
        "date": utc_now(),
        "cores": os.cpu_count(),
        "gpu": gpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "versions": {package: _version(package) for package in VERSIONED_PACKAGES},
    }


def session_entry(command: list[str], sweep_file: Path, sweep_text_sha256: str) -> dict[str, Any]:
    """What one invocation of a sweep records about itself.

    Parameters
    ----------
    command : list[str]
        The command line (``sys.argv`` of the sweep command).
    sweep_file : Path
        The sweep file it ran.
    sweep_text_sha256 : str
        Hash of the file's content at that time.
    """
    return {
        "command": command,
        "cwd": os.getcwd(),
        "sweep_file": str(sweep_file),
        "sweep_file_sha256": sweep_text_sha256,
        "git": git_state(),
        **_machine(),
    }


def measurement_provenance(command: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``"provenance"`` record of a file a benchmark script writes.

    Parameters
    ----------
    command : Sequence[str], optional
        The command line that runs the measurement, interpreter first; by default
        this process's (``sys.executable`` and ``sys.argv``).

    Returns
    -------
    dict
        ``command``, ``cwd``, ``commit`` and ``dirty`` (:func:`git_state`), ``date``
        (UTC), ``cores`` (``os.cpu_count()``), ``gpu`` (:func:`gpu_name`),
        ``platform``, ``python``, ``executable`` and the ``versions`` of the
        packages that decide the numbers.
    """
    return {
        "command": [sys.executable, *sys.argv] if command is None else list(command),
        "cwd": os.getcwd(),
        **git_state(),
        **_machine(),
    }


def append_session(manifest: Path, sweep_name: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` to ``manifest`` (created with the sweep's name on first use)."""
    document = (
        json.loads(manifest.read_text()) if manifest.exists()
        else {"sweep": sweep_name, "sessions": []}
    )
    document["sessions"].append(entry)
    manifest.write_text(json.dumps(document, indent=2) + "\n")


def _is_commit(value: Any) -> bool:
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def record_problems(record: Any) -> list[str]:
    """What a provenance record lacks; empty when it is complete.

    A record names :data:`REQUIRED_KEYS`; its commit is a full 40-digit hash, at the
    top level or, as a sweep session records it, in ``git``. A commit or core
    count that is ``null`` needs ``retrofitted.how``, the reason it is not known.
    """
    if not isinstance(record, dict):
        return [f"provenance is a {type(record).__name__}, not an object"]
    git = record.get("git")
    has_commit = "commit" in record or (isinstance(git, dict) and "commit" in git)
    missing = [key for key in REQUIRED_KEYS
               if key not in record and not (key == "commit" and has_commit)]
    if missing:
        return [f"provenance lacks {', '.join(missing)}"]
    problems = []
    retrofitted = record.get("retrofitted")
    reason = retrofitted.get("how") if isinstance(retrofitted, dict) else None
    if retrofitted is not None and not (isinstance(reason, str) and reason.strip()):
        problems.append("retrofitted has no 'how'")
    command = record["command"]
    if not command or not (isinstance(command, str) or (
            isinstance(command, list) and all(isinstance(part, str) for part in command))):
        problems.append(f"command {command!r} is not a command line")
    commit = record["commit"] if "commit" in record else git["commit"]
    if not _is_commit(commit) and not (commit is None and reason):
        problems.append(f"commit {commit!r} is not a 40-digit hash (null needs retrofitted.how)")
    try:
        datetime.fromisoformat(record["date"])
    except (TypeError, ValueError):
        problems.append(f"date {record['date']!r} is not an ISO 8601 date")
    cores = record["cores"]
    if not (isinstance(cores, int) and cores >= 1) and not (cores is None and reason):
        problems.append(f"cores {cores!r} is not a count (null needs retrofitted.how)")
    if not (record["gpu"] is None or isinstance(record["gpu"], str)):
        problems.append(f"gpu {record['gpu']!r} is neither a name nor null")
    return problems


def _sweep_problems(folder: Path) -> list[str]:
    """What a sweep folder's manifest.json sessions and runs.jsonl lines lack."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return ["no manifest.json"]
    sessions = json.loads(manifest.read_text()).get("sessions") or []
    problems = [] if sessions else ["manifest.json has no session"]
    for number, session in enumerate(sessions):
        problems += [f"manifest.json session {number}: {p}" for p in record_problems(session)]
    runs = folder / "runs.jsonl"
    lines = runs.read_text().splitlines(keepends=True) if runs.is_file() else []
    for number, line in enumerate(lines, start=1):
        if not line.endswith("\n"):
            # The line a running sweep is writing, or one a kill cut off: the sweep
            # drops it on resuming.
            continue
        if line.strip() and not _is_commit(json.loads(line).get("git_commit")):
            problems.append(f"runs.jsonl line {number}: no 40-digit git_commit")
    return problems


def measured_folder_problems(folder: Path) -> list[str]:
    """Every file under ``folder`` that does not record where its numbers come from.

    Every ``*.json`` file (in subfolders too) is an object with a complete
    ``"provenance"`` record (:func:`record_problems`); a sweep's folder,
    ``folder/sweeps/NAME/``, has a manifest whose every session is complete and a
    ``runs.jsonl`` whose every line names its commit.

    Returns
    -------
    list[str]
        One line per problem, ``path: what it lacks``; empty when every file is
        complete.
    """
    problems = []
    for path in sorted(folder.rglob("*.json")):
        relative = path.relative_to(folder)
        if relative.parts[0] == SWEEPS_FOLDER:
            continue
        try:
            document = json.loads(path.read_text())
        except ValueError as error:
            problems.append(f"{relative}: not JSON ({error})")
            continue
        if not isinstance(document, dict) or "provenance" not in document:
            problems.append(f"{relative}: no top-level \"provenance\" record")
            continue
        problems += [f"{relative}: {p}" for p in record_problems(document["provenance"])]
    for sweep in sorted(p for p in (folder / SWEEPS_FOLDER).glob("*") if p.is_dir()):
        problems += [f"{sweep.relative_to(folder)}: {p}" for p in _sweep_problems(sweep)]
    return problems
