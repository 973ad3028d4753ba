"""Run-config schema: every key the app reads, its default and what values it accepts.

Flower hands the ServerApp and ClientApp a flat ``run_config`` mapping whose values
come from ``[tool.flwr.app.config]`` plus ``--run-config`` overrides. Under
``run_simulation`` that mapping is empty, so the defaults live here and not only in
pyproject.toml. Every value is checked once, at the boundary, and a bad one stops the
run with an error that names the key, the value and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_clusters.clustering.ordering import INCENTIVE_THRESHOLDS
from fl_clusters.errors import ConfigurationError

STRATEGIES = (
    "ifca", "fedavg", "fedprox", "local", "cfl", "acfl", "fedsoft", "fldc", "flhc", "wecfl",
    "fedem",
)
DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "emnist")
CLUSTER_STRUCTURES = (
    "rotation", "label-permutation", "none", "rotation-mixture", "label-permutation-mixture"
)
MODELS = ("mlp", "cnn")
DEVICES = ("auto", "cpu", "cuda")
IFCA_MODES = ("model", "gradient")
IFCA_INITS = ("local-kmeans", "random")
IFCA_AGGREGATIONS = ("weighted", "paper")
GATES = ("relative", "absolute")
FEDSOFT_INITS = ("random", "local-kmeans")
FLHC_LINKAGES = ("ward", "average", "complete", "single")
FLHC_METRICS = ("euclidean", "manhattan", "cosine")
FLHC_THRESHOLDS = ("gap", "relative", "absolute")
FEDEM_INITS = ("local-kmeans", "random")


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
        Inclusive bounds for a numeric key.
    exclusive_minimum : bool
        Whether ``minimum`` itself is refused (a share that must be > 0).
    help : str
        One line for the README and error messages.
    """

    name: str
    default: bool | int | float | str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    help: str = ""

    def allowed(self) -> str:
        """Describe the allowed values in words."""
        if self.choices is not None:
            return ", ".join(self.choices)
        kind = type(self.default).__name__
        low = "(" if self.exclusive_minimum else "["
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} in {low}{self.minimum}, {self.maximum}]"
        if self.minimum is not None:
            return f"{kind} {'>' if self.exclusive_minimum else '>='} {self.minimum}"
        if self.maximum is not None:
            return f"{kind} <= {self.maximum}"
        return kind

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
        if self.choices is not None and converted not in self.choices:
            raise self._error(value)
        if self.minimum is not None and (
            converted < self.minimum or (self.exclusive_minimum and converted == self.minimum)
        ):
            raise self._error(value)
        if self.maximum is not None and converted > self.maximum:
            raise self._error(value)
        return converted

    def _error(self, value: Any) -> ConfigurationError:
        return ConfigurationError(
            f"run-config key '{self.name}' has invalid value {value!r}; allowed: "
            f"{self.allowed()}. Fix it in [tool.flwr.app.config] or with "
            f"--run-config \"{self.name}=...\"."
        )


KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("strategy", "ifca", choices=STRATEGIES, help="algorithm the ServerApp runs"),
    ConfigKey("dataset", "digits", choices=DATASETS, help="data set every client loads"),
    ConfigKey("data-root", "", help="folder of local data files ('' = the loader's default)"),
    ConfigKey("model", "mlp", choices=MODELS, help="network trained by every client"),
    ConfigKey(
        "cluster-structure", "rotation", choices=CLUSTER_STRUCTURES,
        help="how client groups differ",
    ),
    ConfigKey("num-groups", 0, minimum=0, help="ground-truth groups (0 = num-clusters)"),
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
    ConfigKey(
        "num-clusters", 4, minimum=1,
        help="k cluster models (IFCA, FedSoft, WeCFL); FedEM's M components",
    ),
    ConfigKey("min-nodes", 2, minimum=1,
              help="nodes to wait for before round 1; the fewest connected nodes a round needs"),
    ConfigKey("num-rounds", 15, minimum=1, help="federated rounds"),
    ConfigKey("local-epochs", 1, minimum=1, help="local epochs when local-steps = 0"),
    ConfigKey("local-steps", 10, minimum=0, help="local SGD steps tau (0 = use epochs)"),
    ConfigKey("lr", 0.1, minimum=0.0, help="client SGD learning rate"),
    ConfigKey("batch-size", 32, minimum=1, help="client mini-batch size"),
    ConfigKey("fraction-train", 1.0, minimum=0.0, maximum=1.0, help="clients sampled a round"),
    ConfigKey("seed", 0, minimum=0, help="seed of data partition, init and sampling"),
    ConfigKey("device", "auto", choices=DEVICES, help="where clients compute"),
    ConfigKey("results-dir", "results", help="folder that receives one sub-folder a run"),
    ConfigKey("target-accuracy", 0.8, minimum=0.0, maximum=1.0, help="for rounds-to-target"),
    ConfigKey("proximal-mu", 0.01, minimum=0.0, help="FedProx proximal weight"),
    ConfigKey("ifca-mode", "model", choices=IFCA_MODES, help="IFCA model or gradient averaging"),
    ConfigKey(
        "ifca-restarts", 1, minimum=1,
        help="IFCA random initializations to try (ifca-init='random'; most balanced wins)",
    ),
    ConfigKey("ifca-head-layers", 0, minimum=0, help="IFCA weight sharing: clustered last layers"),
    ConfigKey("awcfl-beta", 0.0, minimum=0.0, maximum=1.0, help="AWCFL inter-cluster mixing"),
    ConfigKey("mcfl", False, help="MCFL: clients pick a cluster model by feature mean"),
    ConfigKey("mcfl-feature-samples", 32, minimum=1, help="MCFL inputs averaged per client"),
    # CFL defaults tuned on 4-rotation digits with the MLP (lr 0.1, 10 local steps):
    # rotation groups split with cross similarity <= 0.32 and max norm >= 0.49, while
    # one distribution keeps cross similarity >= 0.53 and, late, max norm <= 0.44.
    # The authors' EMNIST demo used eps1 0.4, eps2 1.6; rescale eps2 with the model.
    ConfigKey("cfl-eps1", 0.4, minimum=0.0, help="CFL: split when mean update norm < eps1"),
    ConfigKey("cfl-eps2", 0.45, minimum=0.0, help="CFL: and max client update norm > eps2"),
    ConfigKey(
        "cfl-split-threshold", 0.45, minimum=-1.0, maximum=1.0,
        help="CFL: accept when max cross-cluster cosine < this",
    ),
    ConfigKey("cfl-warmup-rounds", 2, minimum=0, help="CFL: no split in the first rounds"),
    ConfigKey(
        "acfl-beta", -0.17, minimum=-100.0, maximum=100.0,
        help="ACFL incentive threshold of acfl-incentive-threshold=beta (the paper)",
    ),
    ConfigKey("acfl-max-rejections", 3, minimum=1, help="ACFL: close a cluster after m misses"),
    ConfigKey("acfl-mean-norm-max", 0.4, minimum=0.0, help="ACFL phase 1: mean norm below"),
    ConfigKey("acfl-max-norm-min", 0.0, minimum=0.0, help="ACFL phase 1: max norm above"),
    ConfigKey("acfl-phase1-rounds", 10, minimum=1, help="ACFL phase 1 round budget"),
    # 60 epochs of a digits client's ~63 samples are 120 SGD steps, the order of the
    # paper's 15 epochs over ~3,000 MNIST samples in batches of 128 (about 350 steps).
    ConfigKey("acfl-trial-epochs", 60, minimum=1, help="ACFL trial federation local epochs"),
    ConfigKey("fedsoft-tau", 2, minimum=1, help="FedSoft: importance estimate every tau rounds"),
    ConfigKey("fedsoft-sigma", 1e-4, minimum=0.0, maximum=1.0, help="FedSoft importance floor"),
    ConfigKey("fedsoft-clients-per-cluster", 5, minimum=1, help="FedSoft K"),
    ConfigKey("fedsoft-lambda", 0.1, minimum=0.0, help="FedSoft proximal weight"),
    ConfigKey(
        "fedsoft-init", "random", choices=FEDSOFT_INITS,
        help="FedSoft cluster models: random draws, or k-means of a warm-start round",
    ),
    ConfigKey("fldc-min-pts", 4, minimum=2, help="FLDC DBSCAN MinPts (the point itself counts)"),
    ConfigKey("fldc-eps", 0.0, minimum=0.0,
              help="FLDC DBSCAN eps (0 = chosen by fldc-eps-method)"),
    ConfigKey("fldc-eps-method", "knee", choices=("knee", "silhouette"),
              help="FLDC eps when fldc-eps is 0: k-distance knee, or best silhouette "
                   "over a grid (the paper's table 5)"),
    ConfigKey(
        "fldc-r", 0.2, minimum=0.0, maximum=1.0, exclusive_minimum=True,
        help="FLDC sampling rate per cluster",
    ),
    # Keys of the defaults that find groups on data they were not tuned on
    # (docs/clustering-defaults.md).
    ConfigKey(
        "group-sizes", "",
        help="shares of the clients per group, e.g. '0.4,0.3,0.2,0.1' ('' = equal groups)",
    ),
    ConfigKey(
        "ifca-init", "local-kmeans", choices=IFCA_INITS,
        help="IFCA start: k-means of a first local round, or the paper's random models",
    ),
    ConfigKey(
        "ifca-init-steps", 100, minimum=1,
        help="IFCA local-kmeans start: local SGD steps of the first round",
    ),
    ConfigKey("ifca-server-lr", 0.5, minimum=0.0, help="IFCA gradient mode: server step gamma"),
    ConfigKey(
        "ifca-aggregation", "weighted", choices=IFCA_AGGREGATIONS,
        help="IFCA: example-weighted means, or the paper's unweighted updates",
    ),
    ConfigKey(
        "ifca-reseed-after", 3, minimum=0,
        help="IFCA: re-seed a cluster no client chose for this many rounds (0 = never)",
    ),
    ConfigKey(
        "cfl-gate", "relative", choices=GATES,
        help="CFL split norms: scale-free (same round's updates), or absolute eps1/eps2",
    ),
    ConfigKey(
        "cfl-mean-ratio", 0.8, minimum=0.0, maximum=1.0, exclusive_minimum=True,
        help="CFL relative gate: split when |mean update| < this x the mean update norm",
    ),
    ConfigKey(
        "cfl-max-ratio", 0.0, minimum=0.0,
        help="CFL relative gate: largest update norm > this x the largest of the first "
             "rounds (0: > 0)",
    ),
    ConfigKey(
        "cfl-min-silhouette", 0.4, minimum=-1.0, maximum=1.0,
        help="CFL: split only when the updates' best silhouette over 2..10 groups is >= this "
             "(-1 = off)",
    ),
    ConfigKey(
        "acfl-gate", "relative", choices=GATES,
        help="ACFL phase 1 end: mean norm stops changing, or absolute norm thresholds",
    ),
    ConfigKey(
        "acfl-incentive-threshold", "noise", choices=INCENTIVE_THRESHOLDS,
        help="ACFL: a candidate joins when the incentive and the candidate's own gain are "
             "each >= -acfl-noise-z standard errors (noise), or when the incentive is >= "
             "acfl-beta (beta, the paper)",
    ),
    ConfigKey(
        "acfl-noise-z", 2.0, minimum=0.0, maximum=100.0,
        help="ACFL noise threshold: tolerance in standard errors of the incentive",
    ),
    ConfigKey(
        "acfl-converge-window", 2, minimum=1,
        help="ACFL relative gate: rounds averaged on each side of the comparison",
    ),
    ConfigKey(
        "acfl-converge-tolerance", 0.1, minimum=0.0, maximum=1.0,
        help="ACFL relative gate: converged when the mean norm changes by less than this",
    ),
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
        "max-failed-rounds", 3, minimum=1,
        help="stop the run after this many training rounds in a row without a valid reply",
    ),
    ConfigKey(
        "checkpoint-every", 0, minimum=0,
        help="write checkpoint.pkl to the results folder every this many rounds (0 = never)",
    ),
    ConfigKey(
        "resume-from", "",
        help="results folder (or checkpoint.pkl) of an interrupted run to continue ('' = none)",
    ),
    # FL+HC and WeCFL (docs/clustering-defaults.md: how the defaults were chosen).
    ConfigKey("flhc-warmup-rounds", 3, minimum=0, help="FL+HC: FedAvg rounds before clustering"),
    ConfigKey("flhc-linkage", "ward", choices=FLHC_LINKAGES, help="FL+HC agglomerative linkage"),
    ConfigKey(
        "flhc-metric", "euclidean", choices=FLHC_METRICS,
        help="FL+HC distance between updates (ward needs euclidean)",
    ),
    ConfigKey(
        "flhc-threshold", "gap", choices=FLHC_THRESHOLDS,
        help="FL+HC cut: largest jump of merge heights, ratio x nearest distance, or absolute",
    ),
    ConfigKey(
        "flhc-min-gap", 1.6, minimum=1.0, exclusive_minimum=True,
        help="FL+HC gap cut: smallest jump between merge heights that separates clusters",
    ),
    ConfigKey(
        "flhc-distance-ratio", 2.5, minimum=0.0, exclusive_minimum=True,
        help="FL+HC relative cut: this x the median distance to the nearest other update",
    ),
    ConfigKey(
        "flhc-distance-threshold", 0.9, minimum=0.0, exclusive_minimum=True,
        help="FL+HC absolute cut (the paper's form; suits the digits MLP only)",
    ),
    ConfigKey("wecfl-n-init", 10, minimum=1, help="WeCFL: k-means++ starts of the first k-means"),
    # FedEM (num-clusters is its M).
    ConfigKey(
        "fedem-init", "local-kmeans", choices=FEDEM_INITS,
        help="FedEM components: k-means of a warm-start round, or the paper's random draws",
    ),
    ConfigKey("fedem-init-steps", 100, minimum=1,
              help="FedEM local-kmeans start: local SGD steps of the warm-start round"),
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

KEYS_BY_NAME: dict[str, ConfigKey] = {key.name: key for key in KEYS}


def parse_run_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a run config and fill in defaults.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        Flower's ``context.run_config`` (possibly empty) merged with any overrides.

    Returns
    -------
    dict[str, Any]
        Every key of :data:`KEYS`, typed and validated.

    Raises
    ------
    ConfigurationError
        For an unknown key or a value outside what the key allows.
    """
    unknown = sorted(set(run_config) - set(KEYS_BY_NAME))
    if unknown:
        raise ConfigurationError(
            "unknown run-config key(s) " + ", ".join(map(_unknown_key, unknown))
            + "; every key is listed in docs/config.md"
        )
    settings = {key.name: key.default for key in KEYS}
    for name, value in run_config.items():
        settings[name] = KEYS_BY_NAME[name].validate(value)
    if settings["num-groups"] == 0:
        settings["num-groups"] = settings["num-clusters"]
    return settings


def _unknown_key(name: str) -> str:
    """``'name'``, with the closest known key as a suggestion when one is close."""
    close = difflib.get_close_matches(name, KEYS_BY_NAME, n=1)
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
