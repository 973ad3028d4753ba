"""Build the strategy a run config names (the ServerApp's ``strategy`` key).

A registered strategy (:mod:`fl_clusters.strategies.kit.registry`) is built from
the run-config keys of its declared parameters; Flower's FedAvg, FedProx and FedMedian are
built unchanged, as the baselines users know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fl_clusters.config import config_keys
from fl_clusters.params import ParamError
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.flower_baseline import FlowerBaseline
from fl_clusters.strategies.kit.interface import ServerStrategy
from fl_clusters.strategies.kit.options.inner import INNER_PARAMS, InnerAggregationOption
from fl_clusters.strategies.kit.registry import BASELINES, unknown_strategy_message

Settings = Mapping[str, Any]


def run_config_arguments(cls: type[ClusteredStrategy], settings: Settings) -> dict[str, Any]:
    """The constructor arguments of ``cls`` that the run config ``settings`` sets.

    Parameters
    ----------
    cls : type[ClusteredStrategy]
        A registered strategy.
    settings : Mapping[str, Any]
        As :func:`build_strategy` takes them.
    """
    return {param.name: param.argument(settings[param.key])  # type: ignore[index]
            for param in cls.declared_params() if param.run_config}


def user_arguments(cls: type[ClusteredStrategy], settings: Settings) -> set[str]:
    """The constructor arguments of ``cls`` whose run-config value is the user's.

    A key counts as the user's when its value differs from the key's default:
    under ``flwr run`` pyproject.toml gives every key its default, so a value
    equal to the default cannot be told from one the user did not set. A preset
    keeps the user's arguments and overrides the others.
    """
    keys = config_keys()
    return {param.name for param in cls.declared_params() if param.run_config
            and settings[param.key] != keys[str(param.key)].config_default}


def _clustered(cls: type[ClusteredStrategy], settings: Settings) -> ClusteredStrategy:
    """Build ``cls`` from ``settings``; a refused value names its run-config key."""
    try:
        strategy = cls.built_with(run_config_arguments(cls, settings),
                                  user_arguments(cls, settings))
    except ParamError as error:
        key = {param.name: param.key for param in cls.declared_params()}.get(error.name)
        if key is None:
            raise
        raise ParamError(key, f"{error.expected} for strategy '{cls.name}'", error.value,
                         key=True) from error
    # Its later messages then name the run-config keys the user can change.
    strategy.from_run_config = True
    return strategy


def _baseline(name: str, settings: Settings) -> ServerStrategy:
    """Flower's strategy ``name``, unchanged, wrapped for fl-clusters' ServerApp."""
    flower, own = BASELINES[name]
    strategy = flower(
        fraction_train=settings["fraction-train"],
        fraction_evaluate=settings["fraction-evaluate"],
        min_available_nodes=settings["min-nodes"],
        **{argument: settings[key] for argument, key in own.items()},
    )
    return FlowerBaseline(strategy, seed=settings["seed"])


def _inner_problem(name: str, settings: Settings) -> str | None:
    """Why ``settings`` ask strategy ``name`` for an inner aggregation it has not, or None."""
    cls = ClusteredStrategy.registry.get(name)
    if cls is not None and issubclass(cls, InnerAggregationOption):
        return None
    asked = [f"{param.key}={settings[param.key]!r}" for param in INNER_PARAMS
             if param.run_config and settings[param.key] != param.default]
    if not asked:
        return None
    why = cls.no_inner_aggregation if cls is not None else (
        "Flower's own strategy aggregates every client in one model; choose it as the "
        "strategy (e.g. strategy='fedmedian') instead")
    takers = sorted(n for n, c in ClusteredStrategy.registry.items()
                    if issubclass(c, InnerAggregationOption))
    return (f"strategy {name!r} takes no inner aggregation ({', '.join(asked)}): {why}. "
            f"The strategies that take one: {', '.join(takers)}")


def build_strategy(settings: Settings) -> ServerStrategy:
    """Return the configured strategy, ready for fl-clusters' ServerApp.

    Parameters
    ----------
    settings : Mapping[str, Any]
        Validated run config (:func:`fl_clusters.config.parse_run_config`).
    """
    name = settings["strategy"]
    if (problem := _inner_problem(name, settings)) is not None:
        raise ValueError(problem)
    cls = ClusteredStrategy.registry.get(name)
    if cls is not None:
        return _clustered(cls, settings)
    if name not in BASELINES:
        raise ValueError(unknown_strategy_message(name))
    return _baseline(name, settings)
