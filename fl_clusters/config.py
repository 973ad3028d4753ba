"""Run-config schema: every key the app reads, its default and what values it accepts.

Flower hands the ServerApp and ClientApp a flat ``run_config`` mapping whose values
come from ``[tool.flwr.app.config]`` plus ``--run-config`` overrides. Under
``run_simulation`` that mapping is empty, so the defaults live here and not only in
pyproject.toml. Every value is checked once, at the boundary, and a bad one stops the
run with an error that names the key, the value and what is allowed.

Every key is a :class:`~fl_clusters.params.Param` declaration, the one a
strategy's constructor arguments use: the keys of the data, the clients and the run
are declared here (:data:`COMMON_KEYS`); a strategy's keys are its declared
parameters, grouped by the class that declares them, so a strategy registered from
outside fl-clusters brings its keys with it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from logging import INFO
from types import MappingProxyType
from typing import Any

from flwr.common.logger import log

from fl_clusters.data.loaders import DATASET_SHAPES
from fl_clusters.errors import ConfigurationError
from fl_clusters.params import Param, ParamError
from fl_clusters.protocol import OPTIMIZERS
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.registry import (
    BASELINES,
    broken_plugins,
    own_strategies,
    strategy_classes,
    strategy_names,
    unknown_strategy_message,
)
from fl_clusters.strategies.kit.shared_params import (
    FRACTION_EVALUATE,
    FRACTION_TRAIN,
    MIN_AVAILABLE_NODES,
    SEED,
    num_clusters_param,
)

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "emnist")
CLUSTER_STRUCTURES = (
    "rotation", "label-permutation", "none", "rotation-mixture", "label-permutation-mixture"
)
MODELS = ("mlp", "cnn")
# Attack clients of a simulation (fl_clusters.attacks); "none" first, the default.
ATTACKS = ("none", "label-flip", "sign-flip", "scale", "backdoor", "sybil")
DEVICES = ("auto", "cpu", "cuda")
# The key that turns the paper preset's training recipe off (apply_paper_recipe).
PAPER_RECIPE = "paper-recipe"


# The data, the clients and the run; ``strategy``, whose choices are the
# registered strategies, is made by :func:`key_groups`.
COMMON_KEYS: tuple[Param, ...] = (
    Param("dataset", "digits", "str", "data set every client loads", choices=DATASETS,
          key="dataset"),
    Param("data_root", "", "str", "folder of local data files ('' = the loader's default)",
          key="data-root"),
    Param("model", "mlp", "str", "network trained by every client", choices=MODELS, key="model"),
    Param("cluster_structure", "rotation", "str", "how client groups differ",
          choices=CLUSTER_STRUCTURES, key="cluster-structure"),
    Param("num_groups", 0, "int", "ground-truth groups (0 = num-clusters)", low=0,
          key="num-groups"),
    Param("group_sizes", "", "str",
          "shares of the clients per group, e.g. '0.4,0.3,0.2,0.1' ('' = equal groups)",
          key="group-sizes"),
    Param("dirichlet_alpha", 0.0, "float", "label skew (0 = IID)", low=0.0,
          key="dirichlet-alpha"),
    Param("mixture_alpha", 0.5, "float", "Dirichlet over sources (rotation-mixture)", low=0.0,
          key="mixture-alpha"),
    Param("rotation_step", 0.0, "float",
          "degrees between rotation groups (0 = spread evenly over 360)", low=0.0, high=359.0,
          key="rotation-step"),
    Param("copy_per_group", False, "bool",
          "each group/source gets its own transformed copy of the whole data set (IFCA)",
          key="copy-per-group"),
    Param("test_fraction", 0.2, "float", "held-out local test split", low=0.05, high=0.9,
          key="test-fraction"),
    Param("validation_fraction", 0.1, "float",
          "held-out local validation split (ACFL's incentive test)", low=0.0, high=0.5,
          key="validation-fraction"),
    Param("noisy_clients", 0, "int", "clients whose labels are randomized", low=0,
          key="noisy-clients"),
    # Shared with the strategies: their declaration, so default, bounds and help
    # are written once.
    num_clusters_param(4),
    MIN_AVAILABLE_NODES,
    Param("num_rounds", 15, "int", "federated rounds", low=1, key="num-rounds"),
    Param("local_epochs", 1, "int", "local epochs when local-steps = 0", low=1,
          key="local-epochs"),
    Param("local_steps", 10, "int", "local SGD steps tau (0 = use epochs)", low=0,
          key="local-steps"),
    Param("lr", 0.1, "float", "client SGD learning rate", low=0.0, key="lr"),
    Param("optimizer", "sgd", "str",
          "the built-in learner's optimizer, fresh each round as a user's train() makes it: "
          "'sgd', 'sgd-momentum' (0.9) or 'adam' (lr is its step size)",
          choices=OPTIMIZERS, key="optimizer"),
    Param("batch_size", 32, "int", "client mini-batch size", low=1, key="batch-size"),
    FRACTION_TRAIN,
    FRACTION_EVALUATE,
    SEED,
    Param("device", "auto", "str", "where clients compute", choices=DEVICES, key="device"),
    Param("results_dir", "results", "str", "folder that receives one sub-folder a run",
          key="results-dir"),
    Param("target_accuracy", 0.8, "float", "for rounds-to-target", low=0.0, high=1.0,
          key="target-accuracy"),
    Param("paper_recipe", True, "bool",
          "under preset = 'paper', the training-recipe keys left at their defaults take the "
          "paper's values (docs/paper-fidelity.md); false keeps the app's", key=PAPER_RECIPE),
    Param("proximal_mu", 0.01, "float", "FedProx proximal weight", low=0.0, key="proximal-mu"),
    # Attack clients, simulations only (fl_clusters.attacks, docs/config.md). The
    # share defaults to 0 so that the kind and the share are always set together
    # (check_attack_keys): a share left over from another run cannot turn attackers
    # on, nor a kind without its share run a clean federation under its name.
    Param("attack", "none", "str",
          "what the attacking clients do (simulation only): 'none', 'label-flip', "
          "'sign-flip', 'scale', 'backdoor' or 'sybil'", choices=ATTACKS, key="attack"),
    Param("attack_share", 0.0, "float",
          "share of the clients that attack (of group attack-group when set); 0 with "
          "attack = 'none' only", low=0.0, high=1.0, key="attack-share"),
    Param("attack_group", -1, "int", "ground-truth group the attackers are drawn from "
          "(-1 = any group)", low=-1, key="attack-group"),
    Param("attack_scale", 10.0, "float", "factor on the attackers' updates: sign-flip, "
          "scale (model replacement), backdoor, sybil", above=0.0, key="attack-scale"),
    Param("attack_target", 0, "int", "class the backdoor's trigger makes the model predict",
          low=0, key="attack-target"),
    # Clients that are not nodes (fl_clusters.logical_grid, docs/performance.md).
    Param("num_clients", 0, "int",
          "logical clients served by the federation's SuperNodes as a pool, in blocks "
          "(simulation only; 0 = one SuperNode a client)", low=0, key="num-clients"),
    Param("samples_per_client", 0, "int",
          "samples of its group each client gets, as IFCA's m x n split (0 = the data set "
          "split over the clients)", low=0, key="samples-per-client"),
    Param("client_state_memory_mb", 2048.0, "float",
          "logical clients' kept state (FedSoft's own models...) held in memory; the rest "
          "goes to a temporary folder", low=0.0, key="client-state-memory-mb"),
    Param("report_clients", 1000, "int",
          "clients the final report scores, a seeded sample (0 = every client)", low=0,
          key="report-clients"),
    Param("torch_threads", 1, "int",
          "torch threads per client process; match client resources' num-cpus (0 = default)",
          low=0, key="torch-threads"),
    Param("max_in_flight", 0, "int",
          "most messages pushed and unanswered at once (0 = 16 a CPU core in simulation, "
          "no limit deployed)", low=0, key="max-in-flight"),
    Param("round_timeout", 3600.0, "float",
          "seconds every send (round, query, report) waits for replies; later ones drop",
          low=1.0, key="round-timeout"),
    Param("checkpoint_every", 0, "int",
          "write checkpoint.zip to the results folder every this many rounds (0 = never)",
          low=0, key="checkpoint-every"),
    Param("resume_from", "", "str",
          "results folder (or checkpoint.zip) of an interrupted run to continue ('' = none)",
          key="resume-from"),
    Param("plots", True, "bool",
          "write accuracy, assignment and similarity PNGs next to summary.json", key="plots"),
    Param("verbose", False, "bool",
          "print Flower's full log (every strategy step, per-round metric records) "
          "instead of one progress line per round", key="verbose"),
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


KeyGroup = tuple[type | None, tuple[Param, ...]]


@lru_cache(maxsize=4)
def _groups(
    strategies: tuple[type[ClusteredStrategy], ...], names: tuple[str, ...]
) -> tuple[KeyGroup, ...]:
    strategy = Param("strategy", "ifca", "str", "algorithm the ServerApp runs", choices=names,
                     key="strategy")
    seen = {key.key for key in COMMON_KEYS}
    groups: list[KeyGroup] = [(None, (strategy, *COMMON_KEYS))]
    for klass in _declaring_classes(strategies):
        keys = []
        for param in vars(klass).get("params", ()):
            if param.run_config and param.key not in seen:
                seen.add(param.key)
                keys.append(param)
        if keys:
            groups.append((klass, tuple(keys)))
    return tuple(groups)


def key_groups(*, own_only: bool = False) -> tuple[KeyGroup, ...]:
    """Every run-config key, grouped: ``(None, common keys)``, then ``(class, its keys)``.

    A class's group holds the keys of the parameters it declares that no earlier
    group has: the base classes' shared options first, then each registered
    strategy by its name. ``own_only``: fl-clusters' own strategies, not the
    installed plug-ins' (what the generated pages and pyproject.toml list).
    """
    registered = own_strategies() if own_only else strategy_classes()
    names = [name for name in strategy_names() if name in registered or name in BASELINES]
    return _groups(tuple(registered.values()), tuple(names))


def config_keys() -> dict[str, Param]:
    """Every run-config key's declaration by key, common keys first, then each strategy's."""
    return {str(key.key): key for _, keys in key_groups() for key in keys}


def strategy_keys(strategy: str) -> set[str]:
    """The run-config keys a run of ``strategy`` reads: the common keys and its own.

    Its own are the keys of the parameters the strategy declares (its bases' shared
    options included); a baseline of Flower's reads the common keys only.
    """
    common = {key.key for klass, keys in key_groups() if klass is None for key in keys}
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
    settings = {name: key.config_default for name, key in keys.items()}
    for name, value in run_config.items():
        try:
            settings[name] = keys[name].run_config_value(value)
        except ParamError as error:
            if name == "strategy" and isinstance(value, str) and value in broken_plugins:
                # The name of an installed plug-in that did not load: say why.
                raise ConfigurationError(unknown_strategy_message(value)) from error
            raise ConfigurationError(
                f"{error}. Fix it in [tool.flwr.app.config] or with --run-config "
                f"\"{name}=...\"."
            ) from error
    if settings["num-groups"] == 0:
        settings["num-groups"] = settings["num-clusters"]
    check_attack_keys(settings)
    return settings


def check_attack_keys(settings: Mapping[str, Any]) -> None:
    """Refuse attack keys that do not go together, naming the keys and the fix.

    Raises
    ------
    ConfigurationError
        An attack without a share (or a share without an attack), a group the
        federation does not have, or a backdoor target outside the data set's classes.
    """
    kind, share = settings["attack"], settings["attack-share"]
    if (kind == "none") != (share == 0.0):
        raise ConfigurationError(
            f"run-config keys 'attack'={kind!r} and 'attack-share'={share} do not go "
            "together: set both (e.g. attack='sign-flip' attack-share=0.2) or neither "
            "(attack='none' attack-share=0.0)")
    if settings["attack-group"] >= settings["num-groups"]:
        raise ConfigurationError(
            f"run-config key 'attack-group'={settings['attack-group']} names no group of "
            f"the {settings['num-groups']} ('num-groups'); set it below {settings['num-groups']}, "
            "or -1 for attackers from any group")
    classes = DATASET_SHAPES[settings["dataset"]][1]
    if kind == "backdoor" and settings["attack-target"] >= classes:
        raise ConfigurationError(
            f"run-config key 'attack-target'={settings['attack-target']} is no class of "
            f"{settings['dataset']!r} ({classes} classes); set it in [0, {classes - 1}]")


@dataclass
class RecipeOutcome:
    """What ``preset="paper"`` did to a run's training recipe (summary.json's ``paper_recipe``).

    Each is run-config key -> record: ``applied``, the paper's values the run took
    (``value``, ``source``); ``kept``, the user's values it kept (``value``, the
    ``paper``'s, ``source``); ``not_applied``, the paper's values the library
    cannot run (``paper``, ``why``, ``source``).
    """

    applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)
    not_applied: dict[str, dict[str, Any]] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The ``summary.json`` entry."""
        return {"paper_recipe": {"applied": self.applied, "kept": self.kept,
                                 "not_applied": self.not_applied}}


def apply_paper_recipe(
    settings: Mapping[str, Any],
) -> tuple[dict[str, Any], RecipeOutcome | None]:
    """``settings`` with the paper's training recipe, under ``preset="paper"``.

    Every key of the strategy's recipe (``Declared.paper_recipe``) that the user did
    not set takes the paper's value; a key the user set is kept. Flower hands the
    ServerApp one merged run config (pyproject.toml's values and the overrides), so
    a key counts as the user's when its value differs from the key's default: a
    value the user gives equal to the default is taken for no value, and the paper's
    replaces it (docs/paper-fidelity.md). Each key applied or kept is logged with
    its source.

    Returns
    -------
    tuple[dict[str, Any], RecipeOutcome | None]
        The run config to run, and what the preset did (``None``: nothing to do: the
        robust preset, a baseline, or ``paper-recipe = false``).
    """
    cls = ClusteredStrategy.registry.get(settings["strategy"])
    if cls is None or settings["preset"] != "paper" or not settings[PAPER_RECIPE]:
        return dict(settings), None
    keys, resolved, outcome = config_keys(), dict(settings), RecipeOutcome()
    for value in cls.paper_recipe(settings):
        if value.not_applied:
            outcome.not_applied[value.key] = {"paper": value.value, "why": value.not_applied,
                                              "source": value.source}
            log(INFO, "preset 'paper': the paper's %s %r is not applied: %s (%s)",
                value.key, value.value, value.not_applied, value.source)
        elif not value.applies:
            continue
        elif settings[value.key] != keys[value.key].config_default:
            outcome.kept[value.key] = {"value": settings[value.key], "paper": value.value,
                                       "source": value.source}
            log(INFO, "preset 'paper' keeps %s=%r, the user's; the paper's %r (%s)",
                value.key, settings[value.key], value.value, value.source)
        else:
            resolved[value.key] = keys[value.key].run_config_value(value.value)
            outcome.applied[value.key] = {"value": resolved[value.key], "source": value.source}
            log(INFO, "preset 'paper' sets %s=%r (%s)", value.key, value.value, value.source)
    return resolved, outcome


def resolve_run_config(
    run_config: Mapping[str, Any],
) -> tuple[dict[str, Any], RecipeOutcome | None]:
    """The run config fl-clusters' ServerApp runs: validated, defaults filled in
    (:func:`parse_run_config`), and the paper's training recipe under
    ``preset="paper"`` (:func:`apply_paper_recipe`)."""
    return apply_paper_recipe(parse_run_config(run_config))


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
        raise ParamError("group-sizes", "'' or comma-separated positive numbers, one per "
                         "group, e.g. '0.4,0.3,0.2,0.1'", text, key=True)
    return shares


@lru_cache(maxsize=8)
def _parsed(items: tuple[tuple[str, Any], ...]) -> Mapping[str, Any]:
    return MappingProxyType(parse_run_config(dict(items)))


def cached_run_config(run_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """:func:`parse_run_config`, read-only, parsed once per distinct run config.

    A ClientApp parses its run config on every message, and a pool node serving a
    block of logical clients handles the same run config for each of them.
    """
    try:
        return _parsed(tuple(sorted(run_config.items())))
    except TypeError:  # an unhashable value (a list): parse it every time
        return parse_run_config(run_config)


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
        "samples_per_client": settings["samples-per-client"],
        "seed": settings["seed"],
    }
