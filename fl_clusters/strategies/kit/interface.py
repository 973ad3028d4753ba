"""What fl-clusters' ServerApp asks of a strategy, beyond Flower's ``Strategy``.

Every strategy the run config names implements it: the clustered strategies
through :class:`~fl_clusters.strategies.kit.base.ClusteredStrategy`, Flower's FedAvg
and FedProx through :class:`~fl_clusters.strategies.kit.flower_baseline.FlowerBaseline`.
The ServerApp, the checkpoints and the results use nothing else, so none of
them needs to know which kind of strategy runs.

What every strategy must implement is small: Flower's five methods, plus
:meth:`ServerStrategy.adopt_identities` and :meth:`ServerStrategy.prepare`.
Every other hook has a default that means "nothing of this kind" (no server-side
clusters, no extra summary fields, no files). Hooks only some algorithms have are
optional capabilities, :class:`ClusterFeatureSource` (MCFL's cluster features)
and :class:`SimilaritySource` (a client similarity matrix): the results use them
where a strategy implements them.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_clusters.handshake import NodeIdentities, NodeRegistry

# Round -> node id -> the cluster it used; round -> cluster -> its users' accuracy.
RoundHistory = tuple[dict[int, dict[int, int]], dict[int, dict[int, float]]]


@dataclass(frozen=True)
class Scoring:
    """What of a strategy's clustering :mod:`fl_clusters.results` scores against the truth.

    The strategy says what it decided; the ground truth is only read after
    training, from the nodes' final reports. Node ids are strings, as in
    ``summary.json``.

    Parameters
    ----------
    soft_weights : Mapping[str, Sequence[float]] | None
        Each node's weight of every cluster model (FedSoft's u, FedEM's pi),
        scored against the nodes' true mixtures.
    density_labels : Mapping[str, int] | None
        A density clustering's label per node, -1 for noise (FLDC), scored
        against the true groups with the randomized nodes as one group.
    labellings : Mapping[str, Mapping[str, int]]
        Further hard clusterings to score by ARI: the ``summary.json`` key of
        the score -> node id -> label (e.g. ``"warm_start_ari"``).
    report_mixture : bool
        Whether the final report asks every node for the accuracy of its
        mixture of the cluster models (FedEM) besides the model it uses.
    """

    soft_weights: Mapping[str, Sequence[float]] | None = None
    density_labels: Mapping[str, int] | None = None
    labellings: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    report_mixture: bool = False


class ClusterAssignment(NamedTuple):
    """One node's cluster in one evaluated round (:meth:`ServerStrategy.cluster_assignments`)."""

    round: int
    node_id: int
    # The node config's partition-id as the node reported it at the start-up
    # handshake; None for a node whose config has none.
    partition_id: int | None
    cluster: int


class ServerStrategy(Strategy):
    """A Flower strategy that fl-clusters' ServerApp can run, checkpoint and report on.

    Attributes
    ----------
    nodes : NodeRegistry
        The nodes the strategy knows by stable key; it orders and samples them.
    rejected_replies : int
        Replies the strategy could not use (errors, malformed), for the summary.
    final_round : int | None
        The run's last round, set by :meth:`prepare` (``None``: not known yet):
        its evaluation reaches every node (:meth:`evaluated_share`).
    """

    nodes: NodeRegistry
    rejected_replies: int
    final_round: int | None = None

    @abstractmethod
    def adopt_identities(self, identities: NodeIdentities) -> None:
        """Take what the ServerApp's start-up handshake found, before round 1."""

    @abstractmethod
    def prepare(self, grid: Grid, timeout: float, num_rounds: int) -> None:
        """Get ready for the first round this process runs (a fresh or resumed run).

        Parameters
        ----------
        grid : Grid
            The grid of the run.
        timeout : float
            Seconds every send waits for replies (the rounds' timeout).
        num_rounds : int
            The run's last round (absolute: a resumed run's rounds before the
            checkpoint count).
        """

    def evaluated_share(self, server_round: int, fraction: float) -> float:
        """The share of nodes ``server_round`` evaluates: ``fraction``, every node in the last.

        A round's evaluation samples ``fraction`` of the nodes (run-config key
        ``fraction-evaluate``), so that its cost follows the sample, not the
        federation; the last round's accuracy is every node's, like the final
        report. 0 (no evaluation) stays 0.
        """
        return 1.0 if fraction > 0.0 and server_round == self.final_round else fraction

    def federation_problem(self, num_nodes: int) -> str | None:
        """Why the strategy cannot run on ``num_nodes`` connected nodes; ``None``: it can.

        Asked before round 1, so that such a run stops with the fix instead of
        failing inside a round. Any federation will do by default.
        """
        return None

    def checkpoint_state(self) -> dict[str, Any]:
        """The attributes a checkpoint keeps (:mod:`fl_clusters.checkpoint`).

        A resumed run builds the strategy from the run config as the run did and
        sets these back. Values must be of the types a checkpoint keeps: numbers,
        strings, containers of them, numpy arrays and generators, Flower's records
        and fl-clusters' own objects.
        """
        return dict(vars(self))

    def assignment_for(self, node_id: int) -> int | None:
        """Cluster of ``node_id`` decided by the server; ``None`` (default): the node decides."""
        return None

    def round_history(self) -> RoundHistory | None:
        """Per evaluated round, each node's cluster and each cluster's accuracy.

        ``None`` (the default) for a strategy that keeps no clusters.
        """
        return None

    def round_clusters(self, server_round: int) -> tuple[dict[int, int] | None, int]:
        """The clusters of ``server_round``, for its progress line.

        Returns
        -------
        tuple[dict[int, int] | None, int]
            Node id -> the cluster it used at the round's evaluation (``None``: not
            recorded), and how many clusters are in use (1 with none recorded).
        """
        history = self.round_history()
        used = history[0].get(server_round) if history is not None else None
        return used, len(set(used.values())) if used else 1

    def cluster_assignments(self) -> list[ClusterAssignment]:
        """Each node's cluster in every evaluated round, for the app's own ServerApp.

        The cluster a node used at the round's evaluation: the one the server
        assigned it, or, where the server assigns none, the model of lowest loss
        the node chose; ordered by round, then partition id (node id where none). Node
        ids are Flower's (random per run in simulation), so the partition id is
        the one to join with your data. Empty for a strategy that keeps no
        clusters (Flower's FedAvg and FedProx).
        """
        history = self.round_history()
        if history is None:
            return []
        rows = [
            ClusterAssignment(server_round, node, self.nodes.partitions.get(node), cluster)
            for server_round, used in history[0].items()
            for node, cluster in used.items()
        ]
        return sorted(rows, key=lambda row: (
            row.round, row.partition_id is None, row.partition_id or 0, row.node_id))

    def preset_fields(self) -> dict[str, Any]:
        """The preset the strategy ran (``preset``), what it set (``preset_changes``) and
        the arguments given against it (``preset_kept``).

        Empty for a strategy without presets (Flower's own).
        """
        return {}

    def summary_fields(self) -> dict[str, Any]:
        """Strategy-specific entries for the run's ``summary.json`` (JSON-serializable).

        What the algorithm decided (split rounds, trial counts, DBSCAN's eps...);
        none by default. Ground truth is never available here: scores against it
        are computed by :mod:`fl_clusters.results` from these fields.
        """
        return {}

    def scoring(self) -> Scoring:
        """What of the strategy's clustering is scored against the truth; nothing by default."""
        return Scoring()

    def write_artifacts(self, folder: Path) -> list[Path]:
        """Write strategy-specific files (plots...) into a run's results folder.

        Called by the ServerApp after ``summary.json`` is written; returns the
        paths written (none by default).
        """
        return []


@runtime_checkable
class ClusterFeatureSource(Protocol):
    """A strategy that keeps a feature per cluster (MCFL's mean inputs).

    The results score the feature-based choice of every node against the truth
    (:func:`fl_clusters.results.mcfl_scores`).
    """

    def mcfl_cluster_features(self, num_clusters: int) -> np.ndarray | None:
        """The (k, D) cluster features, or ``None`` when there are none in this run."""


@runtime_checkable
class SimilaritySource(Protocol):
    """A strategy that compares its clients pairwise (ACFL's cosine of updates...)."""

    def similarity_matrix(self) -> tuple[list[int], np.ndarray] | None:
        """The final pairwise similarity of the clients the strategy clustered.

        The node ids of the rows with the (n, n) matrix, so that the run plots it;
        ``None`` when none was computed.
        """
