"""Measuring a benchmark's processes: peak memory of a process tree, a target in a fresh one.

:class:`TreeMemory` samples the summed RSS of a process and its descendants from
/proc; :func:`maxrss_mb` reads ``getrusage``'s maxrss; :func:`in_fresh_process`
runs a target in a spawned process and returns what it sends back, with the
clock it started on and the tree's peak memory (benchmarks/overhead.py,
benchmarks/scale.py).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

MEMORY_PERIOD_S = 0.5
PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20


class TreeMemory:
    """Peak summed RSS (MB) of a process and all its descendants, sampled from /proc.

    Parameters
    ----------
    root : int
        PID of the tree's root.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(MEMORY_PERIOD_S):
            self.peak_mb = max(self.peak_mb, self.sample_mb())

    def sample_mb(self) -> float:
        """Summed RSS of the tree now."""
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # the process ended while we looked
                continue
            # Fields after the command name, which may hold spaces: ppid is the 2nd, rss the 22nd.
            fields = stat.rsplit(")", 1)[1].split()
            pid = int(entry.name)
            children.setdefault(int(fields[1]), []).append(pid)
            rss[pid] = int(fields[21])
        total, stack = 0, [self.root]
        while stack:
            pid = stack.pop()
            total += rss.get(pid, 0)
            stack.extend(children.get(pid, []))
        return total * PAGE_MB


def maxrss_mb(usage: resource.struct_rusage) -> float:
    """``usage``'s peak resident set size in MB."""
    return usage.ru_maxrss / 1024  # Linux reports KiB


def in_fresh_process(
    target: Callable[..., None], *args: Any
) -> tuple[dict[str, Any], float, float]:
    """Run ``target(*args, t0, conn)`` in a spawned process; its result and where it ran.

    ``target`` sends one dict through ``conn``. Returns that dict, ``t0`` (the
    monotonic time just before the process started: the clock is the same for all
    processes) and the peak summed RSS (MB) of the process and its descendants.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    t0 = time.monotonic()
    proc = context.Process(target=target, args=(*args, t0, send))
    proc.start()
    send.close()
    with TreeMemory(proc.pid) as memory:
        try:
            result = receive.recv()
        except EOFError:
            proc.join()
            raise RuntimeError(f"{target.__name__} exited {proc.exitcode} (see above)") from None
    proc.join()
    return result, t0, memory.peak_mb
