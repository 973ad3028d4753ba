"""The constructor arguments several strategies take, each declared once.

Keys that fl-clusters' run config shares with its data and FedAvg
(fraction-train, fraction-evaluate, seed, min-nodes, num-clusters) are named
explicitly; the run config (fl_clusters/config.py) lists them among its own keys.
"""

from __future__ import annotations

from typing import Any

from fl_clusters.params import Param
from fl_clusters.strategies.kit.presets import PRESETS

# 0 would sample no one: every round a failed one, the run stopping without a word
# of which setting caused it.
FRACTION_TRAIN = Param("fraction_train", 1.0, "float", "clients sampled a round",
                       above=0.0, high=1.0, key="fraction-train",
                       doc="Fraction of connected nodes sampled for training each round.")
FRACTION_EVALUATE = Param(
    "fraction_evaluate", 1.0, "float",
    "clients evaluated a round (0 = none; in your own ServerApp the last round evaluates "
    "every client)",
    low=0.0, high=1.0, key="fraction-evaluate",
    doc="Fraction of connected nodes sampled for evaluation each round; the last round of "
    "``start`` evaluates every node. 0 evaluates none.",
)
MIN_AVAILABLE_NODES = Param(
    "min_available_nodes", 2, "int",
    "the fewest connected nodes a round needs (fl-clusters' ServerApp waits for them "
    "before round 1)", low=1, key="min-nodes",
    doc="Nodes that must be connected before a round starts.",
)
MAX_FAILED_ROUNDS = Param(
    "max_failed_rounds", 3, "int",
    "stop the run after this many training rounds in a row without a valid reply", low=1,
    key="max-failed-rounds",
    doc="Training rounds in a row without one valid reply after which the run stops with a "
    "``RuntimeError`` that lists the clients' errors, instead of going on (and returning) "
    "with models nobody trained. >= 1.",
)
# numpy's legacy generators (and so scikit-learn's k-means) take seeds below 2**32.
SEED = Param("seed", 0, "int", "seed of data partition, init and sampling", low=0,
             high=2**32 - 1, key="seed",
             doc="Seed of node sampling and of any random initialization.")
# AWCFL and MCFL (Li and Yan 2023) apply to every strategy that puts each node
# in one cluster.
INTER_CLUSTER = (
    Param("awcfl_beta", 0.0, "float", "AWCFL inter-cluster mixing", low=0.0, high=1.0,
          key="awcfl-beta",
          doc="AWCFL inter-cluster weighting (:class:`~fl_clusters.strategies.kit.options."
          "awcfl.AWCFLOption`): cluster k becomes ``beta/(n-1) * sum of the other clusters + "
          "(1-beta) * its own mean``. 0 is plain clustered aggregation."),
    Param("mcfl", False, "bool", "MCFL: clients pick a cluster model by feature mean",
          key="mcfl",
          doc="MCFL (:class:`~fl_clusters.strategies.kit.options.mcfl.MCFLOption`): before "
          "round 1 every node uploads the mean of ``mcfl_feature_samples`` sampled training "
          "inputs; a cluster's feature is the mean over its members' uploads, and at "
          "evaluation a node takes the cluster model whose feature is nearest to the mean of "
          "its test inputs (inputs only: no test label is read for the choice)."),
    Param("mcfl_feature_samples", 32, "int", "MCFL inputs averaged per client", low=1,
          key="mcfl-feature-samples",
          doc="n, the training inputs a node averages into its uploaded feature."),
)


def num_clusters_param(default: Any, low: int = 1, doc: str = "") -> Param:
    """The ``num_clusters`` argument (run-config key ``num-clusters``) with its default.

    ``doc``: what the number is in the declaring algorithm, for its docstring.
    """
    return Param("num_clusters", default, "int",
                 "k, the number of cluster models (a mixture's components)", low=low,
                 key="num-clusters", doc=doc)


PRESET = Param(
    "preset", "robust", "str",
    "'robust' defaults, or 'paper': the algorithm as published (docs/paper-fidelity.md)",
    choices=PRESETS, key="preset",
    doc='``"robust"``: the library\'s defaults and rules. ``"paper"``: every argument whose '
    "default departs from the published algorithm takes the paper's value, except an "
    "argument the caller passes, which is kept (``preset_kept`` in the summary), and every "
    "rule declared as departing runs the paper's (``behaviours``); each is declared with "
    "its reason and source (docs/paper-fidelity.md).",
)
