"""Clustered federated learning strategies (Flower Message API).

Every module of this package but the support kit (:mod:`fl_clusters.strategies.kit`)
holds strategies, and each strategy class with a ``name`` of its own defined in
one is exported here: a strategy file added to the package is importable as
``fl_clusters.strategies.<Class>`` with no edit of this file. Also exported:
:class:`ClusteredStrategy`, the base of them all, and :func:`cluster_models`,
which reads the cluster models back out of a finished run.
"""

from __future__ import annotations

import importlib
import pkgutil

from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.results import cluster_models

# The subpackage of support code: base classes and helpers, no strategy.
SUPPORT_PACKAGE = "kit"


def _defined_strategies() -> dict[str, type[ClusteredStrategy]]:
    """Import every strategy module of the package; its named strategy classes by class name.

    A class counts where it is defined, not where it is imported, and only with a
    ``name`` of its own (a run config can build it): bases and options are not
    exported.
    """
    found: dict[str, type[ClusteredStrategy]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name == SUPPORT_PACKAGE:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, ClusteredStrategy)
                    and value.__module__ == module.__name__ and vars(value).get("name")):
                found[value.__name__] = value
    return found


_STRATEGIES = _defined_strategies()
globals().update(_STRATEGIES)

__all__ = ["ClusteredStrategy", "cluster_models"]
__all__ += sorted(_STRATEGIES)
