"""Every registered strategy through the same checks, with no test code of its own.

In the spirit of scikit-learn's ``parametrize_with_checks``: the checks are
parametrised over the strategy registry, so a strategy file added under
fl_clusters/strategies/ is collected and checked as it is. Each strategy builds
from its declarations and from ``preset='paper'``, repeats a run from the same
seed, resumes from a checkpoint exactly where the uninterrupted run goes, runs
through a node that leaves, one that joins late and malformed replies, writes
its summary fields, and has its rows in the docs. The federations are the tiny
in-process job of tests/loopback_runs.py (no Ray).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fl_clusters.checkpoint import CHECKPOINT_FILE
from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.strategies.kit import REQUIRED, ClusteredStrategy
from fl_clusters.strategies.kit.presets import departs
from fl_clusters.strategies.kit.registry import strategy_classes
from fl_clusters.strategy_builder import build_strategy
from tests.loopback_runs import NUM_CLIENTS, ChurnGrid, in_process_server, loopback_run

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = sorted(strategy_classes())
# What two runs of one job must agree on.
COMPARED = ("ari", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "num_clusters_found", "assignment_history", "cluster_accuracy_history")
# summary.json entries every run has, whatever its strategy.
COMMON_FIELDS = ("strategy", "num_clients", "num_cluster_models", "num_clusters_found", "ari",
                 "personalized_accuracy", "per_client_accuracy", "assignment_history",
                 "preset", "preset_changes", "rejected_replies", "lost_nodes", "late_nodes")
RESULT_FILES = ("summary.json", "rounds.jsonl", "models.npz", "assignments.csv")
Runs = Callable[[str, str], dict[str, Any]]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_strategies",
                                                  ROOT / "docs" / "generate_strategies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """``runs(strategy, kind)``: the summary of one of its federations, each run once.

    ``whole`` and ``again``: the same job twice; ``stopped``: its first 2 rounds,
    checkpointed; ``resumed``: the rest from that checkpoint; ``churn``: on
    :class:`~tests.loopback_runs.ChurnGrid`.
    """
    done: dict[tuple[str, str], dict[str, Any]] = {}

    def run(name: str, kind: str) -> dict[str, Any]:
        if (name, kind) not in done:
            results = tmp_path_factory.mktemp(f"{name}-{kind}")
            job: dict[str, Any] = {"strategy": name}
            grid = ChurnGrid if kind == "churn" else None
            if kind == "stopped":
                job |= {"num-rounds": 2, "checkpoint-every": 2}
            elif kind == "resumed":
                job["resume-from"] = str(run(name, "stopped")["_folder"])
            elif kind == "churn":
                # The late node is not there at the start.
                job["min-nodes"] = NUM_CLIENTS - 1
            done[name, kind] = (loopback_run(job, results) if grid is None
                                else loopback_run(job, results, grid))
        return done[name, kind]

    with in_process_server():
        yield run


def _settings(name: str, **overrides: Any) -> dict[str, Any]:
    return {**parse_run_config({"strategy": name, **overrides}), "min-available-nodes": 2}


@pytest.mark.parametrize("name", STRATEGIES)
def test_builds_from_its_declarations(name: str) -> None:
    cls = ClusteredStrategy.registry[name]
    settings = _settings(name)
    built = build_strategy(settings)
    assert type(built) is cls
    keys = config_keys()
    for param in cls.declared_params():
        if param.run_config:
            assert param.key in keys, f"{name}: {param.name} has no run-config key"
            expected = param.argument(settings[param.key])
        else:
            expected = param.default
        if expected is not REQUIRED:
            assert getattr(built, param.name) == expected, param.name
        # A value the declaration refuses is refused naming the run-config key.
        bad = {"str": "not-a-choice", "bool": 2, "int": 1.5, "float": "x"}[param.kind]
        if param.run_config and param.key.startswith(f"{name}-"):
            with pytest.raises(ValueError, match=param.key):
                parse_run_config({"strategy": name, param.key: bad})
    # Its docstring documents its arguments with the declared defaults.
    assert f"## {cls.__name__} (`{name}`)" in _generator().section(cls, name, cls.paper)


@pytest.mark.parametrize("name", STRATEGIES)
def test_builds_with_the_paper_preset(name: str) -> None:
    cls = ClusteredStrategy.registry[name]
    built = build_strategy(_settings(name, preset="paper"))
    changes = {param.name: param.paper for param in cls.declared_params() if departs(param)}
    assert built.preset == "paper"
    assert built.preset_changes == changes
    for argument, value in changes.items():
        assert getattr(built, argument) == value, argument


def _same_outcome(first: dict[str, Any], second: dict[str, Any]) -> None:
    for field in COMPARED:
        assert first.get(field) == second.get(field), field
    models = [np.load(run["_folder"] / "models.npz") for run in (first, second)]
    assert sorted(models[0].files) == sorted(models[1].files)
    for key in models[0].files:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)


@pytest.mark.parametrize("name", STRATEGIES)
def test_same_seed_same_result(runs: Runs, name: str) -> None:
    _same_outcome(runs(name, "whole"), runs(name, "again"))


@pytest.mark.parametrize("name", STRATEGIES)
def test_resume_equals_uninterrupted(runs: Runs, name: str) -> None:
    assert (runs(name, "stopped")["_folder"] / CHECKPOINT_FILE).is_file()
    resumed, whole = runs(name, "resumed"), runs(name, "whole")
    assert resumed["resumed_after_round"] == 2
    _same_outcome(resumed, whole)
    rounds = [[{k: line[k] for k in ("round", "train", "evaluate")} for line in map(
        json.loads, (run["_folder"] / "rounds.jsonl").read_text().splitlines())]
        for run in (resumed, whole)]
    assert rounds[0] == rounds[1]


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_lost_node_and_a_late_joiner(runs: Runs, name: str) -> None:
    summary = runs(name, "churn")
    assert summary["lost_nodes"] == [ChurnGrid.LOST]
    assert summary["late_nodes"] == [ChurnGrid.LATE]
    # Scored at the end: the nodes connected then, the late one among them.
    assert summary["num_clients"] == NUM_CLIENTS - 1
    assert len(summary["per_client_accuracy"]) == NUM_CLIENTS - 1
    assert all(0.0 <= accuracy <= 1.0 for accuracy in summary["per_client_accuracy"])
    with (summary["_folder"] / "assignments.csv").open() as handle:
        clusters = {int(row["node_id"]): int(row["assigned_cluster"])
                    for row in csv.DictReader(handle)}
    assert ChurnGrid.LOST not in clusters
    assert 0 <= clusters[ChurnGrid.LATE] < summary["num_cluster_models"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_malformed_replies_are_rejected_and_counted(runs: Runs, name: str) -> None:
    assert runs(name, "whole")["rejected_replies"] == 0
    summary = runs(name, "churn")
    # Two corrupted train replies (a NaN model, no example count) from round 2 on,
    # and the lost node's error replies: each counted, none aggregated.
    assert summary["rejected_replies"] >= 2
    assert math.isfinite(summary["personalized_accuracy"])
    models = np.load(summary["_folder"] / "models.npz")
    assert all(np.isfinite(models[key]).all() for key in models.files)


@pytest.mark.parametrize("name", STRATEGIES)
def test_summary_and_results_fields(runs: Runs, name: str) -> None:
    summary = runs(name, "whole")
    assert summary["strategy"] == name
    assert [field for field in COMMON_FIELDS if field not in summary] == []
    own = build_strategy(_settings(name)).summary_fields()
    assert [field for field in own if field not in summary] == []
    assert [file for file in RESULT_FILES if not (summary["_folder"] / file).is_file()] == []
    assert len(summary["per_client_accuracy"]) == NUM_CLIENTS


@pytest.mark.parametrize("name", STRATEGIES)
def test_docs_rows_present(name: str) -> None:
    cls = ClusteredStrategy.registry[name]
    generator = _generator()
    for page in generator.STRATEGY_TABLES:
        rows = generator.block(page.read_text(), generator.STRATEGIES_BLOCK)
        assert f"`{name}`" in rows or f"`{cls.__name__}(" in rows, page.name
    assert f"## {cls.__name__} (`{name}`)" in (ROOT / "docs" / "strategies.md").read_text()
    assert f"## {cls.__name__} (`{name}`," in (ROOT / "docs" / "paper-fidelity.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for param in cls.declared_params():
        if param.run_config:
            assert f"\n{param.key} = " in pyproject, param.key
