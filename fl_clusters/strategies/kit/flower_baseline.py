"""Flower's FedAvg or FedProx, unchanged, behind the ServerApp's strategy interface.

Flower's strategies draw nodes with Python's ``random`` among the nodes the grid
lists, and sum replies in the order they are given. Simulated node ids are random
per run, so this wrapper lists nodes and hands over replies in stable-key order
and seeds ``random``: the same seed then repeats the run, and the round logic
stays Flower's own.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fl_clusters.handshake import NodeIdentities, NodeRegistry
from fl_clusters.strategies.kit.interface import ServerStrategy


class KeyOrderedNodes:
    """A grid as Flower's sampling sees it: the connected nodes in stable-key order.

    Flower's FedAvg reads only ``get_node_ids`` from the grid it is given; the
    messages it returns are sent by the round loop through the real grid.
    """

    def __init__(self, grid: Grid, nodes: NodeRegistry) -> None:
        self.grid = grid
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        """The wrapped grid's nodes, in key order."""
        return self.nodes.in_order(self.grid.get_node_ids())


class FlowerBaseline(ServerStrategy):
    """Flower's ``FedAvg`` (or a subclass: ``FedProx``) for fl-clusters' ServerApp.

    Parameters
    ----------
    flower : FedAvg
        The Flower strategy whose round logic runs.
    seed : int
        Seed of Python's ``random``, which Flower's sampling draws from.
    """

    def __init__(self, flower: FedAvg, seed: int) -> None:
        self.flower = flower
        self.seed = seed
        self.nodes = NodeRegistry()
        # Flower's strategies reject no reply of their own.
        self.rejected_replies = 0
        # Python's random at the last checkpoint (see checkpoint_state), None in a fresh run.
        # A generator of its own, not its state's tuple of ints: a resume remaps every
        # int that equals an old node id in the strategy's attributes.
        self.python_random: random.Random | None = None

    def __getattr__(self, name: str) -> Any:
        """Flower's settings (``fraction_evaluate``, ``proximal_mu``...) read through."""
        if name == "flower":  # not set yet (a copy being made): no strategy to read from
            raise AttributeError(name)
        return getattr(self.flower, name)

    def __setattr__(self, name: str, value: Any) -> None:
        """Flower's settings are set on Flower's strategy, as an app would set them."""
        if "flower" in self.__dict__ and name not in self.__dict__ and hasattr(self.flower, name):
            setattr(self.flower, name, value)
        else:
            super().__setattr__(name, value)

    def checkpoint_state(self) -> dict[str, Any]:
        """The state a checkpoint keeps, with Python's random: Flower samples with it.

        Flower's strategy is left out: it holds only its settings (and its metric
        functions), which the resumed run builds again from the run config.
        """
        kept = random.Random()
        kept.setstate(random.getstate())
        state = {name: value for name, value in vars(self).items() if name != "flower"}
        return {**state, "python_random": kept}

    def adopt_identities(self, identities: NodeIdentities) -> None:
        """Keep the handshake's keys; its malformed replies are not Flower's rejections."""
        self.nodes.adopt(identities)

    def prepare(self, grid: Grid, timeout: float, num_rounds: int) -> None:
        """Seed Python's random, or give it back its state at the resumed checkpoint."""
        self.final_round = num_rounds
        if self.python_random is None:
            random.seed(self.seed)
        else:
            random.setstate(self.python_random.getstate())

    def start(  # type: ignore[override]
        self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, *args: Any,
        **kwargs: Any,
    ) -> Result:
        """Flower's round loop, after :meth:`prepare` (for an app's own ServerApp).

        Round ``num_rounds`` evaluates every node (:meth:`evaluated_share`).
        """
        self.prepare(grid, float(kwargs.get("timeout", 3600.0)), num_rounds)
        return super().start(grid, initial_arrays, num_rounds, *args, **kwargs)

    def summary(self) -> None:
        """Log the Flower strategy's summary."""
        self.flower.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's, sampling among the nodes in key order."""
        return self.flower.configure_train(server_round, arrays, config, self._ordered(grid))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's, on the replies in key order."""
        return self.flower.aggregate_train(server_round, self.nodes.replies_in_order(replies))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's, sampling among the nodes in key order; every node in the last round."""
        flower = self.flower
        share = self.evaluated_share(server_round, flower.fraction_evaluate)
        if share != flower.fraction_evaluate:
            flower = copy.copy(flower)
            flower.fraction_evaluate = share
        return flower.configure_evaluate(server_round, arrays, config, self._ordered(grid))

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's, on the replies in key order."""
        return self.flower.aggregate_evaluate(server_round, self.nodes.replies_in_order(replies))

    def _ordered(self, grid: Grid) -> Grid:
        return KeyOrderedNodes(grid, self.nodes)  # type: ignore[return-value]
