"""fl_clusters/strategies/ holds the algorithms, one per file; their support is the kit."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import fl_clusters.strategies as strategies
from fl_clusters.strategies.kit import ClusteredStrategy
from fl_clusters.strategies.kit.registry import own_strategies


def test_every_module_of_strategies_is_one_algorithm() -> None:
    found = {}
    for module in pkgutil.iter_modules(strategies.__path__):
        if module.name == "kit":
            assert module.ispkg
            continue
        loaded = importlib.import_module(f"{strategies.__name__}.{module.name}")
        found[module.name] = [
            cls.name for _, cls in inspect.getmembers(loaded, inspect.isclass)
            if issubclass(cls, ClusteredStrategy) and cls.__module__ == loaded.__name__]
    assert all(len(names) == 1 and names[0] for names in found.values()), found
    assert sorted(name for names in found.values() for name in names) == sorted(own_strategies())


def test_the_package_exports_each_algorithm_by_its_class_name() -> None:
    for cls in own_strategies().values():
        assert getattr(strategies, cls.__name__) is cls
        assert cls.__name__ in strategies.__all__
