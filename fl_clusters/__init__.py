"""fl-clusters: clustered federated learning strategies for Flower."""

__version__ = "0.1.0"

from fl_clusters.adapter import ClusteredClient

__all__ = ["ClusteredClient"]
