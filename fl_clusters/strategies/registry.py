"""Build the strategy a run config names (the ServerApp's ``strategy`` key)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.serverapp.strategy import FedAvg, FedProx, Strategy

from fl_clusters.strategies.acfl import ACFL
from fl_clusters.strategies.cfl import CFL
from fl_clusters.strategies.fedem import FedEM
from fl_clusters.strategies.fedsoft import FedSoft
from fl_clusters.strategies.fldc import FLDC
from fl_clusters.strategies.flhc import FLHC
from fl_clusters.strategies.ifca import IFCA
from fl_clusters.strategies.local import LocalOnly
from fl_clusters.strategies.wecfl import WeCFL

Settings = Mapping[str, Any]


def _common(settings: Settings) -> dict[str, Any]:
    return {
        "fraction_train": settings["fraction-train"],
        "min_available_nodes": settings["min-available-nodes"],
        "max_failed_rounds": settings["max-failed-rounds"],
        "seed": settings["seed"],
    }


def _inter_cluster(settings: Settings) -> dict[str, Any]:
    # AWCFL and MCFL apply to every hard-clustered strategy (Li and Yan 2023).
    return {
        "awcfl_beta": settings["awcfl-beta"],
        "mcfl": settings["mcfl"],
        "mcfl_feature_samples": settings["mcfl-feature-samples"],
    }


def _ifca(settings: Settings) -> Strategy:
    return IFCA(
        settings["num-clusters"],
        mode=settings["ifca-mode"],
        server_lr=settings["ifca-server-lr"],
        aggregation=settings["ifca-aggregation"],
        head_layers=settings["ifca-head-layers"],
        init=settings["ifca-init"],
        restarts=settings["ifca-restarts"],
        init_steps=settings["ifca-init-steps"],
        reseed_after=settings["ifca-reseed-after"],
        **_inter_cluster(settings),
        **_common(settings),
    )


def _cfl(settings: Settings) -> Strategy:
    return CFL(
        gate=settings["cfl-gate"],
        mean_ratio=settings["cfl-mean-ratio"],
        max_ratio=settings["cfl-max-ratio"],
        eps1=settings["cfl-eps1"],
        eps2=settings["cfl-eps2"],
        split_threshold=settings["cfl-split-threshold"],
        min_silhouette=settings["cfl-min-silhouette"],
        warmup_rounds=settings["cfl-warmup-rounds"],
        **_inter_cluster(settings),
        **_common(settings),
    )


def _acfl(settings: Settings) -> Strategy:
    return ACFL(
        beta=settings["acfl-beta"],
        max_rejections=settings["acfl-max-rejections"],
        gate=settings["acfl-gate"],
        converge_window=settings["acfl-converge-window"],
        converge_tolerance=settings["acfl-converge-tolerance"],
        mean_norm_max=settings["acfl-mean-norm-max"],
        max_norm_min=settings["acfl-max-norm-min"],
        phase1_rounds=settings["acfl-phase1-rounds"],
        trial_epochs=settings["acfl-trial-epochs"],
        incentive_threshold=settings["acfl-incentive-threshold"],
        noise_z=settings["acfl-noise-z"],
        **_inter_cluster(settings),
        **_common(settings),
    )


def _fedsoft(settings: Settings) -> Strategy:
    return FedSoft(
        settings["num-clusters"],
        tau=settings["fedsoft-tau"],
        sigma=settings["fedsoft-sigma"],
        clients_per_cluster=settings["fedsoft-clients-per-cluster"],
        proximal_lambda=settings["fedsoft-lambda"],
        init=settings["fedsoft-init"],
        min_available_nodes=settings["min-available-nodes"],
        max_failed_rounds=settings["max-failed-rounds"],
        seed=settings["seed"],
    )


def _fldc(settings: Settings) -> Strategy:
    return FLDC(
        min_pts=settings["fldc-min-pts"],
        eps=settings["fldc-eps"] or None,  # 0 = chosen by eps_method
        eps_method=settings["fldc-eps-method"],
        r=settings["fldc-r"],
        min_available_nodes=settings["min-available-nodes"],
        max_failed_rounds=settings["max-failed-rounds"],
        seed=settings["seed"],
    )


def _flhc(settings: Settings) -> Strategy:
    return FLHC(
        warmup_rounds=settings["flhc-warmup-rounds"],
        linkage=settings["flhc-linkage"],
        metric=settings["flhc-metric"],
        threshold=settings["flhc-threshold"],
        min_gap=settings["flhc-min-gap"],
        distance_ratio=settings["flhc-distance-ratio"],
        distance_threshold=settings["flhc-distance-threshold"],
        **_inter_cluster(settings),
        **_common(settings),
    )


def _wecfl(settings: Settings) -> Strategy:
    return WeCFL(
        settings["num-clusters"],
        n_init=settings["wecfl-n-init"],
        **_inter_cluster(settings),
        **_common(settings),
    )


def _fedem(settings: Settings) -> Strategy:
    return FedEM(
        settings["num-clusters"],
        init=settings["fedem-init"],
        init_steps=settings["fedem-init-steps"],
        **_common(settings),
    )


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


def _local(settings: Settings) -> Strategy:
    return LocalOnly(**_common(settings))


BUILDERS: dict[str, Callable[[Settings], Strategy]] = {
    "ifca": _ifca,
    "cfl": _cfl,
    "acfl": _acfl,
    "fedsoft": _fedsoft,
    "fldc": _fldc,
    "fedavg": _fedavg,
    "fedprox": _fedprox,
    "local": _local,
    "flhc": _flhc,
    "wecfl": _wecfl,
    "fedem": _fedem,
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
