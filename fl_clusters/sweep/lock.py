"""One writer per sweep folder: the lock a sweep holds on its folder while it writes.

Two sweeps writing one folder find each other's run folders and fail every run
(and record them failed). While a sweep runs, merges or rewrites its report, its
folder holds :data:`LOCK_FILE`: an exclusive ``flock`` on it, and in it, JSON
naming the holder (PID, host, start time, command). The kernel drops the
``flock`` when the holder dies however it dies, so a file that can be locked but
still names a holder is one a dead sweep left: it is taken over with a warning.
A lock file written on another host is not taken over (a network file system may
lock per host only): the message says to delete it once that sweep has stopped.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fl_clusters.sweep.provenance import utc_now

LOCK_FILE = "sweep.lock"


class SweepFolderInUse(RuntimeError):
    """Another sweep holds the folder's lock (or a lock written on another host)."""


def _holder_text(holder: dict[str, Any]) -> str:
    """``PID 123 on host h, started 2026-01-01T00:00:00+00:00 (command)``."""
    command = " ".join(holder.get("command") or [])
    return (f"PID {holder.get('pid')} on host {holder.get('host')}, started "
            f"{holder.get('started')}" + (f" ({command})" if command else ""))


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The JSON in the lock file; ``None`` when it is empty or cut off."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        holder = json.loads(data)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _open_locked(path: Path) -> tuple[int, dict[str, Any] | None]:
    """Open ``path`` and hold its ``flock``; the descriptor and what the file held.

    A holder that finishes removes the file while it still holds the lock, so a
    lock won on a file no longer at ``path`` is let go and ``path`` opened again.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            running = ("a sweep that is starting" if holder is None
                       else f"the sweep of {_holder_text(holder)}")
            raise SweepFolderInUse(
                f"{path.parent}: {running} is writing it; wait for it to end or stop "
                "it, or give this one another --out"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd, _read_holder(fd)
        os.close(fd)


@contextmanager
def sweep_folder_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock for the ``with`` block; released on any exit.

    Parameters
    ----------
    folder : Path
        The sweep's folder; it must exist.

    Raises
    ------
    SweepFolderInUse
        Another process holds the lock, or the file names a holder on another
        host: one line naming that sweep's PID, host and start time.
    """
    path = folder / LOCK_FILE
    fd, left = _open_locked(path)
    try:
        host = socket.gethostname()
        if left is not None and left.get("host") != host:
            raise SweepFolderInUse(
                f"{path} names the sweep of {_holder_text(left)}, another machine's; "
                "delete the file once that sweep has stopped"
            )
        if left is not None:
            log(WARNING, "%s: the sweep of %s ended without releasing it (it is not "
                "running any more); this sweep takes it over", path, _holder_text(left))
        record = {"pid": os.getpid(), "host": host, "started": utc_now(),
                  "command": sys.argv}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        # Removed while still locked: a sweep waiting on this file finds it gone.
        path.unlink(missing_ok=True)
        os.close(fd)
