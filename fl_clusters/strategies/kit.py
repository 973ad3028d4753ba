"""Everything a new strategy needs, importable from one place.

A strategy file imports from here only (docs/adding-a-strategy.md walks through a
complete one)::

    from fl_clusters.strategies.kit import HardClusteredStrategy, Param, num_clusters_param

- the base classes and their narrow hooks: :class:`HardClusteredStrategy`
  (``aggregate_members`` decides the clusters from the replies grouped by the
  cluster each node trained, ``place_newcomers`` places a node that joined
  late, ``aggregate_clusters`` averages each cluster's members) and
  :class:`ClusteredStrategy` (``federation_problem``, ``summary_fields``);
- declarations: :class:`Param`, :data:`REQUIRED`, :func:`num_clusters_param`
  (the shared run-config key ``num-clusters``), :data:`FRACTION_TRAIN`,
  :data:`INTER_CLUSTER`;
- cluster models: ``initial_arrays`` reaches round 1 as one model;
  :func:`pack_clusters` / :func:`unpack_clusters` move between that record and
  k models, :func:`draw_clusters` and :func:`random_like` make k random centres
  around it, :func:`record_to_numpy` / :func:`numpy_to_record` convert a model;
- the local-k-means warm start IFCA, FedEM and FedSoft share
  (:func:`kmeans_start_problem`, :func:`warm_start_messages`,
  :func:`enough_local_models`, :func:`group_local_models`, :class:`KMeansStart`);
- reading replies: :func:`reply_layers`, :func:`reply_updates`,
  :func:`average_replies`, :func:`num_examples`, :func:`train_losses`, and the
  math on them (:func:`flatten_models`, :func:`nearest_feature`);
- registration: a subclass with a ``name`` registers itself when its module is
  imported, and the registry imports every module of ``fl_clusters/strategies/``;
  :func:`registered` lists what is registered.
"""

from __future__ import annotations

from fl_clusters.clustering import flatten_models, nearest_feature
from fl_clusters.protocol import (
    draw_clusters,
    numpy_to_record,
    pack_clusters,
    random_like,
    record_to_numpy,
    unpack_clusters,
)
from fl_clusters.strategies.base import ClusteredStrategy
from fl_clusters.strategies.hard import HardClusteredStrategy
from fl_clusters.strategies.params import (
    FRACTION_TRAIN,
    INTER_CLUSTER,
    REQUIRED,
    Param,
    num_clusters_param,
)
from fl_clusters.strategies.replies import (
    average_replies,
    num_examples,
    reply_layers,
    reply_updates,
    train_losses,
)
from fl_clusters.strategies.warm_start import (
    KMeansStart,
    enough_local_models,
    group_local_models,
    kmeans_start_problem,
    warm_start_messages,
)


def registered() -> dict[str, type[ClusteredStrategy]]:
    """Every registered strategy by its run-config name (baselines excluded)."""
    return dict(sorted(ClusteredStrategy.registry.items()))


__all__ = [
    "FRACTION_TRAIN",
    "INTER_CLUSTER",
    "REQUIRED",
    "ClusteredStrategy",
    "HardClusteredStrategy",
    "KMeansStart",
    "Param",
    "average_replies",
    "draw_clusters",
    "enough_local_models",
    "flatten_models",
    "group_local_models",
    "kmeans_start_problem",
    "nearest_feature",
    "num_clusters_param",
    "num_examples",
    "numpy_to_record",
    "pack_clusters",
    "random_like",
    "record_to_numpy",
    "registered",
    "reply_layers",
    "reply_updates",
    "train_losses",
    "unpack_clusters",
    "warm_start_messages",
]
