"""MCFL's input features, an option of every clustered strategy (Li and Yan 2023).

Before round 1 every node uploads the mean of n sampled training inputs; a
cluster's feature is the mean over its members' uploads, and at evaluation a node
takes the cluster model whose feature is nearest to the mean of its test inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log

from fl_clusters import protocol as p
from fl_clusters.clustering import cluster_feature_means


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
        first accepted reply's).

    Returns
    -------
    tuple
        ``(features, rejected)``: node id -> feature of the usable replies, and
        the number of replies that were not a usable vector (each logged).
    """
    found: dict[int, np.ndarray] = {}
    rejected = 0
    common = next(iter(known.values()), None)
    for msg in valid:
        node = msg.metadata.src_node_id
        metrics = msg.content.metric_records[p.METRICS]
        feature = np.asarray(metrics.get(p.M_FEATURE_MEAN, []), dtype=np.float64)
        size = feature.size if common is None else common.size
        if feature.ndim != 1 or feature.size != size or size == 0 or not np.all(
            np.isfinite(feature)
        ):
            rejected += 1
            log(WARNING, "mcfl features: rejected reply from node %d: '%s' is not a "
                "finite vector of length %d", node, p.M_FEATURE_MEAN, size)
            continue
        found[node] = feature
        common = feature
    return found, rejected


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


def add_cluster_features(config: ConfigRecord, features: np.ndarray) -> None:
    """Put the clusters that have a feature, and their features, into an evaluate config."""
    usable = np.flatnonzero(np.all(np.isfinite(features), axis=1))
    config[p.CFG_MCFL_CLUSTERS] = usable.tolist()
    config[p.CFG_MCFL_FEATURES] = features[usable].ravel().tolist()
