"""Importance weights: how much each node's data belongs to each cluster (FedSoft).

A strategy that keeps soft weights ``u_ks`` per node and cluster subclasses
:class:`ImportanceWeights` beside its base class. It asks the nodes which
cluster model fits each of their training samples best and turns the counts
into weights floored at ``sigma``
(:func:`~fl_clusters.clustering.importance_weights`), draws the nodes that train
for each cluster by those weights, and says when the weights end up telling no
cluster apart.
"""

from __future__ import annotations

from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_clusters import protocol as p
from fl_clusters.clustering import (
    importance_weights,
    sample_per_cluster,
    selection_probabilities,
)
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.replies import num_examples

# How far above the tie 1/S some node's largest importance weight must lie for the
# estimates to tell the clusters apart: twice the sampling noise of a share of
# about 100 samples at S = 2 (sqrt(0.25 / 100) = 0.05).
INFORMATIVE_MARGIN = 0.1


class ImportanceWeights(ClusteredStrategy):
    """Each node's importance weights ``u_ks`` over the S clusters, and draws by them.

    The strategy sets the attributes below: its ``num_clusters`` (S), ``sigma``
    (the floor of every weight) and ``clients_per_cluster`` (K, ``None``: every
    node with weights) parameters, and the records its summary reports. A node
    has weights once it answered an estimate (:meth:`estimate_importance`) or
    was placed in a group (:meth:`importance_from_group`).
    """

    num_clusters: int
    sigma: float
    clients_per_cluster: int | None
    # node -> u (S,), and the node's training examples n_k
    importance: dict[int, np.ndarray]
    num_train_examples: dict[int, float]
    estimate_rounds: list[int]
    # round -> the nodes drawn for each cluster
    selections: dict[int, list[list[int]]]
    # Nodes ever asked for an estimate: a node joining later is asked at once.
    _estimate_asked: set[int]

    def estimate_importance(
        self, server_round: int, arrays: ArrayRecord, grid: Grid, only_new: bool = False
    ) -> None:
        """Ask every node (or, with ``only_new``, each node never asked) which cluster
        model fits each of its training samples best.

        Nodes that fail or send unusable counts keep their previous weights (or stay
        out of the selection until they have some).
        """
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        if only_new:
            nodes = [n for n in nodes if n not in self._estimate_asked]
            if not nodes:
                return
        self._estimate_asked.update(nodes)
        config = ConfigRecord({p.CFG_ROUND: server_round})
        replies = self.send(
            grid,
            self.build_messages(
                {node: RecordDict({p.CLUSTERS: arrays, p.CONFIG: config}) for node in nodes},
                p.QUERY_SAMPLE_ASSIGNMENT,
            )
        )
        counts_field = {p.M_COUNTS: p.MetricField(length=self.num_clusters, low=0.0)}
        for msg in self.check_replies(replies, None, f"{self.name} importance estimate",
                                      counts_field, trains=False):
            node = msg.metadata.src_node_id
            counts = msg.content.metric_records[p.METRICS][p.M_COUNTS]
            try:
                # A row of zero counts passes the field check and still has no weights.
                u = importance_weights(np.asarray([counts], dtype=np.float64), self.sigma)[0]
            except ValueError as err:
                self.rejected_replies += 1
                log(WARNING, "%s importance estimate: rejected reply from node %d: %s",
                    self.name, node, err)
                continue
            self.importance[node] = u
            self.num_train_examples[node] = num_examples(msg)
            # The hard view of the soft weights: used to pick an untrained node's
            # evaluation model and for cluster-recovery metrics.
            self.assignments[node] = int(np.argmax(u))
        self.estimate_rounds.append(server_round)
        mean_u = (
            np.mean(list(self.importance.values()), axis=0).round(3).tolist()
            if self.importance
            else []
        )
        log(INFO, "round %d: importance weights of %d nodes, mean u %s",
            server_round, len(self.importance), mean_u)

    def importance_from_group(self, node: int, group: int, examples: float) -> None:
        """``node``'s weights one-hot on ``group``, floored at sigma, until an estimate."""
        counts = np.zeros((1, self.num_clusters))
        counts[0, int(group)] = 1.0
        self.importance[node] = importance_weights(counts, self.sigma)[0]
        self.num_train_examples[node] = examples
        self._estimate_asked.add(node)

    def importance_mass(self, node: int, cluster: int) -> float:
        """``u_ks n_k``: the mass the selection probabilities of ``cluster`` give ``node``."""
        return float(self.importance[node][cluster] * self.num_train_examples[node])

    def draw_per_cluster(self, server_round: int) -> list[np.ndarray]:
        """The nodes that train for each cluster this round, drawn by their weights.

        K nodes per cluster with probabilities ``v_sk = u_ks n_k / sum_k' u_k's n_k'``,
        independently per cluster and without replacement (no K: every node with a
        weight above 0). Records the draws as node ids in ``selections`` and returns
        them as rows of the nodes in node order.
        """
        nodes = sorted(self.importance, key=self.node_order)
        u = np.stack([self.importance[node] for node in nodes])
        sizes = np.array([self.num_train_examples[node] for node in nodes])
        if server_round == self.final_round:
            self.warn_if_uninformative(server_round, u)
        probabilities = selection_probabilities(u, sizes)
        drawn = (
            [np.flatnonzero(row) for row in probabilities] if self.clients_per_cluster is None
            else sample_per_cluster(probabilities, self.clients_per_cluster, self.rng)
        )
        self.selections[server_round] = [[nodes[int(i)] for i in picks] for picks in drawn]
        return drawn

    def warn_if_uninformative(self, server_round: int, u: np.ndarray) -> None:
        """Say so when the run ends with importance weights (N, S) that tell no cluster apart.

        Weights all near 1/S make every cluster model the same average of the
        nodes, so none serves a group of its own, and the run still looks healthy.
        """
        tie = 1.0 / self.num_clusters
        largest = float(np.max(u)) if u.size else tie
        if self.num_clusters > 1 and largest < tie + INFORMATIVE_MARGIN:
            log(WARNING, "round %d: %s's importance weights tell the clusters apart for "
                "no node (largest %.2f, a tie is %.2f): every cluster model averages the "
                "nodes alike and none serves a group of its own. Its cluster models fit no "
                "node's training samples better than the others, too little local training "
                "a round for their losses to tell the groups apart: give each round more "
                "local training (local epochs or steps) or run more rounds",
                server_round, type(self).__name__, largest, tie)
