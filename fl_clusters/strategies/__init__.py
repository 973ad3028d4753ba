"""Clustered federated learning strategies (Flower Message API)."""

from fl_clusters.strategies.acfl import ACFL
from fl_clusters.strategies.cfl import CFL
from fl_clusters.strategies.fedem import FedEM
from fl_clusters.strategies.fedsoft import FedSoft
from fl_clusters.strategies.fldc import FLDC
from fl_clusters.strategies.flhc import FLHC
from fl_clusters.strategies.ifca import IFCA
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.results import cluster_models
from fl_clusters.strategies.local import LocalOnly
from fl_clusters.strategies.wecfl import WeCFL

__all__ = [
    "ACFL",
    "CFL",
    "FLDC",
    "FLHC",
    "IFCA",
    "ClusteredStrategy",
    "FedEM",
    "FedSoft",
    "LocalOnly",
    "WeCFL",
    "cluster_models",
]
