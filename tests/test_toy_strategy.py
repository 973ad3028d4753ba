"""A strategy defined here, outside fl_clusters, runs from the run config like the built-in ones.

Its class is the only thing written for it: the name registers it, the declared
parameter becomes the run-config key ``toy-clusters`` with its check, and
fl-clusters' own ServerApp builds and runs it (docs/adding-a-strategy.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from fl_clusters.client_app import build_client_app
from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.params import Param, ParamError
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.hard import HardClusteredStrategy
from fl_clusters.strategy_builder import build_strategy


@pytest.fixture
def toy_strategy(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[HardClusteredStrategy]]:
    """The toy strategy, registered for one test only (the registry is restored after)."""
    monkeypatch.setattr(ClusteredStrategy, "registry", dict(ClusteredStrategy.registry))

    class Toy(HardClusteredStrategy):
        """Round 1 deals the nodes round-robin into ``clusters`` clusters; FedAvg in each."""

        name = "toy"
        paper = "a test's toy"
        params = (Param("clusters", 2, "int", "toy: clusters the nodes are dealt into", low=1),)

        def configure_train(
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> Iterable[Message]:
            return self.assigned_train_messages(server_round, arrays, config, grid)

        def aggregate_members(
            self, server_round: int, members: dict[int, list[Message]]
        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
            models = self.round_models
            if len(models) == 1:  # round 1: one model; deal its trainers out
                trained = sorted(members[0], key=lambda m: m.metadata.src_node_id)
                members = {}
                for i, msg in enumerate(trained):
                    members.setdefault(i % self.clusters, []).append(msg)
                models = models * self.clusters
            return self.aggregate_clusters(server_round, models, members)

    yield Toy


Federation = Callable[..., dict[str, Any]]


def test_toy_strategy_runs_end_to_end_from_the_run_config(
    toy_strategy: type[HardClusteredStrategy], federation: Federation
) -> None:
    summary = federation(
        {"strategy": "toy", "toy-clusters": 3, "num-rounds": 2, "plots": False},
        num_clients=6,
        # The clients run in worker processes that never import this module, so
        # they would not know the toy's keys; fl-clusters' clients read none of them.
        client_app=build_client_app({"num-rounds": 2}),
    )
    assert summary["strategy"] == "toy"
    assert summary["num_clients"] == 6
    # toy-clusters took effect: 6 nodes dealt into 3 clusters of 2.
    assert summary["num_cluster_models"] == 3
    assert summary["num_clusters_found"] == 3


def test_toy_strategy_declaration_gives_its_run_config_key(
    toy_strategy: type[HardClusteredStrategy],
) -> None:
    key = config_keys()["toy-clusters"]
    assert (key.default, key.low, key.help) == (2, 1, "toy: clusters the nodes are dealt into")
    settings = {**parse_run_config({"strategy": "toy", "toy-clusters": 4.0}),
                "min-nodes": 2}
    built = build_strategy(settings)
    assert isinstance(built, toy_strategy)
    assert built.clusters == 4  # type: ignore[attr-defined]
    assert built.awcfl_beta == 0.0  # the hard-clustered options come with the base


def test_toy_strategy_refuses_a_bad_value_naming_the_key(
    toy_strategy: type[HardClusteredStrategy],
) -> None:
    with pytest.raises(ValueError,
                       match=r"run-config key 'toy-clusters' must be an int >= 1; got 0 \(int\)"):
        parse_run_config({"strategy": "toy", "toy-clusters": 0})
    with pytest.raises(ParamError, match=r"clusters must be an int >= 1; got 0 \(int\)"):
        toy_strategy(clusters=0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_clusters'"):
        toy_strategy(num_clusters=2)  # type: ignore[call-arg]


def test_toy_strategy_is_unknown_once_unregistered() -> None:
    assert "toy" not in ClusteredStrategy.registry
    with pytest.raises(ValueError, match="unknown run-config key"):
        parse_run_config({"toy-clusters": 3})
