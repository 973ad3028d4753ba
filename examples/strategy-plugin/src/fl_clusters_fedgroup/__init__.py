"""FedGroup for fl-clusters, from its own package: ``strategy = "fedgroup"`` in a run config.

The entry point ``fedgroup`` of the group ``fl_clusters.strategies`` (pyproject.toml)
registers :class:`FedGroup` with fl-clusters once this package is installed.
"""

from fl_clusters_fedgroup.fedgroup import FedGroup

__all__ = ["FedGroup"]
