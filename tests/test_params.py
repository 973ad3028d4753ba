"""Constructor arguments: one kind of message for a bad value, whatever the strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fl_clusters.config import parse_run_config
from fl_clusters.params import Param, ParamError, check_param
from fl_clusters.strategies import ACFL, CFL, FLDC, FLHC, IFCA, FedEM, FedSoft, LocalOnly, WeCFL
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import FailingGrid

# Each strategy with the arguments it needs and nothing else.
STRATEGIES: dict[str, Callable[..., ClusteredStrategy]] = {
    "IFCA": IFCA,
    "CFL": CFL,
    "ACFL": ACFL,
    "FedSoft": FedSoft,
    "FLDC": FLDC,
    "FLHC": FLHC,
    "WeCFL": lambda **kw: WeCFL(**{"num_clusters": 2, **kw}),
    "FedEM": FedEM,
    "LocalOnly": LocalOnly,
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("max_failed_rounds", 2.5, "max_failed_rounds must be an int >= 1; got 2.5 (float)"),
        ("max_failed_rounds", True, "max_failed_rounds must be an int >= 1; got True (bool)"),
        ("min_available_nodes", "2", "min_available_nodes must be an int >= 1; got '2' (str)"),
        ("fraction_evaluate", "1.0", "fraction_evaluate must be a number in [0, 1]; got '1.0'"),
        ("fraction_evaluate", 1.5, "fraction_evaluate must be a number in [0, 1]; got 1.5"),
        ("seed", None, "seed must be an int in [0, 4294967295]; got None (NoneType)"),
    ],
)
def test_every_strategy_names_a_bad_shared_argument(
    name: str, argument: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        STRATEGIES[name](**{argument: value})


@pytest.mark.parametrize(
    ("name", "argument", "value", "message"),
    [
        ("IFCA", "num_clusters", 2.5, "num_clusters must be an int >= 1; got 2.5 (float)"),
        ("IFCA", "num_clusters", "2", "num_clusters must be an int >= 1; got '2' (str)"),
        ("IFCA", "num_clusters", True, "num_clusters must be an int >= 1; got True (bool)"),
        ("IFCA", "mode", "models", "mode must be one of 'model', 'gradient'; got 'models'"),
        ("IFCA", "init_steps", 0, "init_steps must be an int >= 1; got 0 (int)"),
        ("CFL", "mean_ratio", 1.5, "mean_ratio must be a number in (0, 1]; got 1.5"),
        ("CFL", "warmup_rounds", 2.0, "warmup_rounds must be an int >= 0; got 2.0 (float)"),
        ("CFL", "split_threshold", "0.4", "split_threshold must be a number in [-1, 1]"),
        ("ACFL", "max_rejections", 0, "max_rejections must be an int >= 1; got 0"),
        ("ACFL", "beta", float("nan"), "beta must be a number; got nan (float)"),
        ("FedSoft", "num_clusters", 2.0, "num_clusters must be an int >= 1; got 2.0 (float)"),
        ("FedSoft", "sigma", 2, "sigma must be a number in [0, 1]; got 2 (int)"),
        ("FLDC", "min_pts", True, "min_pts must be an int >= 2; got True (bool)"),
        ("FLDC", "eps", -1.0, "eps must be a number > 0 or None; got -1.0 (float)"),
        ("FLHC", "min_gap", 1.0, "min_gap must be a number > 1; got 1.0 (float)"),
        ("FLHC", "linkage", "median", "linkage must be one of 'ward', 'average'"),
        ("WeCFL", "num_clusters", "3", "num_clusters must be an int >= 1; got '3' (str)"),
        ("FedEM", "num_clusters", 1, "num_clusters must be an int >= 2; got 1 (int)"),
        ("FedEM", "init", "kmeans", "init must be one of 'local-kmeans', 'random'"),
    ],
)
def test_a_bad_argument_is_named_with_its_type_and_range(
    name: str, argument: str, value: Any, message: str
) -> None:
    with pytest.raises(ParamError) as raised:
        STRATEGIES[name](**{argument: value})
    assert str(raised.value).startswith(message)
    assert raised.value.name == argument


def test_good_values_pass_unchanged() -> None:
    assert check_param("k", np.int64(3), "int", low=1) == 3
    assert check_param("lr", 1, "float", above=0.0) == 1
    assert check_param("eps", None, "float", above=0.0, allow_none=True) is None
    assert check_param("on", False, "bool") is False
    strategy = FedEM(num_clusters=2)
    assert strategy.num_clusters == 2


def test_fedem_takes_num_clusters_like_the_other_strategies() -> None:
    for cls in (IFCA, FedSoft, WeCFL, FedEM):
        assert cls(num_clusters=3).num_clusters == 3  # type: ignore[operator]


def test_a_run_config_value_a_strategy_refuses_names_the_key() -> None:
    # FedEM needs 2 components; the run config allows num-clusters = 1 for others.
    settings = {**parse_run_config({"strategy": "fedem", "num-clusters": 1}),
                "min-nodes": 2}
    with pytest.raises(ValueError, match="run-config key 'num-clusters' must be an int >= 2 "
                       "for strategy 'fedem'; got 1"):
        build_strategy(settings)


def _fail_every_round(strategy: ClusteredStrategy) -> str:
    grid = FailingGrid([1, 2, 3], {})
    with pytest.raises(RuntimeError) as raised:
        strategy.start(grid, ArrayRecord([np.zeros(2, dtype=np.float32)]),  # type: ignore[arg-type]
                       num_rounds=5)
    return str(raised.value)


def test_failed_run_hint_names_what_the_user_can_change(server_identity: None) -> None:
    built = IFCA(num_clusters=2, init="random", min_available_nodes=3, max_failed_rounds=2)
    message = _fail_every_round(built)
    assert "max_failed_rounds=2" in message and "max-failed-rounds" not in message
    settings = {**parse_run_config({"strategy": "ifca", "num-clusters": 2, "ifca-init": "random",
                                    "max-failed-rounds": 2}), "min-nodes": 3}
    from_config = build_strategy(settings)
    assert isinstance(from_config, ClusteredStrategy)
    message = _fail_every_round(from_config)
    assert "run-config key 'max-failed-rounds'" in message and "max_failed_rounds" not in message



def test_a_strategy_takes_only_the_arguments_it_declares() -> None:
    # FedSoft and FLDC pick their own training nodes: no fraction_train.
    for cls in (FedSoft, FLDC):
        with pytest.raises(TypeError, match="unexpected keyword argument 'fraction_train'"):
            cls(fraction_train=0.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'awcfl_beta'"):
        FedEM(awcfl_beta=0.5)
    with pytest.raises(TypeError):
        WeCFL()  # type: ignore[call-arg]
    assert IFCA(awcfl_beta=0.5, seed=3).awcfl_beta == 0.5


def test_a_declaration_whose_default_differs_from_the_signature_is_refused() -> None:
    with pytest.raises(TypeError, match="gives 'depth' the default 3; its declaration says 2"):
        class Wrong(ClusteredStrategy):
            params = (Param("depth", 2, "int", "how deep", low=1),)

            def __init__(self, *, depth: int = 3, **kwargs: Any) -> None:
                super().__init__(depth=depth, **kwargs)
