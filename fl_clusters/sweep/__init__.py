"""Sweeps: a grid of runs from one TOML file, run in one process and kept traceable.

- :mod:`~fl_clusters.sweep.spec`: read and check a sweep file, expand its cells.
- :mod:`~fl_clusters.sweep.runner`: run the cells on one Ray session, resumably.
- :mod:`~fl_clusters.sweep.report`: the table (CSV, Markdown) and plots.
- :mod:`~fl_clusters.sweep.twins`: a cell whose run another cell makes (both presets
  of a strategy that reads neither), recorded from that run.
- :mod:`~fl_clusters.sweep.merge`: a folder of the same sweep from another machine.
- :mod:`~fl_clusters.sweep.lock`: one sweep at a time writes a sweep's folder.
- :mod:`~fl_clusters.sweep.provenance`: commit, machine and versions of every run.
- :mod:`~fl_clusters.sweep.cli`: ``fl-clusters sweep`` and ``python -m fl_clusters.sweep``.

docs/sweeps.md describes the file format and what a sweep writes.
"""

from fl_clusters.sweep.cells import Cell, Sweep
from fl_clusters.sweep.runner import run_sweep
from fl_clusters.sweep.spec import SweepFileError, load_sweep, parse_sweep

__all__ = ["Cell", "Sweep", "SweepFileError", "load_sweep", "parse_sweep", "run_sweep"]
