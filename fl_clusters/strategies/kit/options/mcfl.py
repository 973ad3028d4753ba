"""MCFL's input features, an option of every clustered strategy (Li and Yan 2023).

Before round 1 every node uploads the mean of n sampled training inputs; a
cluster's feature is the mean over its members' uploads, and at evaluation a node
takes the cluster model whose feature is nearest to the mean of its test inputs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import cluster_feature_means
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.behaviours import Behaviour
from fl_clusters.strategies.kit.options.awcfl import SEED_000_RECIPE, SOURCE


def feature_queries(nodes: Iterable[int], num_samples: int) -> dict[int, RecordDict]:
    """The content of the feature query to each of ``nodes``: average ``num_samples`` inputs."""
    config = ConfigRecord({p.CFG_NUM_SAMPLES: num_samples})
    return {node: RecordDict({p.CONFIG: config}) for node in nodes}


def read_features(
    valid: Iterable[Message], known: Mapping[int, np.ndarray]
) -> tuple[dict[int, np.ndarray], int]:
    """The features of the valid replies that are finite vectors of the common length.

    Parameters
    ----------
    valid : Iterable[Message]
        Valid replies to the feature query, in node order.
    known : Mapping[int, np.ndarray]
        The features already kept; their length is the common one (else the
        length most of these replies have: one reply answering first with another
        length must not get every honest one rejected).

    Returns
    -------
    tuple
        ``(features, rejected)``: node id -> feature of the usable replies, and
        the number of replies that were not a usable vector (each logged).
    """
    found: dict[int, np.ndarray] = {}
    rejected = 0
    valid = list(valid)
    features = {m.metadata.src_node_id: np.asarray(
        m.content.metric_records[p.METRICS].get(p.M_FEATURE_MEAN, []), dtype=np.float64)
        for m in valid}
    size = (next(iter(known.values())).size if known
            else _majority_length([f for f in features.values() if f.ndim == 1]))
    for node, feature in features.items():
        if feature.ndim != 1 or feature.size != size or size == 0 or not np.all(
            np.isfinite(feature)
        ):
            rejected += 1
            log(WARNING, "mcfl features: rejected reply from node %d: '%s' is not a "
                "finite vector of length %d", node, p.M_FEATURE_MEAN, size)
            continue
        found[node] = feature
    return found, rejected


def _majority_length(features: list[np.ndarray]) -> int:
    """The length most ``features`` have (ties: the shorter; 0 when there are none)."""
    counts = Counter(f.size for f in features)
    return min(counts, key=lambda size: (-counts[size], size)) if counts else 0


def cluster_features(
    node_features: Mapping[int, np.ndarray], assignments: Mapping[int, int], num_clusters: int
) -> np.ndarray | None:
    """MCFL's cluster features: (k, D) means of the members' uploads, NaN rows for none.

    Members are the nodes' latest clusters (``assignments``); ``None`` when no
    member has a feature.
    """
    members = [
        (node, cluster) for node, cluster in assignments.items()
        if node in node_features and 0 <= cluster < num_clusters
    ]
    if not members:
        return None
    return cluster_feature_means(
        np.stack([node_features[node] for node, _ in members]),
        np.array([cluster for _, cluster in members], dtype=np.int64),
        num_clusters,
    )


class MCFLOption(ClusteredStrategy):
    """MCFL composed into a strategy: the run-config keys ``mcfl`` and ``mcfl-feature-samples``.

    The strategy declares ``INTER_CLUSTER``'s MCFL parameters. With ``mcfl``,
    before round 1 (and when a node joins) every node uploads the mean of
    ``mcfl_feature_samples`` sampled training inputs; a cluster's feature is the
    mean over its members' uploads, and at evaluation a node takes the cluster
    model whose feature is nearest to the mean of its test inputs (inputs only:
    no test label is read for the choice).

    Attributes
    ----------
    node_features : dict[int, np.ndarray]
        Node id -> its uploaded feature.
    """

    mcfl: bool
    mcfl_feature_samples: int
    mcfl_all_test_inputs: bool
    paper_revision = 2
    paper_rules_apply_with = "mcfl"
    behaviours = (
        Behaviour(
            "mcfl_all_test_inputs",
            paper_rule="MCFL (mcfl = true): at evaluation a client averages n sampled test "
            "inputs (n = mcfl_feature_samples, as for its upload) and takes the nearest "
            "cluster feature",
            robust_rule="a client averages all its test inputs",
            why="the mean of every test input is the least noisy estimate of what the "
            "client's data look like; the choice reads no label either way",
            source=f"{SOURCE}, section 3.2: the test set's mean mu over n sampled inputs"),
    )
    recipe = SEED_000_RECIPE

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.node_features: dict[int, np.ndarray] = {}
        self._features_asked: set[int] = set()

    def meet_nodes(self, grid: Grid, nodes: list[int]) -> None:
        """With MCFL, a node not asked before uploads its feature.

        A node that joined after the start uploads it too, so its cluster's
        feature includes it once it has a cluster.
        """
        super().meet_nodes(grid, nodes)
        if self.mcfl:
            self.collect_features(grid, nodes)

    def collect_features(self, grid: Grid, nodes: Iterable[int]) -> None:
        """Ask the nodes whose feature is unknown for their mean training input.

        A node's data does not change, so each node is asked once: one that gave no
        usable feature is not asked (and waited for) again every round. Replies that
        are not a finite vector of the common length are logged and skipped.
        """
        missing = sorted(set(nodes) - self._features_asked)
        if not missing:
            return
        self._features_asked.update(missing)
        queries = feature_queries(missing, self.mcfl_feature_samples)
        replies = self.send(grid, self.build_messages(queries, p.QUERY_FEATURES))
        valid = self.check_replies(replies, None, "mcfl features", trains=False)
        found, rejected = read_features(valid, self.node_features)
        self.node_features.update(found)
        self.rejected_replies += rejected

    def mcfl_cluster_features(self, num_clusters: int) -> np.ndarray | None:
        """MCFL's (k, D) cluster features (:func:`cluster_features`).

        ``None`` when MCFL is off or no member has a feature.
        """
        if not self.mcfl:
            return None
        return cluster_features(self.node_features, self.assignments, num_clusters)

    def mcfl_test_samples(self) -> int | None:
        """The test inputs a node averages for MCFL's choice; ``None``: all of them."""
        return None if self.mcfl_all_test_inputs else self.mcfl_feature_samples

    def summary(self) -> None:
        """Log MCFL's settings."""
        log(INFO, "\t├──> MCFL %s (n=%d)", "on" if self.mcfl else "off",
            self.mcfl_feature_samples)
        super().summary()
