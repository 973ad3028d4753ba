"""Build the strategy a run config names (the ServerApp's ``strategy`` key)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from flwr.serverapp.strategy import FedAvg, FedProx, Strategy

from fl_clusters.strategies.acfl import ACFL
from fl_clusters.strategies.base import ClusteredStrategy
from fl_clusters.strategies.cfl import CFL
from fl_clusters.strategies.fedem import FedEM
from fl_clusters.strategies.fedsoft import FedSoft
from fl_clusters.strategies.fldc import FLDC
from fl_clusters.strategies.flhc import FLHC
from fl_clusters.strategies.ifca import IFCA
from fl_clusters.strategies.local import LocalOnly
from fl_clusters.strategies.params import ParamError
from fl_clusters.strategies.wecfl import WeCFL

Settings = Mapping[str, Any]

# Constructor argument -> run-config key, per strategy: what builds each strategy
# from a run config, and what its errors name when a value is refused.
COMMON = {
    "fraction_train": "fraction-train",
    # The ServerApp's settings carry run-config key 'min-nodes' under this name.
    "min_available_nodes": "min-available-nodes",
    "max_failed_rounds": "max-failed-rounds",
    "seed": "seed",
}
# AWCFL and MCFL apply to every hard-clustered strategy (Li and Yan 2023).
INTER_CLUSTER = {
    "awcfl_beta": "awcfl-beta",
    "mcfl": "mcfl",
    "mcfl_feature_samples": "mcfl-feature-samples",
}
WITHOUT_FRACTION_TRAIN = {k: v for k, v in COMMON.items() if k != "fraction_train"}
CLUSTERED: dict[str, tuple[type[ClusteredStrategy], dict[str, str]]] = {
    "ifca": (IFCA, {
        "num_clusters": "num-clusters",
        "mode": "ifca-mode",
        "server_lr": "ifca-server-lr",
        "aggregation": "ifca-aggregation",
        "head_layers": "ifca-head-layers",
        "init": "ifca-init",
        "restarts": "ifca-restarts",
        "init_steps": "ifca-init-steps",
        "reseed_after": "ifca-reseed-after",
        **INTER_CLUSTER, **COMMON,
    }),
    "cfl": (CFL, {
        "gate": "cfl-gate",
        "mean_ratio": "cfl-mean-ratio",
        "max_ratio": "cfl-max-ratio",
        "eps1": "cfl-eps1",
        "eps2": "cfl-eps2",
        "split_threshold": "cfl-split-threshold",
        "min_silhouette": "cfl-min-silhouette",
        "warmup_rounds": "cfl-warmup-rounds",
        **INTER_CLUSTER, **COMMON,
    }),
    "acfl": (ACFL, {
        "beta": "acfl-beta",
        "max_rejections": "acfl-max-rejections",
        "gate": "acfl-gate",
        "converge_window": "acfl-converge-window",
        "converge_tolerance": "acfl-converge-tolerance",
        "mean_norm_max": "acfl-mean-norm-max",
        "max_norm_min": "acfl-max-norm-min",
        "phase1_rounds": "acfl-phase1-rounds",
        "trial_epochs": "acfl-trial-epochs",
        "incentive_threshold": "acfl-incentive-threshold",
        "noise_z": "acfl-noise-z",
        **INTER_CLUSTER, **COMMON,
    }),
    "fedsoft": (FedSoft, {
        "num_clusters": "num-clusters",
        "tau": "fedsoft-tau",
        "sigma": "fedsoft-sigma",
        "clients_per_cluster": "fedsoft-clients-per-cluster",
        "proximal_lambda": "fedsoft-lambda",
        "init": "fedsoft-init",
        **WITHOUT_FRACTION_TRAIN,
    }),
    "fldc": (FLDC, {
        "min_pts": "fldc-min-pts",
        "eps": "fldc-eps",
        "eps_method": "fldc-eps-method",
        "r": "fldc-r",
        **WITHOUT_FRACTION_TRAIN,
    }),
    "flhc": (FLHC, {
        "warmup_rounds": "flhc-warmup-rounds",
        "linkage": "flhc-linkage",
        "metric": "flhc-metric",
        "threshold": "flhc-threshold",
        "min_gap": "flhc-min-gap",
        "distance_ratio": "flhc-distance-ratio",
        "distance_threshold": "flhc-distance-threshold",
        **INTER_CLUSTER, **COMMON,
    }),
    "wecfl": (WeCFL, {
        "num_clusters": "num-clusters",
        "n_init": "wecfl-n-init",
        **INTER_CLUSTER, **COMMON,
    }),
    "fedem": (FedEM, {
        "num_clusters": "num-clusters",
        "init": "fedem-init",
        "init_steps": "fedem-init-steps",
        **COMMON,
    }),
    "local": (LocalOnly, COMMON),
}


def _clustered(name: str, settings: Settings) -> ClusteredStrategy:
    """Build fl-clusters' strategy ``name``; a refused value names its run-config key."""
    cls, keys = CLUSTERED[name]
    arguments = {argument: settings[key] for argument, key in keys.items()}
    if name == "fldc":
        arguments["eps"] = arguments["eps"] or None  # run-config 0 = chosen by eps_method
    try:
        strategy = cls(**arguments)
    except ParamError as error:
        key = keys.get(error.name, error.name)
        if error.name == "min_available_nodes":
            key = "min-nodes"  # what the user sets; the ServerApp passes it on under this name
        raise ValueError(
            f"run-config key '{key}' must be {error.expected} for strategy '{name}'; "
            f"got {error.value!r}"
        ) from error
    # Its later messages then name the run-config keys the user can change.
    strategy.from_run_config = True
    return strategy


def _fedavg(settings: Settings) -> Strategy:
    # Flower's own strategy, unchanged: the baseline must be the one users know.
    return FedAvg(
        fraction_train=settings["fraction-train"],
        min_available_nodes=settings["min-available-nodes"],
    )


def _fedprox(settings: Settings) -> Strategy:
    return FedProx(
        fraction_train=settings["fraction-train"],
        min_available_nodes=settings["min-available-nodes"],
        proximal_mu=settings["proximal-mu"],
    )


BUILDERS: dict[str, Callable[[Settings], Strategy]] = {
    **{name: partial(_clustered, name) for name in CLUSTERED},
    "fedavg": _fedavg,
    "fedprox": _fedprox,
}


def build_strategy(settings: Settings) -> Strategy:
    """Return the configured strategy.

    Parameters
    ----------
    settings : Mapping[str, Any]
        Validated run config (:func:`fl_clusters.config.parse_run_config`) plus
        ``min-available-nodes``, the fewest connected nodes a round needs
        (the run-config key ``min-nodes``).
    """
    name = settings["strategy"]
    if name not in BUILDERS:
        raise ValueError(
            f"run-config key 'strategy' has value {name!r}, which is not available in this "
            f"build; allowed: {', '.join(sorted(BUILDERS))}"
        )
    return BUILDERS[name](settings)
