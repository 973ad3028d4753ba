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
- k centres from ``initial_arrays`` and the one local-k-means warm start that
  IFCA, FedEM and FedSoft share: subclass :class:`CentresFromStart` (its
  ``initial_centres`` checks packed arrays and calls the ``initialize`` hook for
  a plain model; ``centres_from_groups`` turns the warm start's
  :class:`KMeansStart` groups into centres), with :func:`group_local_models`
  and :func:`kmeans_start_problem` for the k-means step itself;
- reading replies: :func:`reply_layers`, :func:`reply_updates`,
  :func:`average_replies`, :func:`num_examples`, :func:`train_losses`, and the
  math on them (:func:`flatten_models`, :func:`nearest_feature`);
- registration: a subclass with a ``name`` registers itself when its module is
  imported; :mod:`fl_clusters.strategies.kit.registry` imports every module of
  ``fl_clusters/strategies/`` and the installed packages' entry points, and
  lists what is registered (``strategy_classes``).
"""

from __future__ import annotations

from fl_clusters.clustering import flatten_models, nearest_feature
from fl_clusters.drawing import draw_clusters, random_like
from fl_clusters.protocol import (
    numpy_to_record,
    pack_clusters,
    record_to_numpy,
    unpack_clusters,
)
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.hard import HardClusteredStrategy
from fl_clusters.strategies.kit.params import REQUIRED, Param
from fl_clusters.strategies.kit.replies import (
    average_replies,
    num_examples,
    reply_layers,
    reply_updates,
    train_losses,
)
from fl_clusters.strategies.kit.shared_params import (
    FRACTION_TRAIN,
    INTER_CLUSTER,
    num_clusters_param,
)
from fl_clusters.strategies.kit.warm_start import (
    CentresFromStart,
    KMeansStart,
    group_local_models,
    kmeans_start_problem,
)

__all__ = [
    "FRACTION_TRAIN",
    "INTER_CLUSTER",
    "REQUIRED",
    "CentresFromStart",
    "ClusteredStrategy",
    "HardClusteredStrategy",
    "KMeansStart",
    "Param",
    "average_replies",
    "draw_clusters",
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
    "reply_layers",
    "reply_updates",
    "train_losses",
    "unpack_clusters",
]
