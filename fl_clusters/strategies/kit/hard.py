"""The base of the strategies whose server puts each node in one cluster."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from sklearn.metrics import pairwise_distances

from fl_clusters import protocol as p
from fl_clusters.strategies.kit.options.awcfl import AWCFLOption
from fl_clusters.strategies.kit.options.inner import InnerAggregationOption
from fl_clusters.strategies.kit.options.mcfl import MCFLOption
from fl_clusters.strategies.kit.replies import reply_updates, train_losses
from fl_clusters.strategies.kit.shared_params import FRACTION_TRAIN, INTER_CLUSTER


class HardClusteredStrategy(AWCFLOption, MCFLOption, InnerAggregationOption):
    """Clustered strategies whose server assigns each node to one cluster (CFL, ACFL).

    Holds the cluster models of the current round, sends every sampled node its own
    cluster's model, and groups the replies by cluster. A node without a cluster
    (never seen, or released) receives every cluster model and trains the one with
    the lowest loss on its training split; its reply's ``cluster-id`` places it.
    """

    paper = "base class of CFL, ACFL, FL+HC and WeCFL; AWCFL and MCFL: Li and Yan 2023"
    params = (FRACTION_TRAIN, *INTER_CLUSTER)

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self._models: list[ArrayRecord] = []
        # Nodes placed after the clustering by the strategy's own rule (node -> cluster),
        # and every node asked to, so a silent one is not waited for every round.
        self.placed_nodes: dict[int, int] = {}
        self._placement_asked: set[int] = set()

    # ----------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node its cluster's model, placing nodes without one first."""
        nodes = self.sampled(grid, self.fraction_train)
        if newcomers := self.newcomers(nodes):
            self.place_newcomers(server_round, newcomers, config, grid)
        return self.assigned_train_messages(server_round, arrays, config, grid, nodes)

    def place_newcomers(
        self, server_round: int, nodes: list[int], config: ConfigRecord, grid: Grid
    ) -> None:
        """Place sampled nodes without a cluster by the strategy's own rule.

        By default they stay unplaced: they receive every cluster model and train the
        one with the lowest loss. Strategies that clustered by a rule a node can be
        measured against (its update) override this.
        """

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Group the valid replies by cluster, then :meth:`aggregate_members`."""
        members = self.replies_by_cluster(replies)
        if not members:
            return None, None
        return self.aggregate_members(server_round, members)

    def aggregate_members(
        self, server_round: int, members: dict[int, list[Message]]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's models from the replies grouped by cluster (non-empty).

        By default every cluster averages its members (:meth:`aggregate_clusters`);
        strategies that (re)cluster override this.
        """
        return self.aggregate_clusters(server_round, self._models, members)

    def newcomers(self, nodes: Iterable[int]) -> list[int]:
        """The nodes of ``nodes`` without a cluster that were never asked to place themselves."""
        return [n for n in nodes if n not in self.assignments and n not in self._placement_asked]

    def place_by_update(
        self,
        server_round: int,
        nodes: list[int],
        start: ArrayRecord,
        references: np.ndarray,
        config: ConfigRecord,
        grid: Grid,
        metric: str = "cosine",
    ) -> None:
        """Place nodes without a cluster by their update, the way the strategy clustered.

        Each node trains once from ``start`` (the model the clustered updates were
        computed from) and joins the cluster whose reference update (row of
        ``references``) is nearest to its own under ``metric`` (any scikit-learn
        pairwise metric). A node that does not answer picks by training loss and
        is not asked again.
        """
        self._placement_asked.update(nodes)
        valid = self.train_once(nodes, start, self.round_config(config, server_round), grid,
                                "placement")
        if not valid:
            return
        distances = pairwise_distances(reply_updates(valid, start), references, metric=metric)
        for msg, cluster in zip(valid, np.argmin(distances, axis=1), strict=True):
            node = msg.metadata.src_node_id
            self.assignments[node] = self.placed_nodes[node] = int(cluster)
            log(INFO, "round %d: node %d joined late; placed in cluster %d by the %s distance "
                "of its update", server_round, node, int(cluster), metric)

    @property
    def round_models(self) -> list[ArrayRecord]:
        """The models this round's nodes train: round 1's one initial model, then the K."""
        return list(self._models)

    def cluster_of(self, node: int) -> int | None:
        """The node's cluster; with a single cluster every node belongs to it."""
        if len(self._models) == 1:
            return 0
        return self.assignments.get(node)

    def assigned_train_messages(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        nodes: list[int] | None = None,
    ) -> list[Message]:
        """One train message per sampled node (or per node of ``nodes``), carrying its
        cluster's model."""
        self._models = p.unpack_clusters(arrays)
        if self.fraction_train == 0.0:
            return []
        contents: dict[int, RecordDict] = {}
        for node in self.sample(grid, self.fraction_train) if nodes is None else nodes:
            node_config = self.round_config(config, server_round)
            cluster = self.cluster_of(node)
            if cluster is None:
                record = RecordDict({p.CLUSTERS: arrays, p.CONFIG: node_config})
            else:
                node_config[p.CFG_ASSIGNED] = cluster
                record = RecordDict({p.ARRAYS: self._models[cluster], p.CONFIG: node_config})
            contents[node] = record
        log(INFO, "configure_train: %d nodes over %d clusters", len(contents), len(self._models))
        return self.build_messages(contents, MessageType.TRAIN)

    def replies_by_cluster(self, replies: Iterable[Message]) -> dict[int, list[Message]]:
        """The valid train replies, grouped by the cluster whose model each node trained."""
        members: dict[int, list[Message]] = {}
        fields = {**p.TRAIN_FIELDS, p.M_CLUSTER: p.cluster_id_field(len(self._models))}
        for msg in self.check_replies(replies, self._models[0], "aggregate_train", fields,
                                      trains=True):
            node = msg.metadata.src_node_id
            cluster = self.cluster_of(node)
            if cluster is None:
                cluster = int(msg.content.metric_records[p.METRICS].get(p.M_CLUSTER, -1))  # type: ignore[arg-type]
                if not 0 <= cluster < len(self._models):
                    self.rejected_replies += 1
                    log(WARNING, "aggregate_train: rejected reply from node %d: cluster-id %d "
                        "outside [0, %d)", node, cluster, len(self._models))
                    continue
            members.setdefault(cluster, []).append(msg)
        return members

    def aggregate_clusters(
        self, server_round: int, models: list[ArrayRecord], groups: dict[int, list[Message]]
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Aggregate each cluster's members (clusters without replies keep their model).

        ``models[j]`` is the model cluster j's members trained from; each cluster
        averages them (:meth:`aggregate_cluster`: the mean, or the inner Flower
        strategy). Records every member's cluster in ``assignments`` and applies
        AWCFL's inter-cluster mixing to the results.
        """
        models = list(models)
        for cluster, trained in sorted(groups.items()):
            models[cluster] = self.aggregate_cluster(server_round, cluster, models[cluster],
                                                     trained, weighted=self.own_term_weighted())
            for msg in trained:
                self.assignments[msg.metadata.src_node_id] = cluster
        models = self.mix_clusters(models, active=groups)
        sizes = np.bincount(list(self.assignments.values()), minlength=len(models))
        losses = train_losses(m for trained in groups.values() for m in trained)
        metrics = MetricRecord(
            {
                p.M_TRAIN_LOSS: float(np.mean(losses)),
                "cluster-sizes": sizes.astype(int).tolist(),
                "num-clusters": len(models),
            }
        )
        return p.pack_clusters(models), metrics

    def summary_fields(self) -> dict[str, Any]:
        """The number of clusters the nodes ended in, and the nodes placed late."""
        return {
            **super().summary_fields(),
            "num_clusters_found": len(set(self.assignments.values())) or 1,
            "placed_nodes": {str(node): c for node, c in sorted(self.placed_nodes.items())},
        }
