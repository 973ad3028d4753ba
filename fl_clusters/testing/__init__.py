"""The conformance checks every strategy passes, for a strategy's own test suite.

In the spirit of scikit-learn's ``sklearn.utils.estimator_checks``: a strategy
written in another package (loaded through the entry-point group
``fl_clusters.strategies``) is checked by the same checks as fl-clusters' own::

    from fl_clusters.testing import parametrize_with_checks
    from my_package.fesem import FeSEM

    @parametrize_with_checks([FeSEM])
    def test_fesem(strategy, check):
        check(strategy)

Each (strategy, check) pair is one test, with an id such as
``fesem-same_seed_same_result``. The checks (:data:`CHECK_NAMES`,
:mod:`fl_clusters.testing.checks`) run tiny federations of 6 nodes in this
process (:mod:`fl_clusters.testing.federations`: no Ray, no SuperLink), each made
once per strategy and shared by its checks. :func:`check_strategy` runs every
check on one class without pytest's parametrisation.

:func:`parametrize_with_checks` needs pytest installed (it is imported when the
decorator is made); the rest of this package does not. Nothing else in
fl_clusters imports this package.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

from fl_clusters.strategies.kit import ClusteredStrategy
from fl_clusters.testing.checks import CHECKS, FederationRuns, Strategy, StrategyCheck
from fl_clusters.testing.federations import (
    NUM_CLIENTS,
    TINY_JOB,
    ChurnGrid,
    in_process_server,
    loopback_run,
    message_round,
)

# Every check's name, in the order they run.
CHECK_NAMES: tuple[str, ...] = tuple(CHECKS)


def _registered(strategy: Any) -> Strategy:
    """``strategy`` when it is a strategy class a run config can name; raise otherwise."""
    if not (isinstance(strategy, type) and issubclass(strategy, ClusteredStrategy)):
        raise TypeError(f"{strategy!r} is not a strategy class: pass classes derived from "
                        "fl_clusters.strategies.kit.ClusteredStrategy (for a mapping of "
                        "strategies by name, its .values())")
    if ClusteredStrategy.registry.get(strategy.name) is not strategy:  # type: ignore[arg-type]
        raise TypeError(f"{strategy.__name__} is not the registered strategy "
                        f"{strategy.name!r}: a class registers under its `name` attribute "
                        "when it is defined; give it a name no other strategy has")
    return strategy


def strategy_checks(strategy: Strategy, runs: FederationRuns | None = None) -> list[StrategyCheck]:
    """The conformance checks of ``strategy``, in the order they run.

    Parameters
    ----------
    strategy : type[ClusteredStrategy]
        A registered strategy class.
    runs : FederationRuns | None
        The federations the checks share (default: new ones, made on first use).

    Returns
    -------
    list[StrategyCheck]
        One per name of :data:`CHECK_NAMES`; ``check(strategy)`` runs one.
    """
    _registered(strategy)
    shared = FederationRuns() if runs is None else runs
    return [StrategyCheck(name, function, shared) for name, function in CHECKS.items()]


def check_strategy(strategy: Strategy) -> None:
    """Run every conformance check on ``strategy``, stopping at the first that fails.

    Raises
    ------
    AssertionError
        Naming the strategy and the check that failed, with the check's own message.
    TypeError
        If ``strategy`` is not a registered strategy class.
    """
    for check in strategy_checks(strategy):
        try:
            check(strategy)
        except Exception as error:  # any failure of the strategy's code is the check's
            raise AssertionError(f"{strategy.__name__} ({strategy.name!r}) fails the check "
                                 f"{check.name}: {type(error).__name__}: {error}") from error


def parametrize_with_checks(strategies: Iterable[Strategy]) -> Any:
    """A pytest decorator that makes one test of every (strategy, check) pair.

    The decorated function takes ``strategy`` and ``check`` and calls
    ``check(strategy)``; its ids read ``<name>-<check>``
    (``fesem-same_seed_same_result``). The federations a strategy's checks read
    are made once and shared between them; under pytest-xdist's ``--dist
    loadgroup`` a strategy's checks run in one worker, so they are not made again
    in another.

    Parameters
    ----------
    strategies : Iterable[type[ClusteredStrategy]]
        Registered strategy classes.

    Raises
    ------
    TypeError
        If one is not a registered strategy class.
    ValueError
        If there are none (pytest would skip the test, checking nothing).
    """
    import pytest

    classes = [_registered(strategy) for strategy in strategies]
    if not classes:
        raise ValueError("parametrize_with_checks got no strategies: pass the classes to check")
    runs = FederationRuns()
    grouped = importlib.util.find_spec("xdist") is not None
    params = [
        pytest.param(cls, check, id=f"{cls.name}-{check.name}",
                     marks=[pytest.mark.xdist_group(f"checks-{cls.name}")] if grouped else [])
        for cls in classes for check in strategy_checks(cls, runs)
    ]
    return pytest.mark.parametrize(("strategy", "check"), params)


__all__ = [
    "CHECK_NAMES",
    "NUM_CLIENTS",
    "TINY_JOB",
    "ChurnGrid",
    "FederationRuns",
    "StrategyCheck",
    "check_strategy",
    "in_process_server",
    "loopback_run",
    "message_round",
    "parametrize_with_checks",
    "strategy_checks",
]
