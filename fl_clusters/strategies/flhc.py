"""FL+HC: federated learning with hierarchical clustering (Briggs, Fan, Andras, IJCNN 2020)."""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters.clustering import UpdateHierarchy
from fl_clusters.clustering.hierarchical import DISTANCES, LINKAGES, THRESHOLDS
from fl_clusters.strategies.kit import (
    HardClusteredStrategy,
    Param,
    reply_updates,
)


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


class FLHC(HardClusteredStrategy):
    """FL+HC: a FedAvg warm-up, one agglomerative clustering of updates, then FedAvg per cluster.

    Rounds ``1..warmup_rounds`` are plain FedAvg. In the next round every sampled
    node trains from the global model and the server clusters their updates
    (trained model minus the global model) once, with sklearn's
    ``AgglomerativeClustering`` cut at a distance threshold, so the number of
    clusters is found, not given. Each cluster starts from the example-weighted
    mean of its members' models and then runs its own FedAvg.

    A node that did not train in the clustering round (not sampled, failed, or
    joined later) has no cluster. The first time it is sampled it trains once
    from the model the clustered updates started from, and joins the cluster
    whose mean update is nearest to its own update under ``metric``
    (:meth:`~fl_clusters.strategies.kit.hard.HardClusteredStrategy.place_by_update`),
    for good. Only a node that does not answer that request falls back to the
    loss: it receives every cluster model and trains the one of lowest loss on
    its training split, which places it.

    Copies of an update (two clients with the same data and seed, a node that
    reports twice) are clustered once (:class:`~fl_clusters.clustering.UpdateHierarchy`).
    """

    name = "flhc"
    paper = "Briggs, Fan, Andras, IJCNN 2020 (FL+HC)"
    params = (
        Param("warmup_rounds", 3, "int", "FL+HC: FedAvg rounds before clustering", low=0,
              doc="FedAvg rounds before the clustering round, >= 0 (0 clusters the updates of "
              "round 1, trained from the initial model)."),
        Param("linkage", "ward", "str", "FL+HC agglomerative linkage", choices=LINKAGES,
              doc='``"ward"``, ``"average"``, ``"complete"`` or ``"single"``.'),
        Param("metric", "euclidean", "str",
              "FL+HC distance between updates (ward needs euclidean)", choices=DISTANCES,
              doc='``"euclidean"``, ``"manhattan"`` or ``"cosine"`` (ward needs euclidean).'),
        Param("threshold", "gap", "str",
              "FL+HC cut: largest jump of merge heights, ratio x nearest distance, or absolute",
              choices=THRESHOLDS, paper="absolute",
              why="an absolute distance threshold is in the units of one model and data set; "
              "the gap cut reads the tree's own merge heights, whatever the model's scale",
              source="Briggs et al. 2020 (not among the seeds), section III: a distance "
              "threshold on the hierarchy decides the clusters",
              doc='``"gap"``: cut inside the largest jump between consecutive merge heights of '
              "the tree, if the higher is at least ``min_gap`` times the lower, else one "
              "cluster; ratios of heights hold for any model and local training. Only jumps "
              "above the noise floor count (the lower merge at least the median "
              'nearest-neighbour distance / ``min_gap``). ``"relative"``: cut at '
              "``distance_ratio`` x the median distance from each update to its nearest "
              'other update. ``"absolute"``: cut at ``distance_threshold`` (the paper\'s '
              "form)."),
        Param("min_gap", 1.6, "float",
              "FL+HC gap cut: smallest jump between merge heights that separates clusters",
              above=1.0,
              doc="Gap cut: the smallest jump that separates clusters, > 1."),
        Param("distance_ratio", 2.5, "float",
              "FL+HC relative cut: this x the median distance to the nearest other update",
              above=0.0,
              doc="Relative cut, > 0."),
        Param("distance_threshold", 0.9, "float",
              "FL+HC absolute cut (the paper's form; suits the digits MLP only)", above=0.0,
              doc="Absolute cut, > 0, in the metric's units. Update distances scale with the "
              "model and local work: 0.9 suits the bundled digits MLP (lr 0.1, 10 steps)."),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        # From the attributes: the preset may have replaced an argument's default. A
        # refusal (ward with another metric) names the argument; a run config's
        # builder renames it to its key.
        self.hierarchy = UpdateHierarchy(
            self.linkage, self.metric, self.threshold, self.min_gap, self.distance_ratio,
            self.distance_threshold,
        )
        self.clustering_round: int | None = None
        # For late nodes: the model the clustered updates started from, and each
        # cluster's mean update.
        self._reference_start = ArrayRecord()
        self._references: np.ndarray | None = None

    def place_newcomers(
        self, server_round: int, nodes: list[int], config: ConfigRecord, grid: Grid
    ) -> None:
        """After the clustering, in the nearest cluster.

        A node trains once from the model the clustered updates started from, and
        the cluster whose mean update is nearest to its own under ``metric`` takes it.
        """
        if self._references is not None:
            self.place_by_update(server_round, nodes, self._reference_start,
                                 self._references, config, grid, self.hierarchy.metric)

    def aggregate_members(
        self, server_round: int, members: dict[int, list[Message]]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """FedAvg (per cluster once clustered); cluster the updates right after the warm-up."""
        if self.clustering_round is not None or server_round <= self.warmup_rounds:
            packed, metrics = self.aggregate_clusters(server_round, self._models, members)
            if self.clustering_round is None:
                # A warm-up round is FedAvg: nobody belongs to a cluster yet.
                self.assignments.clear()
                log(INFO, "FL+HC round %d: warm-up (FedAvg); the updates are clustered in "
                    "round %d", server_round, self.warmup_rounds + 1)
            return packed, metrics
        trained = members[0]
        updates = reply_updates(trained, self._models[0])
        labels = self.hierarchy.fit_predict(updates)
        self.clustering_round = server_round
        self._reference_start = self._models[0]
        self._references = np.stack([
            updates[labels == label].mean(axis=0) for label in range(self.hierarchy.num_clusters_)
        ])
        groups: dict[int, list[Message]] = {}
        for msg, label in zip(trained, labels, strict=True):
            groups.setdefault(int(label), []).append(msg)
        log(INFO, "FL+HC round %d cut: %d updates, %s linkage, %s distance; %s: %d clusters "
            "of sizes %s", server_round, len(trained), self.hierarchy.linkage,
            self.hierarchy.metric, self.hierarchy.describe_cut(), self.hierarchy.num_clusters_,
            [len(g) for g in groups.values()])
        if self.hierarchy.num_clusters_ == 1 and self.hierarchy.num_distinct_ > 1:
            self._warn_one_cluster(server_round)
        packed, metrics = self.aggregate_clusters(
            server_round, [self._models[0]] * self.hierarchy.num_clusters_, groups
        )
        return packed, metrics

    def _warn_one_cluster(self, server_round: int) -> None:
        """Say that the cut kept one cluster, what it compared, and what to change."""
        knob = {"gap": "lower 'flhc-min-gap' (one distribution gave jumps up to 1.45)",
                "relative": "lower 'flhc-distance-ratio'",
                "absolute": "lower 'flhc-distance-threshold'"}[self.hierarchy.threshold]
        log(WARNING, "FL+HC round %d: the updates form ONE cluster (%s). If the nodes' data "
            "differ, one round's updates are too close to tell them apart: train more "
            "local epochs a round (updates of different data move apart as local training "
            "grows), or %s", server_round, self.hierarchy.describe_cut(), knob)

    def summary_fields(self) -> dict[str, Any]:
        """The clustering round, the cut used and the number of clusters found.

        ``distance_threshold`` is ``None`` when the gap cut merged everything.
        """
        if self.clustering_round is None:
            return {"clustering_round": None, **super().summary_fields()}
        h = self.hierarchy
        return {
            "clustering_round": self.clustering_round,
            "distance_threshold": _finite_or_none(h.threshold_),
            "max_merge_gap": _finite_or_none(h.max_gap_),
            # Smallest relative margin of the cut's decisions (ties are logged).
            "cut_margin": _finite_or_none(h.margin_),
            "median_nearest_distance": _finite_or_none(h.nearest_distance_),
            "num_distinct_updates": h.num_distinct_,
            "num_hierarchy_clusters": self.hierarchy.num_clusters_,
            **super().summary_fields(),
        }

    def summary(self) -> None:
        """Log FL+HC's settings."""
        h = self.hierarchy
        cut = {
            "gap": f"largest jump of merge heights if >= {h.min_gap:g}x",
            "relative": f"{h.distance_ratio:g} x median nearest distance",
            "absolute": f"{h.distance_threshold:g}",
        }[h.threshold]
        log(INFO, "\t├──> FL+HC: warm-up %d rounds | %s linkage, %s distance | cut %s",
            self.warmup_rounds, h.linkage, h.metric, cut)
        super().summary()
