"""``preset``: the paper's algorithm on one switch, the robust defaults beside it."""

from __future__ import annotations

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
