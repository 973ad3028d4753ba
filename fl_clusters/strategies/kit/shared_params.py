"""The constructor arguments several strategies take, each declared once.

Keys that fl-clusters' run config shares with its data and FedAvg
(fraction-train, fraction-evaluate, seed, min-nodes, num-clusters) are named
explicitly; the run config (fl_clusters/config.py) lists them among its own keys.
"""

from __future__ import annotations

from typing import Any

from fl_clusters.strategies.kit.params import Param
from fl_clusters.strategies.kit.presets import PRESETS

# 0 would sample no one: every round a failed one, the run stopping without a word
# of which setting caused it.
FRACTION_TRAIN = Param("fraction_train", 1.0, "float", "clients sampled a round",
                       above=0.0, high=1.0, key="fraction-train")
FRACTION_EVALUATE = Param(
    "fraction_evaluate", 1.0, "float",
    "clients evaluated a round (0 = none; in your own ServerApp the last round evaluates "
    "every client)",
    low=0.0, high=1.0, key="fraction-evaluate",
)
MIN_AVAILABLE_NODES = Param(
    "min_available_nodes", 2, "int",
    "the fewest connected nodes a round needs (fl-clusters' ServerApp waits for them "
    "before round 1)", low=1, key="min-nodes",
)
MAX_FAILED_ROUNDS = Param(
    "max_failed_rounds", 3, "int",
    "stop the run after this many training rounds in a row without a valid reply", low=1,
    key="max-failed-rounds",
)
# numpy's legacy generators (and so scikit-learn's k-means) take seeds below 2**32.
SEED = Param("seed", 0, "int", "seed of data partition, init and sampling", low=0,
             high=2**32 - 1, key="seed")
# AWCFL and MCFL (Li and Yan 2023) apply to every strategy that puts each node
# in one cluster.
INTER_CLUSTER = (
    Param("awcfl_beta", 0.0, "float", "AWCFL inter-cluster mixing", low=0.0, high=1.0,
          key="awcfl-beta"),
    Param("mcfl", False, "bool", "MCFL: clients pick a cluster model by feature mean",
          key="mcfl"),
    Param("mcfl_feature_samples", 32, "int", "MCFL inputs averaged per client", low=1,
          key="mcfl-feature-samples"),
)


def num_clusters_param(default: Any, low: int = 1) -> Param:
    """The ``num_clusters`` argument (run-config key ``num-clusters``) with its default."""
    return Param("num_clusters", default, "int",
                 "k, the number of cluster models (a mixture's components)", low=low,
                 key="num-clusters")


PRESET = Param(
    "preset", "robust", "str",
    "'robust' defaults, or 'paper': the algorithm as published (docs/paper-fidelity.md)",
    choices=PRESETS, key="preset",
)
