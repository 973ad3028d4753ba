"""FedGroup: clients grouped once by the direction of their first update."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

import numpy as np
from fl_clusters.strategies.kit import (
    HardClusteredStrategy,
    Param,
    num_clusters_param,
    reply_updates,
    unpack_clusters,
)
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from sklearn.cluster import KMeans


def decomposed_cosine(updates: np.ndarray, directions: int) -> np.ndarray:
    """Each update's cosine similarity to the first ``directions`` principal directions.

    The directions are the right singular vectors of the update matrix (one row
    per client), strongest first. Rows of the result lie in a space of
    ``directions`` dimensions instead of the model's size, and the Euclidean
    distance between two rows is FedGroup's EDC between the two clients.
    """
    _, _, basis = np.linalg.svd(updates, full_matrices=False)
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    # A client that did not move has no direction: it is equally far from all.
    return (updates @ basis[:directions].T) / np.maximum(norms, np.finfo(updates.dtype).tiny)


class FedGroup(HardClusteredStrategy):
    """FedGroup: one grouping of the clients by EDC, then FedAvg within each group.

    In round 1 every sampled client trains the initial model. The server takes
    their updates, measures each against the update matrix's first principal
    directions (the decomposed cosine similarity, whose Euclidean distance is
    the paper's EDC) and groups them with k-means into K groups; each group's
    model is the example-weighted mean of its members' models. From round 2 on
    every client trains its group's model and each group averages its members
    (the groups stay as round 1 made them). A client that joins later trains the
    initial model once and joins the group whose mean round-1 update is nearest
    to its own in cosine distance (the authors' code measures it from the average
    of the group models; the initial model compares it with what the groups were
    made from).

    Parameters
    ----------
    num_clusters : int (default: 2)
        K, the number of groups, >= 1.
    directions : int (default: 3)
        The principal directions of the round-1 updates each update is measured
        against (the authors' code takes 3).
    **kwargs
        The shared arguments; see :class:`~fl_clusters.strategies.kit.HardClusteredStrategy`.
    """

    name = "fedgroup"  # run config: strategy = "fedgroup"
    paper = "Duan et al., FedGroup, IEEE ISPA 2021 (arXiv:2010.06870)"
    params = (
        num_clusters_param(2),  # the shared run-config key num-clusters
        Param("directions", 3, "int",
              "FedGroup: principal directions the round-1 updates are measured against",
              low=1),
    )

    def __init__(self, num_clusters: int = 2, *, directions: int = 3, **kwargs: Any) -> None:
        super().__init__(num_clusters=num_clusters, directions=directions, **kwargs)
        # The model round 1 trains (every update is measured from it), and each
        # group's mean update once the clients are grouped.
        self.start: ArrayRecord | None = None
        self.group_updates: np.ndarray | None = None

    def federation_problem(self, num_nodes: int) -> str | None:
        """Round 1 groups the trained models: K groups need K nodes."""
        if num_nodes >= self.num_clusters:
            return None
        return (f"FedGroup groups round 1's trained models into {self.num_clusters} groups, "
                f"but the federation has {num_nodes} node(s). Fix: run more nodes or lower "
                "num-clusters")

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Keep the model every client trains until the clients are grouped, then send."""
        if self.group_updates is None:
            self.start = unpack_clusters(arrays)[0]
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_members(
        self, server_round: int, members: dict[int, list[Message]]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Group the clients by EDC once; afterwards average each group's members."""
        if self.group_updates is not None:
            return super().aggregate_members(server_round, members)
        trained = [msg for cluster in sorted(members) for msg in members[cluster]]
        if self.start is None or len(trained) < self.num_clusters:
            return None, None  # not grouped: the next round trains the initial model again
        updates = reply_updates(trained, self.start)
        features = decomposed_cosine(updates, self.directions)
        labels = KMeans(self.num_clusters, n_init=10, random_state=self.seed).fit_predict(
            features)
        groups: dict[int, list[Message]] = {}
        for msg, label in zip(trained, labels, strict=True):
            groups.setdefault(int(label), []).append(msg)
        self.group_updates = np.stack([
            updates[labels == group].mean(axis=0) if group in groups
            else np.zeros(updates.shape[1], updates.dtype) for group in range(self.num_clusters)])
        log(INFO, "round %d: FedGroup: %d clients in %d groups by EDC: sizes %s", server_round,
            len(trained), self.num_clusters, {j: len(g) for j, g in sorted(groups.items())})
        return self.aggregate_clusters(server_round, [self.start] * self.num_clusters, groups)

    def place_newcomers(
        self, server_round: int, nodes: list[int], config: ConfigRecord, grid: Grid
    ) -> None:
        """A client that joins once the groups are made trains the initial model once and
        joins the group of the nearest mean update."""
        if self.group_updates is None or self.start is None:
            return  # not grouped yet: it trains the initial model with the others
        self.place_by_update(server_round, nodes, self.start, self.group_updates, config, grid,
                             "cosine")
