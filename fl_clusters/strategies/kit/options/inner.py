"""A Flower strategy inside each cluster: the option of every hard-clustering strategy.

Each cluster averages its members with the strategy's own mean by default (each
paper's). With ``inner`` (a Flower strategy object) or the run-config keys
``inner-aggregation`` and ``inner-options``, every cluster gets its own copy of
that Flower strategy, so a stateful one (FedAdam's moments, FedAvgM's momentum)
keeps one state per cluster, in the checkpoint with the rest. A cluster with too
few members for the rule (Krum's n > 2f + 2) falls back to the mean, with a
warning, and the run's summary counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.common.logger import log
from flwr.serverapp.strategy import Strategy

from fl_clusters.params import Param
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.inner_aggregation import (
    INNER_STRATEGIES,
    MEAN,
    InnerAggregationError,
    aggregate_with,
    build_inner,
    describe,
    restored,
    strategy_state,
    too_few_members,
    usable_problem,
)
from fl_clusters.strategies.kit.replies import average_replies

INNER_PARAMS = (
    Param("inner", None, "object", "a Flower strategy that aggregates each cluster's members",
          instance_of=Strategy, allow_none=True, run_config=False,
          doc="A Flower strategy object (``FedTrimmedAvg(beta=0.2)``, ``FedMedian()``, "
          "``Krum(num_malicious_nodes=1)``, ``FedAdam()``...) that aggregates each "
          "cluster's members in place of the strategy's own mean; each cluster gets its own "
          "copy (stateful ones keep per-cluster state). ``None``: the strategy's own mean, "
          "or ``inner_aggregation``'s."),
    Param("inner_aggregation", MEAN, "str",
          "Flower strategy that aggregates each cluster's members ('mean': the strategy's "
          "own)", choices=(MEAN, *INNER_STRATEGIES), key="inner-aggregation",
          doc="The Flower strategy, by name, that aggregates each cluster's members "
          "(``'fedmedian'``, ``'fedtrimmedavg'``, ``'krum'``, ``'multikrum'``, ``'bulyan'``, "
          "``'fedadam'``, ``'fedyogi'``, ``'fedadagrad'``, ``'fedavgm'``, "
          "``'dp-fixed-clipping'``, ``'dp-adaptive-clipping'`` (server-side, around "
          "FedAvg), ``'fedavg'``); ``'mean'`` keeps the strategy's own mean."),
    Param("inner_options", "", "str",
          "the inner Flower strategy's arguments, 'name=value' items separated by commas",
          key="inner-options",
          doc="The inner strategy's constructor arguments as Flower names them, "
          "``'name=value'`` items separated by commas (``'beta=0.2'``, "
          "``'num_malicious_nodes=1'``); an argument the class does not take is refused "
          "with the list of those it takes."),
)
# Attributes a checkpoint leaves out: Flower objects, built again from the
# arguments; their per-cluster state is kept as data in ``inner_states``.
_REBUILT = ("inner", "_states_before")


class InnerAggregationOption(ClusteredStrategy):
    """Flower's aggregating strategies inside each cluster (``inner``, ``inner-aggregation``).

    The default (``'mean'``) is each paper's own mean. Otherwise every cluster
    averages its members with its own copy of the Flower strategy: Flower's class
    does the arithmetic, on one reply per member carrying the model and its
    example count (1 each where the strategy's rule is a plain mean). A
    stateful strategy keeps one state per cluster (FedAdam's moments, FedAvgM's
    momentum, an adaptive clipping norm), saved in the checkpoint, and steps from
    the model the cluster's members trained from. A cluster's copy follows its
    index: a cluster that a split, a cut or IFCA's re-seeding creates starts
    fresh. A cluster with too few members for the rule (Krum and MultiKrum need
    n > 2f + 2, Bulyan n >= 4f + 3), or whose strategy aggregates nothing,
    averages with the mean this round, with a warning; the run's summary lists
    each (``inner_fallbacks``). DP noise draws from a generator seeded by the
    run's seed, the round and the cluster, so a run repeats. Refused: IFCA's
    gradient mode (the rule aggregates models), Flower's client-side DP and
    non-FedAvg strategies, and the soft strategies (FedSoft and FedEM weigh
    every client into every cluster; local-only aggregates nothing).
    :meth:`aggregate_cluster` is what a strategy calls to average one cluster.
    """

    params = INNER_PARAMS
    inner: Strategy | None
    inner_aggregation: str
    inner_options: str

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        if self.inner is not None and (self.inner_aggregation != MEAN or self.inner_options):
            raise InnerAggregationError(
                "give the inner aggregation once: inner (a Flower strategy object) or "
                "inner_aggregation/inner_options (its name and arguments), not both")
        if self.inner is None:
            self.inner = build_inner(self.inner_aggregation, self.inner_options)
        elif (problem := usable_problem(self.inner)) is not None:
            raise InnerAggregationError(f"inner: {problem}")
        # Per cluster, the plain-data state of its Flower strategy after its last round:
        # the one source its copy is rebuilt from each round (and the checkpoint keeps).
        self.inner_states: dict[int, dict[str, Any]] = {}
        # Per cluster, its state before its last aggregation (for aggregating it again).
        self._states_before: dict[int, dict[str, Any] | None] = {}
        self.inner_fallbacks: list[dict[str, Any]] = []

    def aggregate_cluster(
        self,
        server_round: int,
        cluster: int,
        start: ArrayRecord,
        replies: Sequence[Message],
        *,
        weighted: bool,
        again: bool = False,
    ) -> ArrayRecord:
        """Cluster ``cluster``'s new model (the keys of ``start``) from its members' replies.

        Parameters
        ----------
        server_round : int
            The round.
        cluster : int
            The cluster's index (whose inner strategy state is used; -1 for arrays
            shared by every cluster).
        start : ArrayRecord
            The model the members trained from, in the keys aggregated.
        replies : Sequence[Message]
            The members' valid training replies (at least one).
        weighted : bool
            Weigh members by their examples (the strategy's own rule decides).
        again : bool
            The cluster was aggregated already this round (its members are being
            regrouped): its inner strategy starts again from its state before.
        """
        if self.inner is None:
            return average_replies(replies, list(start.keys()), weighted=weighted)
        if not again:
            self._states_before[cluster] = self.inner_states.get(cluster)
        strategy = restored(self.inner, self._states_before.get(cluster))
        why = too_few_members(strategy, len(replies))
        arrays = None
        if why is None:
            arrays = self._seeded(server_round, cluster, strategy, start, replies, weighted)
            why = None if arrays is not None else (
                f"{type(strategy).__name__} aggregated no model")
        if arrays is None:
            log(WARNING, "round %d: cluster %d's %d members averaged with the mean: %s",
                server_round, cluster, len(replies), why)
            self.inner_fallbacks.append({"round": server_round, "cluster": cluster,
                                         "members": len(replies), "why": why})
            return average_replies(replies, list(start.keys()), weighted=weighted)
        self.inner_states[cluster] = strategy_state(strategy)
        return arrays

    def forget_inner(self, cluster: int) -> None:
        """Start cluster ``cluster``'s inner strategy afresh (it became another cluster)."""
        for kept in (self.inner_states, self._states_before):
            kept.pop(cluster, None)

    def _seeded(
        self, server_round: int, cluster: int, strategy: Strategy, start: ArrayRecord,
        replies: Sequence[Message], weighted: bool,
    ) -> ArrayRecord | None:
        """:func:`aggregate_with` under numpy's global generator seeded from (seed, round,
        cluster): Flower's DP noise draws from it, and a run must repeat from its seed."""
        saved = np.random.get_state()
        np.random.seed(np.random.SeedSequence(
            [self.seed, server_round, cluster + 1]).generate_state(1)[0])
        try:
            return aggregate_with(strategy, server_round, start, replies, weighted=weighted)
        finally:
            np.random.set_state(saved)

    def checkpoint_state(self) -> dict[str, Any]:
        """The base's, without the Flower objects (their state is in ``inner_states``)."""
        state = super().checkpoint_state()
        for name in _REBUILT:
            state.pop(name, None)
        return state

    def summary_fields(self) -> dict[str, Any]:
        """The inner aggregation and the clusters that fell back to the mean."""
        return {**super().summary_fields(), "inner_aggregation": describe(self.inner),
                "inner_fallbacks": list(self.inner_fallbacks)}

    def summary(self) -> None:
        """Log the inner aggregation."""
        log(INFO, "\t├──> inner aggregation: %s", describe(self.inner))
        super().summary()
