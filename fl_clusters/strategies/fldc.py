"""FLDC: DBSCAN clustering of client models and stratified sampling (Wang and Li 2025)."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from fl_clusters import protocol as p
from fl_clusters.clustering import DensityClustering, flatten_models, stratified_sample
from fl_clusters.clustering.density import EPS_METHODS
from fl_clusters.strategies.kit import (
    Behaviour,
    InnerAggregationOption,
    Param,
    RecipeValue,
    Scoring,
    reply_layers,
)

K_DISTANCE_PLOT = "k_distance.png"
# The paper, as the sources below cite it (docs/paper-fidelity.md).
SOURCE = "Wang and Li 2025 (seed 002)"


def plot_k_distance(curve: np.ndarray, eps: float, min_pts: int, path: Path) -> Path:
    """Draw the sorted k-distance curve with the chosen eps as a PNG (Agg backend).

    Parameters
    ----------
    curve : np.ndarray
        Ascending k-distances, one per client.
    eps : float
        DBSCAN radius used, drawn as a horizontal line.
    min_pts : int
        MinPts, for the axis label.
    path : Path
        File to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    # pyplot is imported after the backend is chosen: a ServerApp has no display.
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(np.arange(1, len(curve) + 1), curve, marker="o", markersize=3)
    axes.axhline(eps, color="tab:red", linestyle="--", label=f"eps = {eps:.3g}")
    axes.set_xlabel("clients, sorted by distance")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(f"distance to the {min_pts}-th nearest model (itself included)")
    axes.set_title("FLDC k-distance curve")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


class FLDC(InnerAggregationOption):
    """FLDC: one global model trained on clients sampled per DBSCAN cluster.

    Round 1 (the paper's round 0): every connected node trains once from the
    initial model. The server clusters the returned models (flattened parameters,
    each standardized over the models, Euclidean distance; unscaled under
    ``preset="paper"``) with DBSCAN; eps is given or read at the knee of the sorted
    k-distance curve. Noise nodes (label -1) are reported and never sampled. The
    round-1 global model is the example-weighted average of the clustered nodes'
    models (under ``preset="paper"`` the initial model stays the global model,
    as in the paper's Algorithm 1). Every later round samples
    ``max(round(r * |T_i|), 1)`` nodes from each cluster T_i and replaces the
    global model by their weighted FedAvg.
    """

    name = "fldc"
    # 3 (both presets): DBSCAN compares distances computed without BLAS against a
    # radius set off every pairwise distance, so the knee's own pair, at exactly eps,
    # is within eps on every machine (before, BLAS rounding decided it).
    paper_revision = 3
    # 2: the DBSCAN distance on standardized parameters (standardized_distance).
    robust_revision = 3
    paper = "Wang and Li, 2025"
    defaults_checked_against = ("the paper's settings: MinPts = 4, eps at the knee of the "
                                "sorted k-distance curve, r = 0.2")
    # No fraction_train: round 1 trains every node, later rounds r of every cluster.
    params = (
        Param("min_pts", 4, "int", "FLDC DBSCAN MinPts (the point itself counts)", low=2,
              doc="DBSCAN's MinPts, counting the point itself (as in the paper's definition of "
              "the eps-neighbourhood and in scikit-learn); >= 2."),
        Param("eps", None, "float", "FLDC DBSCAN eps (0 = chosen by fldc-eps-method)",
              above=0.0, allow_none=True, unset=0.0,
              doc="DBSCAN radius, > 0, in the distance's units (standardized parameters, raw "
              'under ``preset="paper"``); ``None`` chooses it by ``eps_method``.'),
        Param("eps_method", "knee", "str",
              "FLDC eps when fldc-eps is 0: k-distance knee, or best silhouette over a grid "
              "of its quantiles (ours; the paper validates the knee by it)",
              choices=EPS_METHODS,
              doc='``"knee"``: the knee of the curve of distances to the ``min_pts``-th nearest '
              'model (the model itself included); ``"silhouette"``: the best silhouette over '
              "a grid of that curve's quantiles (ours: the paper's table 5 uses the "
              "silhouette to validate the knee, not to search)."),
        Param("r", 0.2, "float", "FLDC sampling rate per cluster", above=0.0, high=1.0,
              doc="Share of every cluster sampled each round after the first, in (0, 1]."),
    )
    behaviours = (
        Behaviour(
            "round0_average",
            paper_rule="round 0 only clusters: every client trains the initial model once, "
            "DBSCAN groups the models, and round 1 starts again from the initial model",
            robust_rule="the clustered clients' round-0 models are averaged (example-weighted) "
            "into the global model round 1 starts from",
            why="round 0 is a full round of training by every client; averaging it gives "
            "the later rounds a trained start at no cost",
            source=f"{SOURCE}, section 1.3, Algorithm 1 steps 1-3 (the global model is "
            "aggregated in steps 8-10 only)"),
        Behaviour(
            "all_noise_one_stratum", paper_rule="",
            robust_rule="when DBSCAN labels every client noise, all clients form one stratum "
            "(FLDC then samples like FedAvg) and a warning says so",
            why="excluding every noise client would leave no one to train",
            source=f"{SOURCE}, section 1.3: noise clients are excluded; the case of no "
            "cluster at all is not treated"),
        Behaviour(
            "standardized_distance",
            paper_rule="DBSCAN's distance is taken between the round-0 models' parameters "
            "as they are",
            robust_rule="each parameter is scaled to mean 0 and standard deviation 1 over "
            "the round-0 models (parameters equal in all of them left out) before the "
            "Euclidean distance; eps and the k-distance curve are in those units",
            why="unscaled, the few parameters that move most in every model decide the "
            "distance: in Flower's quickstart with 12 nodes in 2 groups the output "
            "layer's 10 biases made 46% of the squared distance while following each "
            "node's label counts, not its group, and DBSCAN found one cluster; scaled, "
            "between-group distances exceed within-group ones in 97-100% of pairs "
            "(68-99% unscaled) in the 12-node and 9-node runs of "
            "benchmarks/plugin_settings.py",
            source=f"{SOURCE}, section 1.1: the k-dist graph of the 100 local models' "
            "parameters, no scaling named"),
    )
    recipe = (
        RecipeValue("optimizer", "plain SGD", f"{SOURCE}, Algorithm 1 step 15: w <- w - eta "
                    "x the gradient on batch b"),
        RecipeValue("lr", 0.01, f"{SOURCE}, section 2.2: learning rate 0.01"),
        RecipeValue("local-epochs", 5, f"{SOURCE}, section 2.2: epochs 5"),
        RecipeValue("local-steps", 0, f"{SOURCE}, section 2.2 and Algorithm 1 steps 13-15: "
                    "local training is E epochs over batches, no step count"),
        RecipeValue("batch-size", 64, f"{SOURCE}, section 2.2: batch size 64"),
        RecipeValue("num-rounds", 50, f"{SOURCE}, section 2.2: 50 communication rounds on "
                    "MNIST (100 on CIFAR-10)"),
    )

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.clustering: DensityClustering | None = None
        self.labels: dict[int, int] = {}
        self._strata: dict[int, int] = {}
        self._current = ArrayRecord()
        # Round 0's start and settings, to place nodes that join later the same way.
        self._round0_model = ArrayRecord()
        self._round0_config = ConfigRecord()
        self._placement_asked: set[int] = set()
        self.late_labels: dict[int, int] = {}

    def prepare(self, grid: Grid, timeout: float, num_rounds: int) -> None:
        """The handshake, then say what FLDC cannot do for the connected nodes.

        FLDC ends with one global model whatever DBSCAN finds, and DBSCAN's MinPts
        bounds how many groups it can tell apart; both are known here, before any
        training, so a user whose groups need models of their own learns it at the
        start rather than from one model that fails some of them.
        """
        super().prepare(grid, timeout, num_rounds)
        _, nodes = sample_nodes(grid, self.min_available_nodes, 0)
        log(WARNING, "FLDC trains one global model for all nodes: its DBSCAN clusters "
            "(at most %d with %d nodes and min_pts=%d, each of at least %d nodes) only "
            "choose which nodes train each round, so groups whose data conflict get no "
            "model of their own; for one model per group use a strategy with cluster "
            "models (IFCA, CFL, ACFL, FedSoft, FL+HC, WeCFL, FedEM)",
            len(nodes) // self.min_pts, len(nodes), self.min_pts, self.min_pts)

    # ----------------------------------------------------------------- training
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Round 0: every node; afterwards a share ``r`` of every DBSCAN cluster."""
        self._current = arrays
        if self.clustering is None:
            nodes = self.sample(grid, 1.0)
            if len(nodes) < self.min_pts:
                raise ValueError(
                    f"FLDC clusters the round-0 models of {len(nodes)} nodes, fewer than "
                    f"min_pts={self.min_pts}; lower 'fldc-min-pts' or add nodes"
                )
            if len(nodes) < 2 * self.min_pts:
                # A DBSCAN cluster holds a core node with min_pts nodes within eps,
                # itself included: a smaller group cannot form a cluster of its own.
                log(WARNING, "FLDC: %d nodes, min_pts=%d: a group of fewer than %d nodes "
                    "cannot form its own DBSCAN cluster, so two groups of %d nodes are not "
                    "told apart; pass FLDC(min_pts=2) (fldc-min-pts=2) or run more nodes",
                    len(nodes), self.min_pts, self.min_pts, len(nodes) // 2)
        else:
            self._place_newcomers(grid)
            known = sorted(self._strata, key=self.node_order)
            chosen = stratified_sample(
                np.array([self._strata[node] for node in known], dtype=np.int64),
                self.r,
                self.rng,
            )
            nodes = [known[int(i)] for i in chosen]
        node_config = self.round_config(config, server_round)
        if self.clustering is None:
            self._round0_config = node_config
        record = RecordDict({p.ARRAYS: arrays, p.CONFIG: node_config})
        log(INFO, "configure_train: %d nodes (%s)", len(nodes),
            "round 0, all nodes" if self.clustering is None else "stratified sample")
        return self.broadcast(nodes, record, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Cluster the round-0 models once; weighted FedAvg of the replies every round."""
        valid = self.check_replies(replies, self._current, "aggregate_train", trains=True)
        round0 = self.clustering is None
        if round0:
            if len(valid) < self.min_pts:
                # Too few models to find dense regions this round: average what came
                # and ask every node again next round instead of ending the run.
                log(WARNING, "round %d: only %d valid models for DBSCAN with min_pts=%d; "
                    "clustering again next round (lower 'fldc-min-pts' or fix the failing "
                    "nodes if this persists)", server_round, len(valid), self.min_pts)
            else:
                valid = self._cluster(server_round, valid)
        if not valid:
            return None, None
        losses = [float(m.content.metric_records[p.METRICS][p.M_TRAIN_LOSS]) for m in valid]  # type: ignore[arg-type]
        metrics = MetricRecord(
            {p.M_TRAIN_LOSS: float(np.mean(losses)), "num-trained": len(valid)}
        )
        if round0 and self.clustering is not None and not self.round0_average:
            # The paper's round 0 only clusters: round 1 starts from the initial model.
            return self._current, metrics
        return self.aggregate_cluster(server_round, 0, self._current, valid,
                                      weighted=True), metrics

    def _place_newcomers(self, grid: Grid) -> None:
        """Give nodes that joined after round 0 a stratum by DBSCAN's own rule.

        Each newcomer trains once from the model round 0 started from, with round
        0's settings; its model takes the label of the nearest core point within
        eps (:meth:`DensityClustering.predict`), or is noise. A node is asked once.
        """
        _, connected = sample_nodes(grid, self.min_available_nodes, 0)
        if self.nodes.started:
            self.learn_node_keys(grid, connected)
        newcomers = sorted(set(connected) - set(self.labels) - self._placement_asked,
                           key=self.node_order)
        if not newcomers or self.clustering is None:
            return
        self._placement_asked.update(newcomers)
        valid = self.train_once(newcomers, self._round0_model, self._round0_config, grid,
                                "fldc placement")
        if not valid:
            return
        names = list(self._round0_model.keys())
        points = flatten_models(reply_layers(valid, names))
        for msg, label in zip(valid, self.clustering.predict(points), strict=True):
            node = msg.metadata.src_node_id
            self.labels[node] = int(label)
            self.late_labels[node] = int(label)
            if label >= 0:
                self._strata[node] = int(label)
            log(INFO, "FLDC: node %d joined late; %s", node,
                f"stratum {label} (nearest core point)" if label >= 0 else "noise, not sampled")

    def _cluster(self, server_round: int, valid: list[Message]) -> list[Message]:
        """DBSCAN over the round-0 models; return the replies of clustered nodes."""
        names = list(self._current.keys())
        points = flatten_models(reply_layers(valid, names))
        self.clustering = DensityClustering(
            self.min_pts, self.eps, self.eps_method, standardize=self.standardized_distance
        ).fit(points)
        self._round0_model = self._current
        nodes = [m.metadata.src_node_id for m in valid]
        self.labels = {node: int(label) for node, label in zip(nodes, self.clustering.labels_,
                                                               strict=True)}
        self._strata = {node: label for node, label in self.labels.items() if label >= 0}
        found = self.clustering
        eps_source = (
            "given" if self.eps is not None
            else f"{self.eps_method} of the sorted {self.min_pts - 1}-distance curve"
        )
        # A silhouette compares clusters with each other: none exists below two.
        silhouette = (f"silhouette {found.silhouette_:.3f}" if found.num_clusters_ >= 2
                      else f"no silhouette ({found.num_clusters_} cluster, it needs 2)")
        log(INFO, "FLDC round %d DBSCAN: eps %.4g (%s), MinPts %d: %d clusters %s, %d noise "
            "nodes, %s", server_round, found.eps_, eps_source, self.min_pts,
            found.num_clusters_, np.bincount(found.labels_[found.labels_ >= 0]).tolist(),
            found.num_noise_, silhouette)
        if not self._strata:
            # No dense region at all: excluding everyone would stop training, so the
            # nodes form one stratum and FLDC samples like FedAvg.
            log(WARNING, "FLDC DBSCAN labelled every node noise; sampling all as one stratum")
            self._strata = dict.fromkeys(nodes, 0)
            return valid
        return [m for m in valid if self.labels[m.metadata.src_node_id] >= 0]

    # ------------------------------------------------------------------ results
    def summary_fields(self) -> dict[str, Any]:
        """DBSCAN's decisions: eps, its margin, silhouette, labels per node, noise, k-distances."""
        if self.clustering is None:
            return super().summary_fields()
        silhouette = self.clustering.silhouette_
        return {
            **super().summary_fields(),
            "eps": self.clustering.eps_,
            # How far the nearest pairwise distance lies from the radius DBSCAN used.
            "eps_margin": self.clustering.eps_margin_,
            "dbscan_radius": self.clustering.radius_,
            "eps_method": "given" if self.eps is not None else self.eps_method,
            "silhouette": None if np.isnan(silhouette) else silhouette,
            "num_noise_clients": self.clustering.num_noise_,
            "num_dbscan_clusters": self.clustering.num_clusters_,
            "min_pts": self.min_pts,
            "cluster_labels": {str(node): label for node, label in self.labels.items()},
            "late_labels": {str(node): label for node, label in self.late_labels.items()},
            "k_distance_curve": self.clustering.k_distances_.tolist(),
        }

    def scoring(self) -> Scoring:
        """DBSCAN's labels, noise included, once it clustered."""
        if self.clustering is None:
            return Scoring()
        return Scoring(density_labels={str(node): label for node, label in self.labels.items()})

    def write_artifacts(self, folder: Path) -> list[Path]:
        """Write the k-distance curve with the chosen eps as ``k_distance.png``."""
        if self.clustering is None:
            return []
        return [
            plot_k_distance(
                self.clustering.k_distances_, self.clustering.eps_, self.min_pts,
                folder / K_DISTANCE_PLOT,
            )
        ]

    def summary(self) -> None:
        """Log FLDC's settings."""
        log(INFO, "\t├──> FLDC: MinPts %d | eps %s | r %.2f", self.min_pts,
            self.eps_method if self.eps is None else f"{self.eps:g}", self.r)
        super().summary()
