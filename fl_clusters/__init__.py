"""fl-clusters: clustered federated learning strategies for Flower."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["ClusteredClient"]

if TYPE_CHECKING:
    from fl_clusters.adapter import ClusteredClient


def __getattr__(name: str) -> object:
    # Imported on first use, not with the package: `flwr run` resolves the app
    # components ("fl_clusters.apps:server_app") with importlib's find_spec, which
    # imports this package, and the adapter's imports (torch, scikit-learn) would
    # delay every `flwr run` before it even starts the SuperLink.
    if name == "ClusteredClient":
        from fl_clusters.adapter import ClusteredClient

        return ClusteredClient
    raise AttributeError(f"module 'fl_clusters' has no attribute {name!r}")
