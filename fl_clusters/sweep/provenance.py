"""Where a sweep's numbers come from: code version, machine, software, command.

Every invocation of a sweep appends one entry to ``manifest.json`` beside
``runs.jsonl``, and every run's line carries the commit it ran on, so a number in
the table can be traced to the code, the machine and the command that made it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# The checkout that holds the fl_clusters package being run.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
VERSIONED_PACKAGES = ("fl-clusters", "flwr", "torch", "ray", "numpy", "scikit-learn")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(SOURCE_ROOT), *args],
            capture_output=True, text=True, check=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state() -> dict[str, Any]:
    """The commit of the running code and whether tracked files differ from it.

    ``commit`` is ``None`` outside a git checkout (an installed wheel); ``dirty``
    counts tracked files only (results folders and new scratch files are no change
    to the code that ran).
    """
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


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
        "date": utc_now(),
        "cores": os.cpu_count(),
        "gpu": gpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "versions": {package: _version(package) for package in VERSIONED_PACKAGES},
    }


def append_session(manifest: Path, sweep_name: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` to ``manifest`` (created with the sweep's name on first use)."""
    document = (
        json.loads(manifest.read_text()) if manifest.exists()
        else {"sweep": sweep_name, "sessions": []}
    )
    document["sessions"].append(entry)
    manifest.write_text(json.dumps(document, indent=2) + "\n")
