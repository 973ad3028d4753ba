"""Local-only training: the baseline where no client ever shares a model."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.strategies.kit import (
    FRACTION_TRAIN,
    NOT_GIVEN,
    Behaviour,
    ClusteredStrategy,
)

# How a node's own model is scored, wherever one is kept (local-only training,
# FedSoft's personalized models).
LOCAL_MODELS_HELD_OUT = Behaviour(
    "local_models_scored_held_out",
    "FedSoft's public code scores each client's local model on the client's training data",
    "each node's own model is scored on its held-out test split",
    "a score on training data measures memorisation: the FedSoft reproduction found 62.1 % "
    "held out where the code reported 98.8 % (CIFAR-10, two sets)",
    "Lai (seed 004), sections 4.1 and 5, table 1; ALGORITHMS.md, pitfalls",
    switch=False,
)


class LocalOnly(ClusteredStrategy):
    """Every node trains its own model, kept on the node between rounds.

    The server only schedules rounds: the first message carries the initial model
    each node starts from; later messages carry it too (nodes ignore it once they
    have their own). Nothing is aggregated, so ``result.arrays`` stays the initial
    model and personalized accuracy comes from the nodes' own models.
    """

    name = "local"
    paper = "baseline: no sharing"
    no_inner_aggregation = "it aggregates nothing: every client keeps its own model"
    params = (
        replace(FRACTION_TRAIN, paper=NOT_GIVEN,
                why="every client's own model trains in every round, as the papers' local "
                "baselines train each client on its own data throughout",
                source="Ghosh et al. 2020 (seed 001), section Experiments and Lai (seed 004), "
                "section 5: local models are compared, with no participation rate given"),
    )
    behaviours = (LOCAL_MODELS_HELD_OUT,)

    def __init__(self, **arguments: Any) -> None:
        super().__init__(**arguments)
        self._initial = ArrayRecord()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Ask the sampled nodes to train their own kept model."""
        self._initial = arrays
        nodes = self.sample(grid, self.fraction_train)
        return self._own_model_messages(server_round, arrays, config, nodes, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies; there is nothing to aggregate."""
        valid = self.check_replies(replies, self._initial, "aggregate_train", trains=True)
        if not valid:
            return None, None
        return self._initial, MetricRecord({"num-trained": len(valid)})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluate each sampled node's own model on its test split (all in the last round)."""
        nodes = self.sampled(grid, self.evaluated_share(server_round, self.fraction_evaluate))
        return self._own_model_messages(server_round, arrays, config, nodes,
                                        MessageType.EVALUATE)

    def _own_model_messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int],
        message_type: str,
    ) -> list[Message]:
        """One message per node: use your own kept model (``arrays`` to start it)."""
        node_config = self.round_config(config, server_round)
        node_config[p.CFG_PERSISTENT] = True
        record = RecordDict({p.ARRAYS: arrays, p.CONFIG: node_config})
        return self.broadcast(nodes, record, message_type)
