"""Local-only training: the baseline where no client ever shares a model."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.strategies.base import ClusteredStrategy


class LocalOnly(ClusteredStrategy):
    """Every node trains its own model, kept on the node between rounds.

    The server only schedules rounds: the first message carries the initial model
    each node starts from; later messages carry it too (nodes ignore it once they
    have their own). Nothing is aggregated, so ``result.arrays`` stays the initial
    model and personalized accuracy comes from the nodes' own models.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_available_nodes, max_failed_rounds, seed
        See :class:`~fl_clusters.strategies.base.ClusteredStrategy`.
    """

    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_available_nodes: int = 2,
        max_failed_rounds: int = 3,
        seed: int = 0,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_available_nodes=min_available_nodes,
            max_failed_rounds=max_failed_rounds,
            seed=seed,
        )
        self._initial = ArrayRecord()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid
    ) -> Iterable[Message]:
        """Ask the sampled nodes to train their own kept model."""
        self._initial = arrays
        node_config = ConfigRecord(dict(config))
        node_config[p.CFG_ROUND] = server_round
        node_config[p.CFG_PERSISTENT] = True
        record = RecordDict({p.ARRAYS: arrays, p.CONFIG: node_config})
        nodes = self.sample(grid, self.fraction_train)
        return self.build_messages(dict.fromkeys(nodes, record), MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies; there is nothing to aggregate."""
        valid = self.check_replies(replies, self._initial, "aggregate_train")
        if not valid:
            return None, None
        return self._initial, MetricRecord({"num-trained": len(valid)})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid
    ) -> Iterable[Message]:
        """Evaluate each node's own model on its test split."""
        node_config = ConfigRecord(dict(config))
        node_config[p.CFG_ROUND] = server_round
        node_config[p.CFG_PERSISTENT] = True
        record = RecordDict({p.ARRAYS: arrays, p.CONFIG: node_config})
        nodes = self.sample(grid, self.fraction_evaluate)
        return self.build_messages(dict.fromkeys(nodes, record), MessageType.EVALUATE)
