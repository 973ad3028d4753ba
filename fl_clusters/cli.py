"""The ``fl-clusters`` command: ``sweep`` runs a sweep file, ``strategies`` lists strategies.

``fl-clusters strategies`` lists every value the run-config key ``strategy`` takes
(fl-clusters' own strategies, the installed plug-ins of the entry-point group
``fl_clusters.strategies``, Flower's baselines) with its class, the package it
comes from and its paper, then the plug-ins that did not load and why.
``fl-clusters strategies --keys NAME`` prints the ``[tool.flwr.app.config]``
lines of that strategy's run-config keys, with their defaults: Flower's CLI
refuses a ``--run-config`` key that the app's pyproject.toml lacks, so a
plug-in's own keys are pasted there to be overridable (without them a run uses
the keys' declared defaults). docs/sweeps.md describes ``sweep``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import astuple, dataclass
from importlib.metadata import entry_points
from typing import TextIO

from fl_clusters.config import key_groups
from fl_clusters.strategies.kit import ClusteredStrategy
from fl_clusters.strategies.kit.registry import (
    BASELINES,
    ENTRY_POINT_GROUP,
    broken_plugins,
    class_path,
    own_strategies,
    strategy_classes,
    unknown_strategy_message,
)
from fl_clusters.sweep.cli import add_sweep_arguments, sweep_command

OWN_PACKAGE = "fl-clusters"
# Flower's strategies the run config names as baselines: their papers.
BASELINE_PAPERS = {
    "fedavg": "McMahan et al., AISTATS 2017 (baseline)",
    "fedprox": "Li et al., MLSys 2020 (baseline)",
    "fedmedian": "Yin et al., ICML 2018 (robust baseline)",
}
COLUMNS = ("strategy", "class", "package", "paper")
# Where Flower's users import its strategies from.
FLOWER_STRATEGIES = "flwr.serverapp.strategy"


@dataclass(frozen=True)
class StrategyRow:
    """One value of the run-config key ``strategy``: where its class comes from."""

    name: str
    class_path: str
    package: str
    paper: str


def _plugin_packages() -> dict[str, str]:
    """The distribution that declares each entry point of the group, by entry-point name."""
    return {entry.name: entry.dist.name if entry.dist is not None else entry.module
            for entry in entry_points(group=ENTRY_POINT_GROUP)}


def strategy_rows() -> list[StrategyRow]:
    """Every strategy a run config can name: own, then plug-ins, then Flower's baselines.

    A class registered by an import rather than an entry point (a strategy defined
    in the module that builds a ServerApp) is listed with its module's package.
    """
    own, packages = own_strategies(), _plugin_packages()
    rows = [StrategyRow(name, class_path(cls), OWN_PACKAGE, cls.paper)
            for name, cls in own.items()]
    rows += [StrategyRow(name, class_path(cls),
                         packages.get(name, cls.__module__.split(".")[0]), cls.paper)
             for name, cls in strategy_classes().items() if name not in own]
    rows += [StrategyRow(name, f"{FLOWER_STRATEGIES}.{flower.__name__}", "flwr",
                         BASELINE_PAPERS.get(name, "baseline"))
             for name, (flower, _) in BASELINES.items()]
    return rows


def _toml(value: bool | int | float | str) -> str:
    """A run-config default as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def key_lines(name: str) -> list[str]:
    """The ``[tool.flwr.app.config]`` lines of strategy ``name``'s run-config keys.

    The keys its declarations add to fl-clusters' own table, each with its
    default, under a comment naming the strategy; a strategy that adds none (one
    of fl-clusters' own, a baseline) gets comment lines saying so.

    Raises
    ------
    ValueError
        If no strategy answers to ``name``, naming a plug-in that failed to load
        under it.
    """
    if name in BASELINES:
        own = ", ".join(BASELINES[name][1].values()) or "none"
        return [f"# strategy = \"{name}\" is Flower's; it reads fl-clusters' common keys "
                f"(its own: {own}), all in fl-clusters' table already"]
    cls = ClusteredStrategy.registry.get(name)
    if cls is None:
        raise ValueError(unknown_strategy_message(name))
    in_table = {key.key for _, keys in key_groups(own_only=True) for key in keys}
    declared: dict[str, str] = {}
    for param in cls.declared_params():
        if param.run_config and param.key not in declared:
            declared[str(param.key)] = _toml(param.config_default)
    new = {key: default for key, default in declared.items() if key not in in_table}
    title = f"# strategy = \"{name}\" ({class_path(cls)})"
    if not new:
        return [f"{title}: its keys are all in fl-clusters' table already: "
                f"{', '.join(declared)}"]
    return [f"{title}: under [tool.flwr.app.config], so that --run-config can set them",
            *(f"{key} = {default}" for key, default in new.items())]


def _print_table(rows: list[StrategyRow], out: TextIO) -> None:
    """``rows`` as a rich table on a terminal, else one tab-separated line each."""
    if not out.isatty():
        for row in rows:
            print("\t".join(astuple(row)), file=out)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for column in COLUMNS:
        # A class path is never cut short: a narrow terminal folds it.
        table.add_column(column, overflow="fold", no_wrap=column == "strategy")
    for row in rows:
        table.add_row(*astuple(row))
    Console(file=out).print(table)


def strategies_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``fl-clusters strategies [--keys NAME]``: the exit status (2: no such strategy)."""
    out = sys.stdout if out is None else out
    if args.keys is not None:
        try:
            lines = key_lines(args.keys)
        except ValueError as error:
            print(f"fl-clusters strategies: {error}", file=sys.stderr)
            return 2
        print("\n".join(lines), file=out)
        return 0
    _print_table(strategy_rows(), out)
    for name, reason in sorted(broken_plugins.items()):
        print(f"not loaded: {name}: {reason}", file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``fl-clusters``, its subcommands ``sweep`` and ``strategies``."""
    parser = argparse.ArgumentParser(prog="fl-clusters", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add_sweep_arguments(commands.add_parser(
        "sweep", help="run a sweep file: a grid of runs in one process (docs/sweeps.md)",
        description="Run a sweep file (docs/sweeps.md).",
    ))
    strategies = commands.add_parser(
        "strategies", help="list every strategy a run config can name, and broken plug-ins",
        description="List every value of the run-config key 'strategy': its class, its "
                    "package and its paper (a table on a terminal, tab-separated lines "
                    "otherwise), then each installed plug-in that did not load and why.",
    )
    strategies.add_argument(
        "--keys", metavar="NAME", default=None,
        help="print the [tool.flwr.app.config] lines of strategy NAME's run-config keys "
             "with their defaults; paste a plug-in's into the app's pyproject.toml to "
             "override them with --run-config",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``fl-clusters SUBCOMMAND ...``: the project's command line."""
    args = build_parser().parse_args(argv)
    if args.command == "strategies":
        return strategies_command(args)
    return sweep_command(args)


if __name__ == "__main__":
    sys.exit(main())
