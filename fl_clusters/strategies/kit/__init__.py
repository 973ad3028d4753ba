"""Everything a new strategy needs, importable from one place.

A strategy file imports from here only (docs/adding-a-strategy.md walks through a
complete one)::

    from fl_clusters.strategies.kit import HardClusteredStrategy, Param, num_clusters_param

- the base classes and their narrow hooks: :class:`HardClusteredStrategy`
  (``aggregate_members`` decides the clusters from the replies grouped by the
  cluster each node trained, ``place_newcomers`` places a node that joined
  late, ``aggregate_clusters`` averages each cluster's members) and
  :class:`ClusteredStrategy` (``federation_problem``, ``summary_fields``,
  ``scoring`` returning a :class:`Scoring`, ``write_artifacts``), on the interface
  every strategy meets (:class:`ServerStrategy`), with the optional capabilities
  :class:`ClusterFeatureSource` and :class:`SimilaritySource`;
- declarations: :class:`Param`, :data:`REQUIRED`, :data:`NOT_GIVEN` (a value
  the paper does not give), :func:`num_clusters_param` (the shared run-config
  key ``num-clusters``), :data:`FRACTION_TRAIN`, :data:`INTER_CLUSTER`,
  :class:`Behaviour` (a rule that departs from the paper's) and
  :class:`RecipeValue` (the paper's training recipe);
- options a strategy composes in: :class:`AWCFLOption` and :class:`MCFLOption`
  (Li and Yan's AWCFL and MCFL), :class:`InnerAggregationOption` (a Flower
  strategy inside each cluster: ``aggregate_cluster`` averages one), ACFL's
  :class:`TrialFederations` and FedSoft's :class:`ImportanceWeights`;
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
  :func:`average_replies`, :func:`average_packed_clusters`, :func:`num_examples`,
  :func:`train_losses`,
  :func:`reply_metrics` (checked with :class:`MetricField`s), and the math on
  them (:func:`flatten_models`, :func:`nearest_feature`);
- a strategy's own queries to the nodes (its ``client_queries``, each a
  :data:`ClientQuery`): :func:`query_messages` on the server; on the node
  :func:`query_models`, :func:`query_config`, :func:`query_training` and
  :func:`query_reply` (:mod:`~fl_clusters.strategies.kit.client_queries`);
- registration: a subclass with a ``name`` registers itself when its module is
  imported; :mod:`fl_clusters.strategies.kit.registry` imports every module of
  ``fl_clusters/strategies/`` and the installed packages' entry points, and
  lists what is registered (``strategy_classes``).
"""

from __future__ import annotations

from fl_clusters.clustering import flatten_models, nearest_feature
from fl_clusters.drawing import draw_clusters, random_like
from fl_clusters.params import NOT_GIVEN, REQUIRED, Param
from fl_clusters.protocol import (
    MetricField,
    numpy_to_record,
    pack_clusters,
    record_to_numpy,
    unpack_clusters,
)
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.behaviours import Behaviour
from fl_clusters.strategies.kit.client_queries import (
    ClientQuery,
    query_config,
    query_messages,
    query_models,
    query_reply,
    query_training,
    reply_metrics,
)
from fl_clusters.strategies.kit.hard import HardClusteredStrategy
from fl_clusters.strategies.kit.importance import ImportanceWeights
from fl_clusters.strategies.kit.interface import (
    ClusterFeatureSource,
    Scoring,
    ServerStrategy,
    SimilaritySource,
)
from fl_clusters.strategies.kit.options.awcfl import AWCFLOption
from fl_clusters.strategies.kit.options.inner import InnerAggregationOption
from fl_clusters.strategies.kit.options.mcfl import MCFLOption
from fl_clusters.strategies.kit.recipes import RecipeValue
from fl_clusters.strategies.kit.replies import (
    average_packed_clusters,
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
from fl_clusters.strategies.kit.trials import TrialFederations
from fl_clusters.strategies.kit.warm_start import (
    CentresFromStart,
    KMeansStart,
    group_local_models,
    kmeans_start_problem,
)

__all__ = [
    "FRACTION_TRAIN",
    "INTER_CLUSTER",
    "NOT_GIVEN",
    "REQUIRED",
    "AWCFLOption",
    "Behaviour",
    "CentresFromStart",
    "ClientQuery",
    "ClusterFeatureSource",
    "ClusteredStrategy",
    "HardClusteredStrategy",
    "ImportanceWeights",
    "InnerAggregationOption",
    "KMeansStart",
    "MCFLOption",
    "MetricField",
    "Param",
    "RecipeValue",
    "Scoring",
    "ServerStrategy",
    "SimilaritySource",
    "TrialFederations",
    "average_packed_clusters",
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
    "query_config",
    "query_messages",
    "query_models",
    "query_reply",
    "query_training",
    "random_like",
    "record_to_numpy",
    "reply_layers",
    "reply_metrics",
    "reply_updates",
    "train_losses",
    "unpack_clusters",
]
