"""The clustering math of fl-clusters: numpy and scikit-learn only, no Flower.

A model is a list of layer arrays; a set of client models is a sequence of
those. Every function validates its parameters and raises ValueError naming the
parameter, its bad value and the allowed range.
"""

from fl_clusters.clustering.aggregation import inter_cluster_mix, weighted_average
from fl_clusters.clustering.assignment import (
    assign_by_loss,
    cluster_feature_means,
    group_by_kmeans,
    nearest_feature,
)
from fl_clusters.clustering.bipartition import (
    CFLSplitDecision,
    bipartition_by_cosine,
    cluster_structure_score,
    decide_cfl_split,
    should_split,
)
from fl_clusters.clustering.cluster_update import cluster_update
from fl_clusters.clustering.density import (
    DensityClustering,
    k_distance_curve,
    knee_eps,
    silhouette_eps,
    stratified_sample,
)
from fl_clusters.clustering.gates import (
    coherence_split_gate,
    has_converged,
    levelled_off_gate,
    norm_threshold_gate,
    output_layer_profiles,
    unit_rows,
    update_coherence,
    widest_group,
)
from fl_clusters.clustering.hierarchical import UpdateHierarchy, median_nearest_distance
from fl_clusters.clustering.kmeans_models import initial_kmeans, weighted_kmeans
from fl_clusters.clustering.mixture import (
    e_step,
    fit_mixture_weights,
    full_step_scales,
    mixture_probabilities,
    node_e_step,
    responsibilities,
)
from fl_clusters.clustering.ordering import (
    INCENTIVE_THRESHOLDS,
    GreedyIncentiveClustering,
    has_positive_incentive,
    incentive,
    incentive_standard_error,
    order_by_similarity,
)
from fl_clusters.clustering.similarity import (
    closest_direction,
    flatten_models,
    model_updates,
    pairwise_cosine,
    update_norms,
)
from fl_clusters.clustering.soft_weights import (
    best_fit_counts,
    importance_weights,
    sample_per_cluster,
    selection_probabilities,
)
from fl_clusters.clustering.starts import most_balanced_restart, warm_start_points

__all__ = [
    "INCENTIVE_THRESHOLDS",
    "CFLSplitDecision",
    "DensityClustering",
    "GreedyIncentiveClustering",
    "UpdateHierarchy",
    "assign_by_loss",
    "best_fit_counts",
    "bipartition_by_cosine",
    "closest_direction",
    "cluster_feature_means",
    "cluster_structure_score",
    "cluster_update",
    "coherence_split_gate",
    "decide_cfl_split",
    "e_step",
    "fit_mixture_weights",
    "flatten_models",
    "full_step_scales",
    "group_by_kmeans",
    "has_converged",
    "has_positive_incentive",
    "importance_weights",
    "incentive",
    "incentive_standard_error",
    "initial_kmeans",
    "inter_cluster_mix",
    "k_distance_curve",
    "knee_eps",
    "levelled_off_gate",
    "median_nearest_distance",
    "mixture_probabilities",
    "model_updates",
    "most_balanced_restart",
    "nearest_feature",
    "node_e_step",
    "norm_threshold_gate",
    "order_by_similarity",
    "output_layer_profiles",
    "pairwise_cosine",
    "responsibilities",
    "sample_per_cluster",
    "selection_probabilities",
    "should_split",
    "silhouette_eps",
    "stratified_sample",
    "unit_rows",
    "update_coherence",
    "update_norms",
    "warm_start_points",
    "weighted_average",
    "weighted_kmeans",
    "widest_group",
]
