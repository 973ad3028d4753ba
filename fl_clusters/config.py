"""Run-config schema: every key the app reads, its default and what values it accepts.

Flower hands the ServerApp and ClientApp a flat ``run_config`` mapping whose values
come from ``[tool.flwr.app.config]`` plus ``--run-config`` overrides. Under
``run_simulation`` that mapping is empty, so the defaults live here and not only in
pyproject.toml. Every value is checked once, at the boundary, and a bad one stops the
run with an error that names the key, the value and what is allowed.

The keys of the data, the clients and the run are listed here (:data:`COMMON_KEYS`);
a strategy's keys come from its declared parameters
(:class:`~fl_clusters.strategies.params.Param`), grouped by the class that declares
them, so a strategy registered from outside fl-clusters brings its keys with it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fl_clusters.errors import ConfigurationError
from fl_clusters.strategies.base import ClusteredStrategy
from fl_clusters.strategies.params import FRACTION_TRAIN, REQUIRED, SEED, Param, num_clusters_param
from fl_clusters.strategies.registry import strategy_names

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "emnist")
CLUSTER_STRUCTURES = (
    "rotation", "label-permutation", "none", "rotation-mixture", "label-permutation-mixture"
)
MODELS = ("mlp", "cnn")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ConfigKey:
    """One run-config key.

    Parameters
    ----------
    name : str
        Kebab-case key, as written in pyproject.toml and ``--run-config``.
    default : bool | int | float | str
        Value used when the key is absent; its type is the key's type.
    choices : tuple[str, ...] | None
        Allowed values for a string key.
    minimum, maximum : float | None
        Bounds for a numeric key, inclusive unless said otherwise.
    exclusive_minimum, exclusive_maximum : bool
        Whether ``minimum`` (``maximum``) itself is refused (a share that must be > 0).
    unset : bool | int | float | str | None
        A value allowed outside the bounds, standing for "chosen for you"
        (``fldc-eps = 0``).
    help : str
        One line for the README and error messages.
    """

    name: str
    default: bool | int | float | str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    unset: bool | int | float | str | None = None
    help: str = ""

    @classmethod
    def from_param(cls, param: Param) -> ConfigKey:
        """The run-config key of a strategy's declared parameter."""
        default = param.unset if param.default is None else param.default
        if default is REQUIRED or default is None or param.key is None:
            raise TypeError(f"parameter {param.name!r} needs a key and a default to be set "
                            "from a run config (or run_config=False)")
        return cls(
            param.key,
            float(default) if param.kind == "float" else default,
            choices=param.choices,
            minimum=param.low if param.low is not None else param.above,
            maximum=param.high if param.high is not None else param.below,
            exclusive_minimum=param.above is not None,
            exclusive_maximum=param.below is not None,
            unset=param.unset if param.allow_none else None,
            help=param.help,
        )

    def allowed(self) -> str:
        """Describe the allowed values in words."""
        if self.choices is not None:
            return ", ".join(self.choices)
        kind = type(self.default).__name__
        unset = "" if self.unset is None else f"{self.unset!r} or "
        low = "(" if self.exclusive_minimum else "["
        high = ")" if self.exclusive_maximum else "]"
        if self.minimum is not None and self.maximum is not None:
            return f"{unset}{kind} in {low}{self.minimum}, {self.maximum}{high}"
        if self.minimum is not None:
            return f"{unset}{kind} {'>' if self.exclusive_minimum else '>='} {self.minimum}"
        if self.maximum is not None:
            return f"{unset}{kind} {'<' if self.exclusive_maximum else '<='} {self.maximum}"
        return unset + kind

    def validate(self, value: Any) -> bool | int | float | str:
        """Return ``value`` converted to the key's type, or raise ``ValueError``."""
        expected = type(self.default)
        converted: Any = value
        if expected is bool:
            if not isinstance(value, bool):
                raise self._error(value)
        elif expected is int:
            # TOML and --run-config give ints for whole numbers; a float with a
            # fractional part is a mistake worth reporting.
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._error(value)
            if float(value) != int(value):
                raise self._error(value)
            converted = int(value)
        elif expected is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self._error(value)
            converted = float(value)
        elif not isinstance(value, str):
            raise self._error(value)
        if self.unset is not None and converted == self.unset:
            return converted
        if self.choices is not None and converted not in self.choices:
            raise self._error(value)
        if self.minimum is not None and (
            converted < self.minimum or (self.exclusive_minimum and converted == self.minimum)
        ):
            raise self._error(value)
        if self.maximum is not None and (
            converted > self.maximum or (self.exclusive_maximum and converted == self.maximum)
        ):
            raise self._error(value)
        return converted

    def _error(self, value: Any) -> ConfigurationError:
        return ConfigurationError(
            f"run-config key '{self.name}' has invalid value {value!r}; allowed: "
            f"{self.allowed()}. Fix it in [tool.flwr.app.config] or with "
            f"--run-config \"{self.name}=...\"."
        )


# The data, the clients and the run; ``strategy``, whose choices are the
# registered strategies, is made by :func:`key_groups`.
COMMON_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("dataset", "digits", choices=DATASETS, help="data set every client loads"),
    ConfigKey("data-root", "", help="folder of local data files ('' = the loader's default)"),
    ConfigKey("model", "mlp", choices=MODELS, help="network trained by every client"),
    ConfigKey(
        "cluster-structure", "rotation", choices=CLUSTER_STRUCTURES,
        help="how client groups differ",
    ),
    ConfigKey("num-groups", 0, minimum=0, help="ground-truth groups (0 = num-clusters)"),
    ConfigKey(
        "group-sizes", "",
        help="shares of the clients per group, e.g. '0.4,0.3,0.2,0.1' ('' = equal groups)",
    ),
    ConfigKey("dirichlet-alpha", 0.0, minimum=0.0, help="label skew (0 = IID)"),
    ConfigKey("mixture-alpha", 0.5, minimum=0.0, help="Dirichlet over sources (rotation-mixture)"),
    ConfigKey(
        "rotation-step", 0.0, minimum=0.0, maximum=359.0,
        help="degrees between rotation groups (0 = spread evenly over 360)",
    ),
    ConfigKey(
        "copy-per-group", False,
        help="each group/source gets its own transformed copy of the whole data set (IFCA)",
    ),
    ConfigKey("test-fraction", 0.2, minimum=0.05, maximum=0.9, help="held-out local test split"),
    ConfigKey(
        "validation-fraction", 0.1, minimum=0.0, maximum=0.5,
        help="held-out local validation split (ACFL's incentive test)",
    ),
    ConfigKey("noisy-clients", 0, minimum=0, help="clients whose labels are randomized"),
    # Shared with the strategies: their declaration, so default, bounds and help
    # are written once.
    ConfigKey.from_param(num_clusters_param(4)),
    ConfigKey("min-nodes", 2, minimum=1,
              help="nodes to wait for before round 1; the fewest connected nodes a round needs"),
    ConfigKey("num-rounds", 15, minimum=1, help="federated rounds"),
    ConfigKey("local-epochs", 1, minimum=1, help="local epochs when local-steps = 0"),
    ConfigKey("local-steps", 10, minimum=0, help="local SGD steps tau (0 = use epochs)"),
    ConfigKey("lr", 0.1, minimum=0.0, help="client SGD learning rate"),
    ConfigKey("batch-size", 32, minimum=1, help="client mini-batch size"),
    ConfigKey.from_param(FRACTION_TRAIN),
    ConfigKey.from_param(SEED),
    ConfigKey("device", "auto", choices=DEVICES, help="where clients compute"),
    ConfigKey("results-dir", "results", help="folder that receives one sub-folder a run"),
    ConfigKey("target-accuracy", 0.8, minimum=0.0, maximum=1.0, help="for rounds-to-target"),
    ConfigKey("proximal-mu", 0.01, minimum=0.0, help="FedProx proximal weight"),
    ConfigKey(
        "torch-threads",
        1,
        minimum=0,
        help="torch threads per client process; match client resources' num-cpus (0 = default)",
    ),
    ConfigKey(
        "max-in-flight",
        0,
        minimum=0,
        help="most messages pushed and unanswered at once (0 = 16 a CPU core in simulation, "
        "no limit deployed)",
    ),
    ConfigKey("round-timeout", 3600.0, minimum=1.0,
              help="seconds every send (round, query, report) waits for replies; later ones drop"),
    ConfigKey(
        "checkpoint-every", 0, minimum=0,
        help="write checkpoint.zip to the results folder every this many rounds (0 = never)",
    ),
    ConfigKey(
        "resume-from", "",
        help="results folder (or checkpoint.zip) of an interrupted run to continue ('' = none)",
    ),
    ConfigKey(
        "plots", True,
        help="write accuracy, assignment and similarity PNGs next to summary.json",
    ),
    ConfigKey(
        "verbose", False,
        help="print Flower's full log (every strategy step, per-round metric records) "
             "instead of one progress line per round",
    ),
)


def _declaring_classes(strategies: Iterable[type[ClusteredStrategy]]) -> list[type]:
    """The classes whose own ``params`` the strategies take: shared bases first."""
    bases: list[type] = []
    for cls in strategies:
        for klass in reversed(cls.__mro__):
            shared = "params" in vars(klass) and not vars(klass).get("name")
            if shared and klass not in bases:
                bases.append(klass)
    return bases + sorted(strategies, key=lambda cls: cls.name or "")


KeyGroup = tuple[type | None, tuple[ConfigKey, ...]]


@lru_cache(maxsize=4)
def _groups(
    strategies: tuple[type[ClusteredStrategy], ...], names: tuple[str, ...]
) -> tuple[KeyGroup, ...]:
    strategy = ConfigKey("strategy", "ifca", choices=names, help="algorithm the ServerApp runs")
    seen = {key.name for key in COMMON_KEYS}
    groups: list[KeyGroup] = [(None, (strategy, *COMMON_KEYS))]
    for klass in _declaring_classes(strategies):
        keys = []
        for param in vars(klass).get("params", ()):
            if param.run_config and param.key not in seen:
                seen.add(param.key)
                keys.append(ConfigKey.from_param(param))
        if keys:
            groups.append((klass, tuple(keys)))
    return tuple(groups)


def key_groups() -> tuple[KeyGroup, ...]:
    """Every run-config key, grouped: ``(None, common keys)``, then ``(class, its keys)``.

    A class's group holds the keys of the parameters it declares that no earlier
    group has: the base classes' shared options first, then each registered
    strategy by its name.
    """
    registered = ClusteredStrategy.registry
    return _groups(tuple(registered[name] for name in sorted(registered)),
                   tuple(strategy_names()))


def config_keys() -> dict[str, ConfigKey]:
    """Every run-config key by name, common keys first, then each strategy's."""
    return {key.name: key for _, keys in key_groups() for key in keys}


def strategy_keys(strategy: str) -> set[str]:
    """The run-config keys a run of ``strategy`` reads: the common keys and its own.

    Its own are the keys of the parameters the strategy declares (its bases' shared
    options included); a baseline of Flower's reads the common keys only.
    """
    common = {key.name for klass, keys in key_groups() if klass is None for key in keys}
    cls = ClusteredStrategy.registry.get(strategy)
    declared = cls.declared_params() if cls is not None else ()
    return common | {param.key for param in declared if param.run_config and param.key}


def parse_run_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a run config and fill in defaults.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        Flower's ``context.run_config`` (possibly empty) merged with any overrides.

    Returns
    -------
    dict[str, Any]
        Every key of :func:`config_keys`, typed and validated.

    Raises
    ------
    ConfigurationError
        For an unknown key or a value outside what the key allows.
    """
    keys = config_keys()
    unknown = sorted(set(run_config) - set(keys))
    if unknown:
        raise ConfigurationError(
            "unknown run-config key(s) " + ", ".join(_unknown_key(name, keys) for name in unknown)
            + "; every key is listed in docs/config.md"
        )
    settings = {key.name: key.default for key in keys.values()}
    for name, value in run_config.items():
        settings[name] = keys[name].validate(value)
    if settings["num-groups"] == 0:
        settings["num-groups"] = settings["num-clusters"]
    return settings


def _unknown_key(name: str, keys: Iterable[str]) -> str:
    """``'name'``, with the closest known key as a suggestion when one is close."""
    close = difflib.get_close_matches(name, list(keys), n=1)
    return f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)


def parse_group_sizes(text: str) -> tuple[float, ...] | None:
    """The ``group-sizes`` key as shares, or ``None`` for equal groups.

    Parameters
    ----------
    text : str
        Comma-separated positive numbers ("0.4,0.3,0.2,0.1" or "4,3,2,1"), or "".
    """
    if not text.strip():
        return None
    try:
        shares = tuple(float(part) for part in text.split(","))
    except ValueError:
        shares = ()
    if not shares or not all(share > 0 and share != float("inf") for share in shares):
        raise ValueError(
            f"run-config key 'group-sizes' has invalid value {text!r}; allowed: '' or "
            f"comma-separated positive numbers, one per group, e.g. '0.4,0.3,0.2,0.1'"
        )
    return shares


def partition_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Return the keyword arguments that define the federated data partition."""
    return {
        "structure": settings["cluster-structure"],
        "num_groups": settings["num-groups"],
        "dirichlet_alpha": settings["dirichlet-alpha"],
        "test_fraction": settings["test-fraction"],
        "validation_fraction": settings["validation-fraction"],
        "noisy_clients": settings["noisy-clients"],
        "mixture_alpha": settings["mixture-alpha"],
        "rotation_step": settings["rotation-step"],
        "copy_per_group": settings["copy-per-group"],
        "group_sizes": parse_group_sizes(settings["group-sizes"]),
        "seed": settings["seed"],
    }
