"""How k centres start: from ``initial_arrays``, or from a local-k-means warm start.

:class:`CentresFromStart` is the base of every strategy that keeps k centres
(IFCA's cluster models, FedEM's components, FedSoft's cluster models). It owns
the one way they start, as scikit-learn's ``_BaseKMeans._init_centroids`` is
the one start of its k-means family:

- Packed ``initial_arrays`` are used as given (their number of clusters must be
  ``num_clusters``); a plain model goes to the :meth:`~CentresFromStart.initialize`
  hook, which draws k centres from it (IFCA's and FedSoft's independent draws,
  FedEM's "the given model and M - 1 draws").
- With ``init="local-kmeans"`` (and k > 1) round 1 is a warm start instead:
  from k random models every cluster fits every client about equally, and the
  first assignments carry no information. Every warm-start node trains the single
  initial model, k-means groups their models, and the
  :meth:`~CentresFromStart.centres_from_groups` hook turns group j into centre j
  (each strategy averages its own way).

A warm start that cannot give k-means one local model per cluster (too few nodes
sampled, or too few valid replies) has one behaviour: it logs why, returns no
aggregate, and is repeated the next round (Flower passes the unchanged plain model
on). A round in which no valid reply came at all counts towards
``max_failed_rounds``, so a run whose every warm start fails ends with the nodes'
errors instead of going on.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, ClassVar, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.clustering import group_by_kmeans, warm_start_points
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.replies import describe_steps_done, reply_layers, reply_updates

# What k-means groups in a warm start: the output layer's updates less their mean
# row (warm_start_points), or each node's whole flattened update.
KMeansFeatures = Literal["output-layer", "whole-update"]


def kmeans_start_problem(
    name: str, init: str, num_nodes: int, fraction: float, num_clusters: int, fix: str
) -> str | None:
    """Why a warm start that clusters one local model per node cannot run, or ``None``.

    Parameters
    ----------
    name : str
        The strategy's name, for the message.
    init : str
        The strategy's start; only ``"local-kmeans"`` needs the nodes.
    num_nodes : int
        Connected nodes.
    fraction : float
        The share of them the warm start samples.
    num_clusters : int
        Clusters k-means must find (one local model each at least).
    fix : str
        The strategy's own way out (e.g. its random initialisation's key).
    """
    sampled = max(1, round(num_nodes * fraction))
    if init != "local-kmeans" or sampled >= num_clusters:
        return None
    needed = nodes_sampling(num_clusters, fraction)
    more = (
        "raise fraction-train (it samples one node at 0)" if needed is None
        else f"run {needed} nodes or more (simulation: flwr run . --federation-config "
        f"\"num-supernodes={needed}\"; deployment: {needed} SuperNodes, deploy/start.sh -n "
        f"{needed})"
    )
    return (
        f"{name} needs at least {num_clusters} nodes in its first training round (k-means "
        f"groups one local model per node into {num_clusters} clusters), but the federation "
        f"has {num_nodes} node(s) and the round samples {sampled}. Fix: {more}, lower "
        f"num-clusters (--run-config \"num-clusters=...\"), or {fix}"
    )


def nodes_sampling(count: int, fraction: float) -> int | None:
    """The fewest nodes of which sampling ``fraction`` draws ``count`` (as the strategies do).

    ``None`` when no number of nodes does: a fraction of 0 samples one node.
    """
    if fraction <= 0.0:
        return None if count > 1 else 1
    nodes = max(count, math.floor((count - 0.5) / fraction))
    while max(1, round(nodes * fraction)) < count:
        nodes += 1
    return nodes


@dataclass(frozen=True)
class KMeansStart:
    """The k-means groups of a warm start's local models.

    Parameters
    ----------
    replies : list[Message]
        The valid warm-start replies, in node order.
    groups : np.ndarray
        (N,) the group of each reply, in [0, num_clusters).
    num_clusters : int
        k, the number of groups.
    model : ArrayRecord
        The single model every node trained from.
    """

    replies: list[Message]
    groups: np.ndarray
    num_clusters: int
    model: ArrayRecord

    def members(self) -> list[list[Message]]:
        """The replies of each group (a group k-means left empty has none)."""
        return [[m for m, g in zip(self.replies, self.groups, strict=True) if g == j]
                for j in range(self.num_clusters)]

    def node_groups(self) -> dict[int, int]:
        """Node id -> its group."""
        return {m.metadata.src_node_id: int(g)
                for m, g in zip(self.replies, self.groups, strict=True)}

    def sizes(self) -> list[int]:
        """The size of every group."""
        return np.bincount(self.groups, minlength=self.num_clusters).astype(int).tolist()

    def log(self, name: str, server_round: int, asked_steps: int | None) -> None:
        """Log what the local training did and the groups' sizes."""
        log(INFO, "round %d: %s warm start: %s; k-means groups of sizes %s", server_round,
            name, describe_steps_done(self.replies, asked_steps), self.sizes())


def group_local_models(
    valid: list[Message],
    start: ArrayRecord,
    num_clusters: int,
    seed: int,
    features: KMeansFeatures = "output-layer",
) -> KMeansStart:
    """Group the warm start's local models by k-means.

    Parameters
    ----------
    valid : list[Message]
        At least ``num_clusters`` valid replies, in node order.
    start : ArrayRecord
        The model every node trained from.
    num_clusters : int
        k.
    seed : int
        Seed of k-means.
    features : str (default: "output-layer")
        What k-means groups: ``"output-layer"``, the output layer's updates
        (:func:`~fl_clusters.clustering.warm_start_points`), or
        ``"whole-update"``, each reply's whole flattened update.
    """
    if features == "whole-update":
        points = reply_updates(valid, start)
    else:
        names = list(start.keys())
        points = warm_start_points([start[n].numpy() for n in names], reply_layers(valid, names))
    return KMeansStart(valid, group_by_kmeans(points, num_clusters, seed), num_clusters, start)


class CentresFromStart(ClusteredStrategy):
    """Base of the strategies with k centres: their one start and one warm start.

    See the module's docstring. A subclass declares an ``init`` parameter
    (``"local-kmeans"`` or its random start) and implements
    :meth:`initialize` and :meth:`centres_from_groups`, and its rounds as
    :meth:`configure_centres` and :meth:`aggregate_centres`: ``configure_train``
    runs the warm start when it is due and otherwise hands the round's k centres
    (:meth:`initial_centres`, kept for its aggregation) to ``configure_centres``;
    ``aggregate_train`` ends the warm start in its round and otherwise calls
    ``aggregate_centres``.

    Attributes
    ----------
    warm_start_features : str
        What the warm start's k-means groups (:func:`group_local_models`); a
        declared choice of each strategy, since it changes which clients group.
    warm_start_groups : dict[int, int]
        Node id -> its warm-start group (empty until a warm start succeeds).
    """

    warm_start_features: ClassVar[KMeansFeatures] = "output-layer"
    init: str
    init_steps: int

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self.warm_start_groups: dict[int, int] = {}
        self._warm_start_round: int | None = None
        self._warm_start_model = ArrayRecord()
        self._warm_start_steps: int | None = None  # the local-steps asked (None: epochs)
        # The packed k centres the round's nodes train from (what they aggregate onto).
        self._current = ArrayRecord()

    # ------------------------------------------------------------ rounds
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The warm start when due; else the round's k centres to :meth:`configure_centres`."""
        if self.warm_start_due(arrays):
            return self.configure_warm_start(server_round, arrays, config, grid)
        self._current = self.initial_centres(arrays, grid)
        return self.configure_centres(server_round, self._current, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The warm start's centres in its round; else :meth:`aggregate_centres`."""
        if self.in_warm_start(server_round):
            return self.aggregate_warm_start(server_round, replies)
        return self.aggregate_centres(server_round, replies)

    @abstractmethod
    def configure_centres(
        self, server_round: int, centres: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's train messages, from its packed k ``centres``."""

    @abstractmethod
    def aggregate_centres(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new packed centres from the round's replies (the centres sent: ``_current``)."""

    # ------------------------------------------------------------ hooks
    def initialize(self, model: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Hook: the k centres, packed, drawn from the plain ``model`` (``grid``: to score).

        Parameters
        ----------
        model : ArrayRecord
            The plain ``initial_arrays``.
        grid : Grid | None
            The grid, for a strategy that asks the nodes to pick among candidates
            (IFCA's restarts); ``None`` when there is none to ask.
        """
        raise NotImplementedError

    def centres_from_groups(
        self, server_round: int, start: KMeansStart
    ) -> tuple[ArrayRecord, MetricRecord]:
        """Hook: the k packed centres from the warm start's groups, and the round's metrics.

        A group k-means left empty (identical updates) has no members; its centre
        should be a random draw (as in the random start) rather than a copy of
        another that would never win.
        """
        raise NotImplementedError

    def warm_start_nodes(self, grid: Grid) -> list[int]:
        """The nodes that train the initial model: ``fraction_train`` of them."""
        return self.sample(grid, self.fraction_train)

    def warm_start_fraction(self) -> float:
        """The share of the nodes :meth:`warm_start_nodes` takes (for the start-up check)."""
        return self.fraction_train

    def warm_start_config(self, config: ConfigRecord, server_round: int) -> ConfigRecord:
        """The warm start's node config: the round's, with ``init_steps`` local steps."""
        node_config = self.round_config(config, server_round)
        node_config[p.CFG_STEPS] = self.init_steps
        return node_config

    # ------------------------------------------------------------ the start
    def initial_centres(self, arrays: ArrayRecord, grid: Grid | None = None) -> ArrayRecord:
        """Packed ``arrays`` as given (k checked), else :meth:`initialize`'s draw."""
        if not p.is_packed(arrays):
            return self.initialize(arrays, grid)
        if p.num_packed_clusters(arrays) != self.num_clusters:
            raise ValueError(
                f"initial_arrays pack {p.num_packed_clusters(arrays)} clusters but "
                f"num_clusters={self.num_clusters}; pass a plain model or "
                f"{self.num_clusters} packed ones"
            )
        return arrays

    def warm_start_due(self, arrays: ArrayRecord) -> bool:
        """Whether this round is a warm start: a plain model and ``init="local-kmeans"``."""
        return not p.is_packed(arrays) and self.init == "local-kmeans" and self.num_clusters > 1

    def in_warm_start(self, server_round: int) -> bool:
        """Whether ``server_round``'s replies answer a warm start."""
        return server_round == self._warm_start_round

    def federation_problem(self, num_nodes: int) -> str | None:
        """The k-means warm start needs a local model per cluster in round 1."""
        return kmeans_start_problem(type(self).__name__, self.init, num_nodes,
                                    self.warm_start_fraction(), self.num_clusters,
                                    f"set {self._random_start()}")

    def _random_start(self) -> str:
        return f"{self.name}-init='random'"

    def configure_warm_start(
        self, server_round: int, model: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Every warm-start node trains the single initial ``model`` (none if too few)."""
        self._warm_start_round = server_round
        self._warm_start_model = model
        nodes = self.warm_start_nodes(grid)
        name = type(self).__name__
        if len(nodes) < self.num_clusters:
            log(WARNING, "round %d: %s warm start: %d nodes for %d clusters; k-means needs "
                "one local model per cluster, so the warm start is repeated next round. "
                "Sample more nodes (fraction-train), add nodes, or use %s", server_round, name,
                len(nodes), self.num_clusters, self._random_start())
            return []
        node_config = self.warm_start_config(config, server_round)
        steps = node_config.get(p.CFG_STEPS)
        self._warm_start_steps = int(steps) if steps is not None else None  # type: ignore[arg-type]
        log(INFO, "configure_train: %s warm start, %d nodes train the initial model "
            "(asked for %s local steps)", name, len(nodes), self._warm_start_steps)
        record = RecordDict({p.ARRAYS: model, p.CONFIG: node_config})
        return self.broadcast(nodes, record, MessageType.TRAIN)

    def aggregate_warm_start(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Group the local models by k-means; :meth:`centres_from_groups` makes the centres."""
        self._warm_start_round = None
        name = type(self).__name__
        model = self._warm_start_model
        valid = self.check_replies(replies, model, f"{name} warm start", trains=True)
        if not valid:
            return None, None
        if len(valid) < self.num_clusters:
            log(WARNING, "round %d: %s warm start: %d valid local models for %d clusters; "
                "k-means needs one per cluster, so the warm start is repeated next round. If "
                "this persists, sample more nodes (fraction-train), fix the failing nodes, or "
                "use %s", server_round, name, len(valid), self.num_clusters,
                self._random_start())
            return None, None
        start = group_local_models(valid, model, self.num_clusters, self.seed,
                                   self.warm_start_features)
        self.warm_start_groups = start.node_groups()
        # The hard view until the strategy's own clustering replaces it.
        self.assignments.update(self.warm_start_groups)
        start.log(name, server_round, self._warm_start_steps)
        return self.centres_from_groups(server_round, start)
