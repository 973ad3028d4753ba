"""Build the strategy a run config names (the ServerApp's ``strategy`` key).

Every ``ClusteredStrategy`` subclass with a ``name`` registers itself when its
class is defined; this module imports every module of the package, so a new
strategy file registers without being listed anywhere. Its declared parameters
say which run-config key sets which constructor argument. Flower's FedAvg and
FedProx are the baselines.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any

from flwr.serverapp.strategy import FedAvg, FedProx

from fl_clusters.strategies.base import ClusteredStrategy
from fl_clusters.strategies.flower_baseline import FlowerBaseline
from fl_clusters.strategies.interface import ServerStrategy
from fl_clusters.strategies.params import ParamError

Settings = Mapping[str, Any]


def import_strategy_modules() -> None:
    """Import every module of this package: each strategy class registers when defined."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")


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
    # Imported here: fl_clusters.config imports this module for the strategy names.
    from fl_clusters.config import config_keys

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


def _baseline(flower: type[FedAvg], **own: str) -> Callable[[Settings], ServerStrategy]:
    """A builder of Flower's ``flower`` strategy, unchanged: the baseline users know.

    ``own``: the strategy's own arguments, by the run-config key that sets each.
    """
    def build(settings: Settings) -> ServerStrategy:
        strategy = flower(
            fraction_train=settings["fraction-train"],
            fraction_evaluate=settings["fraction-evaluate"],
            min_available_nodes=settings["min-nodes"],
            **{argument: settings[key] for argument, key in own.items()},
        )
        return FlowerBaseline(strategy, seed=settings["seed"])

    return build


BASELINES: dict[str, Callable[[Settings], ServerStrategy]] = {
    "fedavg": _baseline(FedAvg),
    "fedprox": _baseline(FedProx, proximal_mu="proximal-mu"),
}


def strategy_names() -> list[str]:
    """Every value the run-config key ``strategy`` takes: registered strategies and baselines."""
    return sorted({*ClusteredStrategy.registry, *BASELINES})


def build_strategy(settings: Settings) -> ServerStrategy:
    """Return the configured strategy, ready for fl-clusters' ServerApp.

    Parameters
    ----------
    settings : Mapping[str, Any]
        Validated run config (:func:`fl_clusters.config.parse_run_config`).
    """
    name = settings["strategy"]
    cls = ClusteredStrategy.registry.get(name)
    if cls is not None:
        return _clustered(cls, settings)
    if name not in BASELINES:
        raise ValueError(
            f"run-config key 'strategy' has value {name!r}, which is not available in this "
            f"build; allowed: {', '.join(strategy_names())}"
        )
    return BASELINES[name](settings)


import_strategy_modules()
