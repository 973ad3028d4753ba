"""``python -m fl_clusters.sweep FILE.toml``: run a sweep file (docs/sweeps.md)."""

import sys

from fl_clusters.sweep.cli import sweep_main

sys.exit(sweep_main())
