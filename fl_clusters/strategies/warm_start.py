"""The local-k-means warm start that IFCA, FedEM and FedSoft share.

From k random models every cluster fits every client about equally, and the
first assignments carry no information. The warm start spends round 1 instead
on one local model per client: every sampled client trains the single initial
model, k-means groups their models, and cluster j starts from group j's models
(each strategy averages them its own way).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log

from fl_clusters import protocol as p
from fl_clusters.clustering import group_by_kmeans, warm_start_points
from fl_clusters.strategies.replies import describe_steps_done, reply_layers


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


def warm_start_messages(
    nodes: Iterable[int], model: ArrayRecord, config: ConfigRecord
) -> list[Message]:
    """One train message per node, all carrying the single initial ``model``."""
    record = RecordDict({p.ARRAYS: model, p.CONFIG: config})
    return [Message(content=record, dst_node_id=node, message_type=MessageType.TRAIN)
            for node in nodes]


def enough_local_models(
    name: str, server_round: int, valid: list[Message], num_clusters: int, fix: str
) -> bool:
    """Whether k-means can group ``valid``; if not, log that the warm start is repeated.

    A round that lost most replies must not end the run: the strategy returns no
    aggregate, so the next round warm-starts again, and the failed-round limit
    ends a run whose every round fails.
    """
    if not valid:
        return False
    if len(valid) < num_clusters:
        log(WARNING, "round %d: %s warm start: %d valid local models for %d clusters; "
            "k-means needs one per cluster, so the warm start is repeated next round. If "
            "this persists, sample more nodes (fraction-train), fix the failing nodes, or "
            "use %s", server_round, name, len(valid), num_clusters, fix)
        return False
    return True


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
    """

    replies: list[Message]
    groups: np.ndarray
    num_clusters: int

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
    points: np.ndarray | None = None,
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
    points : np.ndarray | None
        What k-means groups, one row per reply; ``None``: the output layer's
        updates (:func:`~fl_clusters.clustering.warm_start_points`).
    """
    if points is None:
        names = list(start.keys())
        points = warm_start_points([start[n].numpy() for n in names], reply_layers(valid, names))
    return KMeansStart(valid, group_by_kmeans(points, num_clusters, seed), num_clusters)
