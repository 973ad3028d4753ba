"""The conformance checks: what every strategy must do, whoever wrote it.

Each check takes a strategy class and the tiny federations it reads
(:class:`FederationRuns`, each run made once per strategy and shared between
the checks). A strategy builds from its declarations and from
``preset='paper'``, repeats a run from the same seed, resumes from a checkpoint
exactly where the uninterrupted run goes, runs through a node that leaves, one
that joins late and malformed replies, and writes the summary fields and result
files. The federations are :func:`~fl_clusters.testing.federations.loopback_run`'s
tiny in-process job (no Ray, no SuperLink).
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_clusters.checkpoint import CHECKPOINT_FILE
from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.strategies.kit import REQUIRED, ClusteredStrategy
from fl_clusters.strategies.kit.options.inner import InnerAggregationOption
from fl_clusters.strategies.kit.presets import departs
from fl_clusters.strategy_builder import build_strategy
from fl_clusters.testing.federations import (
    NUM_CLIENTS,
    ChurnGrid,
    in_process_server,
    loopback_run,
)

Strategy = type[ClusteredStrategy]
# What two runs of one job must agree on.
COMPARED = ("ari", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "num_clusters_found", "assignment_history", "cluster_accuracy_history")
# summary.json entries every run has, whatever its strategy.
COMMON_FIELDS = ("strategy", "num_clients", "num_cluster_models", "num_clusters_found", "ari",
                 "personalized_accuracy", "per_client_accuracy", "assignment_history",
                 "preset", "preset_changes", "rejected_replies", "lost_nodes", "late_nodes")
RESULT_FILES = ("summary.json", "rounds.jsonl", "models.npz", "assignments.csv")
# The inner aggregation the checks run: Flower's FedAdam keeps moments per cluster,
# so a resume that lost them would not end where the uninterrupted run ends.
INNER_JOB = {"inner-aggregation": "fedadam", "inner-options": "eta=0.05"}
# A value of each kind that no declaration of that kind accepts.
REFUSED_VALUE = {"str": "not-a-choice", "bool": 2, "int": 1.5, "float": "x"}


class FederationRuns:
    """The tiny federations the checks read: each made once per strategy, then kept.

    ``runs(strategy, kind)`` is the summary.json of one run (with ``_folder``, its
    results folder): ``whole`` and ``again``, the same job twice; ``stopped``, its
    first 2 rounds, checkpointed; ``resumed``, the rest from that checkpoint;
    ``churn``, on :class:`~fl_clusters.testing.federations.ChurnGrid`; ``inner...``,
    the first four with :data:`INNER_JOB`'s stateful inner aggregation. The runs
    write under one temporary folder, removed when this object is.
    """

    KINDS = ("whole", "again", "stopped", "resumed", "churn",
             "inner", "inner-again", "inner-stopped", "inner-resumed")

    def __init__(self) -> None:
        self._done: dict[tuple[Strategy, str], dict[str, Any]] = {}
        self._folder: Path | None = None

    def __call__(self, strategy: Strategy, kind: str) -> dict[str, Any]:
        """The summary of ``strategy``'s run ``kind``, run now if not run before."""
        if kind not in self.KINDS:
            raise ValueError(f"no federation {kind!r}; the runs are {', '.join(self.KINDS)}")
        if (strategy, kind) not in self._done:
            self._done[strategy, kind] = self._run(strategy, kind)
        return self._done[strategy, kind]

    def _run(self, strategy: Strategy, kind: str) -> dict[str, Any]:
        """Run ``strategy``'s federation ``kind`` inside :func:`in_process_server`."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fl-clusters-checks-"))
            weakref.finalize(self, shutil.rmtree, self._folder, True)
        results = self._folder / f"{len(self._done)}-{strategy.name}-{kind}"
        job: dict[str, Any] = {"strategy": strategy.name}
        prefix = "inner-" if kind.startswith("inner") else ""
        if prefix:
            job |= INNER_JOB
        if kind == f"{prefix}stopped":
            job |= {"num-rounds": 2, "checkpoint-every": 2}
        elif kind == f"{prefix}resumed":
            job["resume-from"] = str(self(strategy, f"{prefix}stopped")["_folder"])
        elif kind == "churn":
            job["min-nodes"] = NUM_CLIENTS - 1  # the late node is not there at the start
        with in_process_server():
            if kind == "churn":
                return loopback_run(job, results, ChurnGrid)
            return loopback_run(job, results)


@dataclass(frozen=True)
class StrategyCheck:
    """One conformance check; ``check(strategy)`` runs it, raising AssertionError if failed.

    Attributes
    ----------
    name : str
        Its name, as test ids show it (``same_seed_same_result``).
    function : Callable[[Strategy, FederationRuns], None]
        The check itself.
    runs : FederationRuns
        The federations it reads, shared with the other checks made with it.
    """

    name: str
    function: Callable[[Strategy, FederationRuns], None]
    runs: FederationRuns

    def __call__(self, strategy: Strategy) -> None:
        """Run the check on ``strategy`` (a registered strategy class)."""
        self.function(strategy, self.runs)

    def __repr__(self) -> str:
        return f"StrategyCheck({self.name!r})"


def _settings(strategy: Strategy, **overrides: Any) -> dict[str, Any]:
    """The run config of ``strategy`` with ``overrides``, every other key at its default."""
    return parse_run_config({"strategy": strategy.name, **overrides})


def _refused(strategy: Strategy, key: str, value: Any) -> None:
    """Assert that ``key = value`` in a run config is refused with a message naming ``key``."""
    try:
        parse_run_config({"strategy": strategy.name, key: value})
    except ValueError as error:
        assert key in str(error), f"the refusal of {key}={value!r} does not name {key}: {error}"
    else:
        raise AssertionError(f"run-config key {key!r} accepted {value!r}, which its "
                             "declaration does not allow")


def check_builds_from_its_declarations(strategy: Strategy, runs: FederationRuns) -> None:
    """``strategy='name'`` builds the class with every declared default; a value its own
    key's declaration refuses is refused naming the key."""
    settings = _settings(strategy)
    built = build_strategy(settings)
    assert type(built) is strategy, (
        f"strategy={strategy.name!r} builds {type(built).__name__}, not {strategy.__name__}")
    keys = config_keys()
    for param in strategy.declared_params():
        if param.run_config:
            assert param.key in keys, f"argument {param.name} has no run-config key"
            expected = param.argument(settings[param.key])
        else:
            expected = param.default
        if expected is not REQUIRED:
            assert getattr(built, param.name) == expected, (
                f"argument {param.name} is {getattr(built, param.name)!r} when built from the "
                f"run config, not its declared default {expected!r}")
        if param.run_config and param.key.startswith(f"{strategy.name}-"):
            _refused(strategy, param.key, REFUSED_VALUE[param.kind])


def check_builds_with_the_paper_preset(strategy: Strategy, runs: FederationRuns) -> None:
    """``preset='paper'`` builds it with every declared paper value, and says which."""
    built = build_strategy(_settings(strategy, preset="paper"))
    changes = {param.name: param.paper for param in strategy.declared_params()
               if departs(param)}
    assert built.preset == "paper", built.preset
    assert built.preset_changes == changes, (built.preset_changes, changes)
    for argument, value in changes.items():
        assert getattr(built, argument) == value, (
            f"argument {argument} is {getattr(built, argument)!r} under preset='paper', not "
            f"its declared paper value {value!r}")


def _same_outcome(first: dict[str, Any], second: dict[str, Any]) -> None:
    """Assert two runs' summaries and final models agree."""
    for field in COMPARED:
        assert first.get(field) == second.get(field), (
            f"{field}: {first.get(field)!r} != {second.get(field)!r}")
    models = [np.load(run["_folder"] / "models.npz") for run in (first, second)]
    assert sorted(models[0].files) == sorted(models[1].files), "the runs saved other models"
    for key in models[0].files:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)


def check_same_seed_same_result(strategy: Strategy, runs: FederationRuns) -> None:
    """Two runs of one job from the same seed give the same summary and models."""
    _same_outcome(runs(strategy, "whole"), runs(strategy, "again"))


def check_resume_equals_uninterrupted(strategy: Strategy, runs: FederationRuns) -> None:
    """A run resumed from round 2's checkpoint ends where the uninterrupted run ends."""
    assert (runs(strategy, "stopped")["_folder"] / CHECKPOINT_FILE).is_file(), (
        f"a run with checkpoint-every=2 wrote no {CHECKPOINT_FILE}")
    resumed, whole = runs(strategy, "resumed"), runs(strategy, "whole")
    assert resumed["resumed_after_round"] == 2, resumed["resumed_after_round"]
    _same_outcome(resumed, whole)
    rounds = [[{k: line[k] for k in ("round", "train", "evaluate")} for line in map(
        json.loads, (run["_folder"] / "rounds.jsonl").read_text().splitlines())]
        for run in (resumed, whole)]
    assert rounds[0] == rounds[1], "rounds.jsonl differs between the resumed and whole runs"


def check_a_lost_node_and_a_late_joiner(strategy: Strategy, runs: FederationRuns) -> None:
    """A node that leaves is dropped; one that joins late is trained, placed and scored."""
    summary = runs(strategy, "churn")
    assert summary["lost_nodes"] == [ChurnGrid.LOST], summary["lost_nodes"]
    assert summary["late_nodes"] == [ChurnGrid.LATE], summary["late_nodes"]
    # Scored at the end: the nodes connected then, the late one among them.
    assert summary["num_clients"] == NUM_CLIENTS - 1, summary["num_clients"]
    accuracy = summary["per_client_accuracy"]
    assert len(accuracy) == NUM_CLIENTS - 1, accuracy
    assert all(0.0 <= value <= 1.0 for value in accuracy), accuracy
    with (summary["_folder"] / "assignments.csv").open() as handle:
        clusters = {int(row["node_id"]): int(row["assigned_cluster"])
                    for row in csv.DictReader(handle)}
    assert ChurnGrid.LOST not in clusters, "the lost node is still in assignments.csv"
    assert 0 <= clusters[ChurnGrid.LATE] < summary["num_cluster_models"], (
        f"the late node's cluster is {clusters[ChurnGrid.LATE]}")


def check_malformed_replies_are_rejected_and_counted(
    strategy: Strategy, runs: FederationRuns
) -> None:
    """A NaN model, a reply without its example count and error replies are each counted
    and none is aggregated."""
    assert runs(strategy, "whole")["rejected_replies"] == 0, "a clean run rejected replies"
    summary = runs(strategy, "churn")
    # Two corrupted train replies from round 2 on, and the lost node's error replies.
    assert summary["rejected_replies"] >= ChurnGrid.CORRUPTED, summary["rejected_replies"]
    assert math.isfinite(summary["personalized_accuracy"]), summary["personalized_accuracy"]
    models = np.load(summary["_folder"] / "models.npz")
    assert all(np.isfinite(models[key]).all() for key in models.files), (
        "a corrupted reply reached a saved model")


def check_summary_and_results_fields(strategy: Strategy, runs: FederationRuns) -> None:
    """summary.json has every common field and the strategy's own; every result file is
    written."""
    summary = runs(strategy, "whole")
    assert summary["strategy"] == strategy.name, summary["strategy"]
    missing = [field for field in COMMON_FIELDS if field not in summary]
    assert missing == [], f"summary.json lacks {missing}"
    own = build_strategy(_settings(strategy)).summary_fields()
    missing = [field for field in own if field not in summary]
    assert missing == [], f"summary.json lacks the strategy's summary_fields {missing}"
    missing = [file for file in RESULT_FILES if not (summary["_folder"] / file).is_file()]
    assert missing == [], f"the results folder lacks {missing}"
    assert len(summary["per_client_accuracy"]) == NUM_CLIENTS, summary["per_client_accuracy"]


def check_inner_aggregation(strategy: Strategy, runs: FederationRuns) -> None:
    """With a stateful Flower strategy inside each cluster (FedAdam) a run repeats from
    its seed, resumes where the uninterrupted run ends, and differs from the mean's; a
    strategy without the option refuses the keys, naming them."""
    if not issubclass(strategy, InnerAggregationOption):
        try:
            build_strategy(_settings(strategy, **{"inner-aggregation": "fedmedian"}))
        except ValueError as error:
            assert "inner-aggregation" in str(error), error
            return
        raise AssertionError(f"{strategy.__name__} has no inner aggregation but accepted "
                             "inner-aggregation='fedmedian'")
    whole = runs(strategy, "inner")
    assert whole["inner_aggregation"].startswith("FedAdam("), whole["inner_aggregation"]
    _same_outcome(whole, runs(strategy, "inner-again"))
    _same_outcome(runs(strategy, "inner-resumed"), whole)
    models = [np.load(run["_folder"] / "models.npz") for run in (whole, runs(strategy, "whole"))]
    assert any(not np.array_equal(models[0][key], models[1][key]) for key in models[0].files
               if key in models[1].files), "FedAdam inside the clusters left the models unchanged"


CHECKS: dict[str, Callable[[Strategy, FederationRuns], None]] = {
    "builds_from_its_declarations": check_builds_from_its_declarations,
    "builds_with_the_paper_preset": check_builds_with_the_paper_preset,
    "same_seed_same_result": check_same_seed_same_result,
    "resume_equals_uninterrupted": check_resume_equals_uninterrupted,
    "a_lost_node_and_a_late_joiner": check_a_lost_node_and_a_late_joiner,
    "malformed_replies_are_rejected_and_counted":
        check_malformed_replies_are_rejected_and_counted,
    "summary_and_results_fields": check_summary_and_results_fields,
    "inner_aggregation": check_inner_aggregation,
}
