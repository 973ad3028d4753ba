"""Which strategies a run config can name: fl-clusters' own, installed plug-ins, Flower's.

Every ``ClusteredStrategy`` subclass with a ``name`` registers itself when its
class is defined. This module imports every module of ``fl_clusters.strategies``,
so a new strategy file there registers without being listed anywhere, and loads
the strategies that other installed packages declare under the entry-point group
:data:`ENTRY_POINT_GROUP` (in the package's pyproject.toml)::

    [project.entry-points."fl_clusters.strategies"]
    fesem = "my_package.fesem:FeSEM"

Flower's FedAvg, FedProx and FedMedian are the baselines (:data:`BASELINES`). Building a
strategy from a run config is :mod:`fl_clusters.strategy_builder`'s.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from logging import WARNING

from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg, FedMedian, FedProx

# Importing the package imports each of its strategy modules: every class registers.
from fl_clusters import strategies as own_package
from fl_clusters.strategies.kit.base import ClusteredStrategy

# The entry-point group under which an installed package declares its strategies.
ENTRY_POINT_GROUP = "fl_clusters.strategies"
# The package whose modules are fl-clusters' own strategies.
OWN_PACKAGE = own_package.__name__

# Flower's strategies as baselines: run-config name -> (class, its own arguments by
# the run-config key that sets each).
BASELINES: dict[str, tuple[type[FedAvg], dict[str, str]]] = {
    "fedavg": (FedAvg, {}),
    "fedprox": (FedProx, {"proximal_mu": "proximal-mu"}),
    # The robust global baseline: one model, the coordinate-wise median of the replies.
    "fedmedian": (FedMedian, {}),
}

# Plug-ins that could not be loaded: entry-point name -> why.
broken_plugins: dict[str, str] = {}


class PluginError(ImportError):
    """An installed package's strategy entry point that does not give a usable strategy."""


def load_plugin(entry: EntryPoint) -> type[ClusteredStrategy]:
    """The strategy class of one entry point, registered under the entry point's name.

    Raises
    ------
    PluginError
        The entry point does not import, is not a ``ClusteredStrategy`` subclass,
        or its class's ``name`` is not the entry point's (the name a run config uses).
    """
    where = f"entry point {entry.name!r} = {entry.value!r} (group {ENTRY_POINT_GROUP!r})"
    try:
        cls = entry.load()
    except Exception as error:  # any failure of a third-party import
        raise PluginError(f"{where} does not import: {type(error).__name__}: {error}; "
                          "fix or uninstall the package that declares it") from error
    if not (isinstance(cls, type) and issubclass(cls, ClusteredStrategy)):
        raise PluginError(f"{where} is {cls!r}, not a subclass of "
                          "fl_clusters.strategies.kit.ClusteredStrategy; point it at a strategy "
                          "class (module:Class) or uninstall the package that declares it")
    if getattr(cls, "name", None) != entry.name:
        raise PluginError(f"{where}: the class's name is {getattr(cls, 'name', None)!r}; the "
                          "entry point's name must be the class's `name` attribute")
    return cls


def _load_plugins() -> None:
    """Load every installed package's strategies; one that fails is logged and kept aside."""
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            load_plugin(entry)
        except PluginError as error:
            broken_plugins[entry.name] = str(error)
            log(WARNING, "strategy plug-in not loaded: %s", error)


def strategy_classes() -> dict[str, type[ClusteredStrategy]]:
    """Every registered strategy by its run-config name (baselines excluded)."""
    return dict(sorted(ClusteredStrategy.registry.items()))


def own_strategies() -> dict[str, type[ClusteredStrategy]]:
    """fl-clusters' own strategies by name: those the generated tables list."""
    return {name: cls for name, cls in strategy_classes().items()
            if cls.__module__.startswith(f"{OWN_PACKAGE}.")}


def class_path(cls: type) -> str:
    """Where a user imports ``cls`` from: ``fl_clusters.strategies`` when it exports it."""
    exported = getattr(own_package, cls.__name__, None) is cls
    return f"{OWN_PACKAGE if exported else cls.__module__}.{cls.__qualname__}"


def strategy_names() -> list[str]:
    """Every value the run-config key ``strategy`` takes: registered strategies and baselines."""
    return sorted({*ClusteredStrategy.registry, *BASELINES})


def unknown_strategy_message(name: str) -> str:
    """Why ``name`` is not a strategy, naming a plug-in that failed to load under it."""
    if name in broken_plugins:
        return (f"strategy {name!r} is an installed plug-in that did not load: "
                f"{broken_plugins[name]}")
    return (f"run-config key 'strategy' has value {name!r}, which is not available in this "
            f"build; allowed: {', '.join(strategy_names())} (a strategy of another package "
            f"answers to its name once that package is installed with an entry point in "
            f"group {ENTRY_POINT_GROUP!r}: docs/adding-a-strategy.md)")


_load_plugins()
