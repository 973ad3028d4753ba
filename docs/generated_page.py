"""Write a generated page, or check that it is up to date (the generators' ``--check``)."""

from __future__ import annotations

import sys
from pathlib import Path

from fl_clusters.files import atomic_output


def write_or_check(path: Path, text: str, *, check: bool, command: str) -> int:
    """Write ``text`` to ``path``; with ``check``, only compare. The exit status.

    ``command`` is what the user runs to bring the page up to date (named when a
    check finds it out of date).
    """
    name = path.relative_to(path.parents[1])
    if check:
        if path.read_text() != text:
            print(f"{name} is out of date; run: {command}", file=sys.stderr)
            return 1
        return 0
    with atomic_output(path) as out:
        out.write(text.encode())
    print(f"wrote {path}")
    return 0
