"""``preset``: the paper's algorithm on one switch, the robust defaults beside it."""

from __future__ import annotations

import logging

import pytest

from fl_clusters.strategies import CFL, FLHC, IFCA, ClusteredStrategy, FedEM
from fl_clusters.strategies.params import SAME, Param, ParamError
from fl_clusters.strategies.registry import build_strategy
from tests.conftest import Federation


def departures(cls: type[ClusteredStrategy]) -> dict[str, Param]:
    return {param.name: param for param in cls.declared_params() if param.paper is not SAME}


def test_every_departure_from_the_paper_is_declared_with_its_reason() -> None:
    found = {name: sorted(departures(cls)) for name, cls in ClusteredStrategy.registry.items()}
    # The departures the robust defaults make; a new one must be declared (and so
    # appear in docs/paper-fidelity.md), never slipped in as a plain default.
    assert found["ifca"] == ["aggregation", "init", "reseed_after"]
    assert found["cfl"] == ["gate", "min_silhouette"]
    assert found["acfl"] == ["gate", "incentive_threshold"]
    assert found["flhc"] == ["threshold"]
    assert found["fedem"] == ["init"]
    for cls in ClusteredStrategy.registry.values():
        for param in departures(cls).values():
            assert param.why and param.paper != param.default
            param.check(param.paper)


def test_a_departure_without_a_reason_cannot_be_declared() -> None:
    with pytest.raises(ValueError, match="needs its reason"):
        Param("init", "local-kmeans", "str", "start", choices=("local-kmeans", "random"),
              paper="random")
    with pytest.raises(ParamError):
        Param("init", "local-kmeans", "str", "start", choices=("local-kmeans", "random"),
              paper="kmeans++", why="a reason")


@pytest.mark.parametrize("cls", [IFCA, CFL, FLHC, FedEM])
def test_paper_preset_takes_the_papers_values_and_robust_keeps_the_defaults(
    cls: type[ClusteredStrategy],
) -> None:
    robust, paper = cls(), cls(preset="paper")
    assert robust.preset == "robust" and robust.preset_changes == {}
    for name, param in departures(cls).items():
        assert getattr(robust, name) == param.default
        assert getattr(paper, name) == param.paper
    assert paper.preset_changes == {name: param.paper for name, param in departures(cls).items()}


def test_an_argument_set_apart_from_its_default_wins_over_the_preset() -> None:
    strategy = IFCA(preset="paper", reseed_after=5, init_steps=7)
    assert strategy.reseed_after == 5 and strategy.init == "random"
    assert "reseed_after" not in strategy.preset_changes


def test_an_argument_the_caller_names_is_kept_even_at_its_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy = IFCA(preset="paper", init="local-kmeans")
    assert strategy.init == "local-kmeans"
    assert strategy.preset_changes == {"aggregation": "paper", "reseed_after": 0}
    assert strategy.preset_fields()["preset_kept"] == {
        "init": {"value": "local-kmeans", "paper": "random"}}
    assert "init='local-kmeans', the paper's 'random'" in caplog.text
    # A value the caller gives that is the paper's own is no departure to record.
    assert IFCA(preset="paper", init="random").preset_kept == {}
    # Positional arguments are named too; under the robust preset nothing is kept.
    assert IFCA(2, preset="paper").user_arguments == {"num_clusters", "preset"}
    assert IFCA(init="local-kmeans").preset_kept == {}


def test_a_run_config_value_apart_from_the_keys_default_is_the_users() -> None:
    from fl_clusters.config import parse_run_config

    # pyproject.toml gives every key its default, so a key at its default is not
    # the user's: the preset sets it; a value that differs is kept.
    strategy = build_strategy(parse_run_config(
        {"strategy": "ifca", "preset": "paper", "ifca-init": "local-kmeans",
         "ifca-reseed-after": 5, "num-clusters": 2}))
    assert (strategy.init, strategy.reseed_after, strategy.num_clusters) == ("random", 5, 2)
    assert strategy.preset_changes == {"aggregation": "paper", "init": "random"}
    assert strategy.preset_kept == {"reseed_after": {"value": 5, "paper": 0}}
    assert strategy.user_arguments == {"preset", "reseed_after", "num_clusters"}


def test_the_run_config_builds_the_paper_preset_and_refuses_an_unknown_one() -> None:
    from fl_clusters.config import parse_run_config

    strategy = build_strategy(parse_run_config({"strategy": "flhc", "preset": "paper"}))
    assert strategy.threshold == strategy.hierarchy.threshold == "absolute"
    with pytest.raises(ValueError, match="preset"):
        parse_run_config({"strategy": "flhc", "preset": "published"})


def test_a_paper_run_records_its_preset_in_the_summary(federation: Federation) -> None:
    summary = federation({"strategy": "flhc", "preset": "paper", "num-rounds": 3,
                          "flhc-warmup-rounds": 1, "local-steps": 5}, num_clients=8)
    assert summary["preset"] == "paper"
    assert summary["preset_changes"] == {"threshold": "absolute"}
    assert summary["preset_kept"] == {}
