"""A sweep file: read it, check every part, and expand its grid into cells.

A sweep file (TOML) names run-config keys every run shares (``[base]``), axes
whose combinations are the cells (``[grid]``), the federation every cell runs on
(``[federation]``), an optional baseline the report pairs the other cells against
seed by seed, and cells to leave out (``exclude``). docs/sweeps.md describes the
format. Everything is checked here, before any run starts, and every cell's run
config goes through :func:`fl_clusters.config.parse_run_config`, so a typo fails
in a second instead of after hours of runs.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import tomllib
from pathlib import Path
from typing import Any

from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.errors import ConfigurationError
from fl_clusters.sweep.cells import (
    GPUS_AUTO,
    RESERVED_RUN_CONFIG_KEYS,
    SEED_AXIS,
    Axis,
    Cell,
    Sweep,
    cell_key,
)

TOP_LEVEL_KEYS = (
    "name", "description", "base", "grid", "baseline", "exclude", "federation", "run-timeout-s",
    "record",
)
FEDERATION_DEFAULTS: dict[str, int | float | str] = {
    "num-supernodes": 20,
    "client-resources-num-cpus": 1,
    # "auto": a share of the machine's GPUs when Ray sees any, else none
    # (fl_clusters.sweep.cells.resolve_federation).
    "client-resources-num-gpus": GPUS_AUTO,
}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SCALAR_TYPES = (bool, int, float, str)
FIELD_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


class SweepFileError(ValueError):
    """A sweep file that cannot run; the message names the file, the key and the fix."""


def _suggest(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_run_config_keys(where: str, keys: Any) -> None:
    for key in keys:
        if key in RESERVED_RUN_CONFIG_KEYS:
            raise SweepFileError(
                f"{where}: run-config key {key!r} is set by the sweep "
                f"({RESERVED_RUN_CONFIG_KEYS[key]}); remove it"
            )
        if key not in config_keys():
            raise SweepFileError(
                f"{where}: unknown run-config key {key!r}{_suggest(key, config_keys())}; "
                "every key is listed in docs/config.md"
            )


def _scalar(where: str, value: Any) -> Any:
    if not isinstance(value, SCALAR_TYPES):
        raise SweepFileError(
            f"{where}: {value!r} is not a single value (a string, number or boolean)"
        )
    return value


def _label(value: Any) -> str:
    """How a list axis value reads in cell names, tables and plots."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _parse_axis(name: str, value: Any) -> Axis:
    where = f"[grid] key {name!r}"
    if isinstance(value, list):
        if not value:
            raise SweepFileError(f"{where} is an empty list; give it at least one value")
        _check_run_config_keys("[grid]", [name])
        labels = [_label(_scalar(f"{where}, item {i}", item)) for i, item in enumerate(value)]
        if len(set(labels)) != len(labels):
            raise SweepFileError(f"{where} lists a value twice: {value!r}")
        return Axis(name, tuple((label, {name: item})
                                for label, item in zip(labels, value, strict=True)))
    if isinstance(value, dict):
        if not value:
            raise SweepFileError(f"[grid.{name}] has no variants; give it at least one")
        variants = []
        for label, settings in value.items():
            if not isinstance(settings, dict):
                raise SweepFileError(
                    f"[grid.{name}] variant {label!r} must be a table of run-config keys, "
                    f"e.g. {label} = {{strategy = \"fedavg\"}}; got {settings!r}"
                )
            _check_run_config_keys(f"[grid.{name}] variant {label!r}", settings)
            for key, item in settings.items():
                _scalar(f"[grid.{name}] variant {label!r} key {key!r}", item)
            variants.append((label, dict(settings)))
        if name == SEED_AXIS:
            raise SweepFileError(
                "[grid] key 'seed' must be a list of seeds (the report pairs runs by seed), "
                "e.g. seed = [0, 1, 2]"
            )
        return Axis(name, tuple(variants))
    variants = "" if name == SEED_AXIS else f", or a table of named variants ([grid.{name}])"
    raise SweepFileError(
        f"{where} must be a list of values, e.g. {name} = [{_label(value)}]{variants}; "
        f"got {value!r}"
    )


def _parse_axes(grid: Any) -> tuple[Axis, ...]:
    if not isinstance(grid, dict) or not grid:
        raise SweepFileError(
            "[grid] is missing or empty; give it at least one list, e.g. seed = [0]"
        )
    axes = tuple(_parse_axis(name, value) for name, value in grid.items())
    for first, second in itertools.combinations(axes, 2):
        shared = sorted(first.keys & second.keys)
        if shared:
            raise SweepFileError(
                f"[grid]: run-config key {shared[0]!r} is set by both axes {first.name!r} and "
                f"{second.name!r}; set it on one axis only"
            )
    return axes


def _parse_federation(table: Any) -> dict[str, int | float | str]:
    if not isinstance(table, dict):
        raise SweepFileError(f"[federation] must be a table; got {table!r}")
    federation = dict(FEDERATION_DEFAULTS)
    for key, value in table.items():
        if key not in FEDERATION_DEFAULTS:
            raise SweepFileError(
                f"[federation]: unknown key {key!r}{_suggest(key, FEDERATION_DEFAULTS)}; "
                f"allowed: {', '.join(FEDERATION_DEFAULTS)}"
            )
        if key == "client-resources-num-gpus" and value == GPUS_AUTO:
            pass
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            also = f' or "{GPUS_AUTO}"' if key == "client-resources-num-gpus" else ""
            raise SweepFileError(
                f"[federation] key {key!r} must be a number >= 0{also}; got {value!r}"
            )
        federation[key] = value
    if int(federation["num-supernodes"]) != federation["num-supernodes"] or \
            federation["num-supernodes"] < 1:
        raise SweepFileError("[federation] key 'num-supernodes' must be a whole number >= 1")
    if federation["client-resources-num-cpus"] <= 0:  # type: ignore[operator]
        raise SweepFileError("[federation] key 'client-resources-num-cpus' must be > 0")
    federation["num-supernodes"] = int(federation["num-supernodes"])
    return federation


def _values_on(axis: Axis, where: str, value: Any) -> list[str]:
    """The labels ``value`` (one label or a list of them) names on ``axis``."""
    wanted = value if isinstance(value, list) else [value]
    if not wanted:
        raise SweepFileError(f"{where}: empty list for axis {axis.name!r}")
    labels = []
    for item in wanted:
        label = _label(_scalar(where, item))
        if label not in axis.labels:
            raise SweepFileError(
                f"{where}: {item!r} is not a value of [grid] {axis.name!r} "
                f"({', '.join(axis.labels)}); add it to the grid or fix the name"
            )
        labels.append(label)
    return labels


def _parse_baseline(value: Any, axes: tuple[Axis, ...]) -> tuple[str | None, tuple[str, ...]]:
    if value is None:
        return None, ()
    by_name = {axis.name: axis for axis in axes}
    if not isinstance(value, dict) or len(value) != 1:
        raise SweepFileError(
            "baseline must name one grid axis and its baseline value(s), e.g. "
            f"baseline = {{strategy = \"fedavg\"}}; got {value!r}"
        )
    (name, wanted), = value.items()
    if name == SEED_AXIS:
        raise SweepFileError("baseline: runs are paired by seed; the baseline axis cannot be "
                             "'seed' (e.g. baseline = {strategy = \"fedavg\"})")
    if name not in by_name:
        raise SweepFileError(
            f"baseline: {name!r} is not a [grid] axis{_suggest(name, by_name)}; the baseline "
            f"is a value of one of: {', '.join(by_name)}"
        )
    labels = _values_on(by_name[name], "baseline", wanted)
    if len(labels) == len(by_name[name].values):
        raise SweepFileError(
            f"baseline: every value of axis {name!r} is a baseline; leave at least one to "
            "compare"
        )
    return name, tuple(labels)


def _parse_exclude(value: Any, axes: tuple[Axis, ...]) -> list[dict[str, set[str]]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(rule, dict) for rule in value):
        raise SweepFileError(
            "exclude must be a list of tables, e.g. exclude = [{strategy = \"fedsoft\", "
            f"cluster-structure = [\"rotation\", \"none\"]}}]; got {value!r}"
        )
    by_name = {axis.name: axis for axis in axes}
    rules = []
    for i, rule in enumerate(value):
        if not rule:
            raise SweepFileError(f"exclude, item {i}: empty table would leave out every cell")
        parsed = {}
        for name, wanted in rule.items():
            if name not in by_name:
                raise SweepFileError(
                    f"exclude, item {i}: {name!r} is not a [grid] axis{_suggest(name, by_name)}"
                )
            parsed[name] = set(_values_on(by_name[name], f"exclude, item {i}", wanted))
        rules.append(parsed)
    return rules


def parse_only(sweep: Sweep, selections: list[str]) -> dict[str, set[str]]:
    """The ``--only AXIS=LABEL[,LABEL...]`` selections, checked against ``sweep``'s axes.

    Parameters
    ----------
    sweep : Sweep
        The loaded sweep.
    selections : list[str]
        One ``AXIS=LABEL[,LABEL...]`` text per ``--only``; the same axis twice adds
        labels.

    Returns
    -------
    dict[str, set[str]]
        Axis name -> the labels a cell must have on it.
    """
    by_name = {axis.name: axis for axis in sweep.axes}
    chosen: dict[str, set[str]] = {}
    for text in selections:
        name, sep, labels = text.partition("=")
        name = name.strip()
        if not sep or not labels.strip():
            raise SweepFileError(
                f"--only {text!r}: write AXIS=LABEL[,LABEL...], e.g. --only model=mlp"
            )
        if name not in by_name:
            raise SweepFileError(
                f"--only {text!r}: {name!r} is not a [grid] axis"
                f"{_suggest(name, by_name)} (axes: {', '.join(by_name)})"
            )
        wanted = [label.strip() for label in labels.split(",")]
        chosen.setdefault(name, set()).update(
            _values_on(by_name[name], f"--only {text!r}", wanted)
        )
    return chosen


def _expand(
    base: dict[str, Any], axes: tuple[Axis, ...], federation: dict[str, int | float | str],
    excluded: list[dict[str, set[str]]],
) -> tuple[Cell, ...]:
    cells: list[Cell] = []
    # Cells are told apart by what they run: a default written out in one cell
    # and left out in another is the same run twice.
    by_settings: dict[str, Cell] = {}
    for combination in itertools.product(*(axis.values for axis in axes)):
        labels = {axis.name: label for axis, (label, _) in zip(axes, combination, strict=True)}
        if any(all(labels[name] in wanted for name, wanted in rule.items())
               for rule in excluded):
            continue
        run_config = dict(base)
        for _, settings in combination:
            run_config.update(settings)
        # Every run waits for the whole federation before round 1, unless the file says.
        run_config.setdefault("min-nodes", federation["num-supernodes"])
        name = ",".join(f"{axis}={label}" for axis, label in labels.items())
        try:
            settings = parse_run_config(run_config)
        except ConfigurationError as err:
            # The run's own message ends with where a flwr run sets keys.
            problem = str(err).split(" Fix it in [tool.flwr.app.config]")[0]
            raise SweepFileError(
                f"cell {name}: {problem} Fix it in [base], [grid] or exclude the cell."
            ) from err
        for reserved in RESERVED_RUN_CONFIG_KEYS:
            settings.pop(reserved)
        cell = Cell(labels, run_config, settings, cell_key(run_config, federation))
        same = json.dumps(settings, sort_keys=True)
        if same in by_settings:
            raise SweepFileError(
                f"cells {by_settings[same].name} and {name} have the same run config; give "
                "the axes values that differ, or exclude one"
            )
        by_settings[same] = cell
        cells.append(cell)
    if not cells:
        raise SweepFileError("exclude leaves out every cell of the grid")
    return tuple(cells)


def parse_sweep(text: str, path: Path) -> Sweep:
    """Check a sweep file's content and expand its grid.

    Parameters
    ----------
    text : str
        The file's TOML.
    path : Path
        Where it was read from; its stem is the sweep's name when ``name`` is absent.

    Returns
    -------
    Sweep
        The sweep with every cell's validated run config.

    Raises
    ------
    SweepFileError
        For anything the sweep cannot run: the message starts with the file and
        names the key and the fix.
    """
    try:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SweepFileError(f"not valid TOML: {err}") from err
        unknown = [key for key in document if key not in TOP_LEVEL_KEYS]
        if unknown:
            raise SweepFileError(
                f"unknown top-level key {unknown[0]!r}{_suggest(unknown[0], TOP_LEVEL_KEYS)}; "
                f"allowed: {', '.join(TOP_LEVEL_KEYS)}"
            )
        name = document.get("name", path.stem)
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise SweepFileError(
                f"name {name!r} must be a folder name: letters, digits, '.', '_', '-'"
            )
        base = _parse_base(document.get("base", {}))
        axes = _parse_axes(document.get("grid"))
        federation = _parse_federation(document.get("federation", {}))
        baseline_axis, baselines = _parse_baseline(document.get("baseline"), axes)
        excluded = _parse_exclude(document.get("exclude"), axes)
        timeout, description, record = _parse_run_options(document)
        cells = _expand(base, axes, federation, excluded)
    except SweepFileError as err:
        raise SweepFileError(f"{path}: {err}") from err.__cause__
    return Sweep(
        name=name, path=path, axes=axes, federation=federation, cells=cells,
        baseline_axis=baseline_axis, baselines=baselines,
        run_timeout_s=None if timeout is None else float(timeout),
        description=description, record=tuple(record), text=text,
    )


def _parse_base(base: Any) -> dict[str, Any]:
    """``[base]``: checked run-config keys with scalar values."""
    if not isinstance(base, dict):
        raise SweepFileError(f"[base] must be a table of run-config keys; got {base!r}")
    _check_run_config_keys("[base]", base)
    for key, value in base.items():
        _scalar(f"[base] key {key!r}", value)
    return base


def _parse_run_options(document: dict[str, Any]) -> tuple[float | int | None, str, list[str]]:
    """``run-timeout-s``, ``description`` and ``record``, checked."""
    timeout = document.get("run-timeout-s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise SweepFileError(
            f"run-timeout-s must be a number of seconds > 0; got {timeout!r}"
        )
    description = document.get("description", "")
    if not isinstance(description, str):
        raise SweepFileError(f"description must be a string; got {description!r}")
    record = document.get("record", [])
    if not isinstance(record, list) or not all(
        isinstance(name, str) and FIELD_PATTERN.fullmatch(name) for name in record
    ):
        raise SweepFileError(
            "record must be a list of summary.json field names, e.g. "
            f'record = ["reassigned_per_round"]; got {record!r}'
        )
    return timeout, description, record


def load_sweep(path: str | Path) -> Sweep:
    """Read and check the sweep file at ``path`` (:func:`parse_sweep`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SweepFileError(f"{path}: cannot read the sweep file: {err.strerror}") from err
    return parse_sweep(text, path)
