"""Files written whole or not at all, and their SHA-256 to check them when read back.

JSON is written strictly (:func:`strict_json`): what other tools read back.

A results folder's checkpoint and models are replaced atomically: the new content
goes to a temporary file in the same folder, is flushed to disk, and only then
takes the final name (``os.replace``). A process killed at any moment leaves the
previous file or the new one, never a mix; a temporary file it leaves behind has
a name no reader opens, and carries its writer's process id, so that the next
write to the same file removes it once that process is gone.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1 << 20


@contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the block ends without an error.

    If the block raises, ``path`` is left as it was and the temporary file is
    removed. Temporary files of ``path`` that killed writers left are removed
    first (:func:`remove_dead_partials`).

    Parameters
    ----------
    path : Path
        The file to write; its folder is created if missing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_partials(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with partial.open("wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    # The rename itself reaches the disk only with the folder's entry.
    if hasattr(os, "O_DIRECTORY"):
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def remove_dead_partials(path: Path) -> None:
    """Remove the temporary files of ``path`` whose writer is no longer running.

    A writer killed mid-write (:func:`atomic_output`) leaves
    ``.<name>.<pid>.partial``; one whose process is still alive is another
    writer's file in progress, and is kept. The process ids are this machine's.
    Only a writer calls it, on the folder it writes: a reader changes nothing in
    the folder it reads (a resumed run's may be read-only, or another run's).
    """
    for partial in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
        pid = partial.name[len(path.name) + 2:-len(".partial")]
        if pid.isdigit() and not _running(int(pid)):
            partial.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts: it is gone only once reaped)."""
    if os.name != "posix":
        return True  # os.kill would end the process there, not probe it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path``, as hex."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_none(item) for item in value]
    return value


def strict_json(value: Any, indent: int | None = None) -> str:
    """Standard JSON: an undefined metric (NaN, e.g. inter-cluster accuracy with one
    group) becomes ``null`` instead of the non-standard ``NaN`` token."""
    return json.dumps(_finite_or_none(value), indent=indent, allow_nan=False)
