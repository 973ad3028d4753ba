"""``preset``: the paper's algorithm on one switch, the robust defaults beside it."""

from __future__ import annotations

import ast
import logging
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_clusters.params import NOT_GIVEN, REQUIRED, Param, ParamError
from fl_clusters.strategies import CFL, FLHC, IFCA, ClusteredStrategy, FedEM, FedSoft
from fl_clusters.strategies.kit.behaviours import Behaviour
from fl_clusters.strategies.kit.paper_digests import (
    forgotten_revisions,
    paper_digests,
    read_paper_digests,
    record_paper_digests,
    revision_problem,
)
from fl_clusters.strategies.kit.presets import departs
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import Federation

# What every strategy records of its preset: not a difference of the algorithm.
PRESET_RECORDS = {"preset", "preset_changes", "preset_kept", "preset_rules"}


def departures(cls: type[ClusteredStrategy]) -> dict[str, Param]:
    return {param.name: param for param in cls.declared_params() if departs(param)}


def test_every_departure_from_the_paper_is_declared_with_its_reason() -> None:
    found = {name: sorted(departures(cls)) for name, cls in ClusteredStrategy.registry.items()}
    # The departures the robust defaults make; a new one must be declared (and so
    # appear in docs/paper-fidelity.md), never slipped in as a plain default.
    assert found["ifca"] == ["aggregation", "init", "reseed_after", "restarts"]
    assert found["cfl"] == ["eps2", "gate", "min_silhouette"]
    assert found["acfl"] == ["gate", "incentive_threshold", "trial_epochs"]
    assert found["flhc"] == ["threshold"]
    assert found["fedem"] == ["init"]
    assert found["fedsoft"] == ["clients_per_cluster", "init"]
    for cls in ClusteredStrategy.registry.values():
        for param in departures(cls).values():
            assert param.why and param.source and param.paper != param.default
            param.check(param.paper)


def test_a_departure_without_a_reason_or_source_cannot_be_declared() -> None:
    with pytest.raises(ValueError, match="reason and its source"):
        Param("init", "local-kmeans", "str", "start", choices=("local-kmeans", "random"),
              paper="random", why="a reason")
    with pytest.raises(ValueError, match="reason and its source"):
        Param("steps", 5, "int", "steps", paper=NOT_GIVEN, source="section 2")
    with pytest.raises(ValueError, match="needs its why, source"):
        Behaviour("rule", "the paper's rule", "ours", "", "")


def test_a_departure_without_a_reason_cannot_be_declared() -> None:
    with pytest.raises(ValueError, match="needs its reason"):
        Param("init", "local-kmeans", "str", "start", choices=("local-kmeans", "random"),
              paper="random")
    with pytest.raises(ParamError):
        Param("init", "local-kmeans", "str", "start", choices=("local-kmeans", "random"),
              paper="kmeans++", why="a reason", source="a section")


@pytest.mark.parametrize("cls", [IFCA, CFL, FLHC, FedEM, FedSoft])
def test_paper_preset_takes_the_papers_values_and_robust_keeps_the_defaults(
    cls: type[ClusteredStrategy],
) -> None:
    robust, paper = cls(), cls(preset="paper")
    assert robust.preset == "robust" and robust.preset_changes == {}
    for name, param in departures(cls).items():
        assert getattr(robust, name) == param.default
        assert getattr(paper, name) == param.paper
    assert paper.preset_changes == {name: param.paper for name, param in departures(cls).items()}


def test_an_argument_set_apart_from_its_default_wins_over_the_preset() -> None:
    strategy = IFCA(preset="paper", reseed_after=5, init_steps=7)
    assert strategy.reseed_after == 5 and strategy.init == "random"
    assert "reseed_after" not in strategy.preset_changes


def test_an_argument_the_caller_names_is_kept_even_at_its_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="flwr"):
        strategy = IFCA(preset="paper", init="local-kmeans")
    assert strategy.init == "local-kmeans"
    assert strategy.preset_changes == {"aggregation": "paper", "restarts": 10,
                                       "reseed_after": 0}
    assert strategy.preset_fields()["preset_kept"] == {
        "init": {"value": "local-kmeans", "paper": "random"}}
    assert "init='local-kmeans', the paper's 'random'" in caplog.text
    # A value the caller gives that is the paper's own is no departure to record.
    assert IFCA(preset="paper", init="random").preset_kept == {}
    # Positional arguments are named too; under the robust preset nothing is kept.
    assert IFCA(num_clusters=2, preset="paper").user_arguments == {"num_clusters", "preset"}
    assert IFCA(init="local-kmeans").preset_kept == {}


def test_a_run_config_value_apart_from_the_keys_default_is_the_users() -> None:
    from fl_clusters.config import parse_run_config

    # pyproject.toml gives every key its default, so a key at its default is not
    # the user's: the preset sets it; a value that differs is kept.
    strategy = build_strategy(parse_run_config(
        {"strategy": "ifca", "preset": "paper", "ifca-init": "local-kmeans",
         "ifca-reseed-after": 5, "num-clusters": 2}))
    assert (strategy.init, strategy.reseed_after, strategy.num_clusters) == ("random", 5, 2)
    assert strategy.preset_changes == {"aggregation": "paper", "init": "random",
                                       "restarts": 10}
    assert strategy.preset_kept == {"reseed_after": {"value": 5, "paper": 0}}
    assert strategy.user_arguments == {"preset", "reseed_after", "num_clusters"}


def test_the_run_config_builds_the_paper_preset_and_refuses_an_unknown_one() -> None:
    from fl_clusters.config import parse_run_config

    strategy = build_strategy(parse_run_config({"strategy": "flhc", "preset": "paper"}))
    assert strategy.threshold == strategy.hierarchy.threshold == "absolute"
    with pytest.raises(ValueError, match="preset"):
        parse_run_config({"strategy": "flhc", "preset": "published"})


def test_a_paper_run_records_its_preset_in_the_summary(federation: Federation) -> None:
    summary = federation({"strategy": "flhc", "preset": "paper", "num-rounds": 3,
                          "flhc-warmup-rounds": 1, "local-steps": 5}, num_clients=8)
    assert summary["preset"] == "paper"
    assert summary["preset_changes"] == {"threshold": "absolute"}
    assert summary["preset_kept"] == {}
    assert summary["preset_rules"] == ["awcfl_example_weights", "mcfl_all_test_inputs"]


def _differences(first: Any, second: Any, path: str) -> set[str]:
    """The paths (``hierarchy.threshold``) at which two values built alike differ."""
    if type(first) is not type(second):
        return {path}
    if isinstance(first, np.ndarray):
        same = first.shape == second.shape and bool(np.array_equal(first, second))
        return set() if same else {path}
    if isinstance(first, np.random.Generator):
        return set() if first.bit_generator.state == second.bit_generator.state else {path}
    if isinstance(first, dict):
        if first.keys() != second.keys():
            return {path}
        return set().union(*(_differences(first[key], second[key], f"{path}.{key}")
                             for key in first))
    if isinstance(first, list | tuple):
        if len(first) != len(second):
            return {path}
        return set().union(*(_differences(a, b, f"{path}.{i}")
                             for i, (a, b) in enumerate(zip(first, second, strict=True))))
    if hasattr(first, "__dict__") and not isinstance(first, type):
        return _differences(vars(first), vars(second), path)
    return set() if first == second else {path}


def preset_differences(cls: type[ClusteredStrategy]) -> set[str]:
    """Where ``cls`` built under the two presets differs: attribute paths.

    Both are built with every required argument (an int, 2) and ``preset`` named,
    so that only the preset tells them apart.
    """
    required = {param.name: 2 for param in cls.declared_params() if param.default is REQUIRED}
    robust, paper = cls(preset="robust", **required), cls(preset="paper", **required)
    return {path.lstrip(".") for path in _differences(vars(robust), vars(paper), "")
            if path.lstrip(".").split(".")[0] not in PRESET_RECORDS}


def declared_differences(cls: type[ClusteredStrategy]) -> set[str]:
    """The attributes its declarations let the presets set apart: parameters and rules."""
    return set(departures(cls)) | {
        rule.name for rule in cls.declared_behaviours() if rule.switched}


def undeclared(cls: type[ClusteredStrategy]) -> set[str]:
    """The differences no declaration names: a path none of whose attributes is declared.

    A value built from a declared one (FL+HC's ``hierarchy.threshold``) is covered
    by its name.
    """
    declared = declared_differences(cls)
    return {path for path in preset_differences(cls) if not set(path.split(".")) & declared}


@pytest.mark.parametrize("name", sorted(ClusteredStrategy.registry))
def test_the_presets_differ_only_where_a_parameter_or_rule_is_declared(name: str) -> None:
    cls = ClusteredStrategy.registry[name]
    assert undeclared(cls) == set(), (
        f"{cls.__name__}'s presets differ in {sorted(undeclared(cls))}, which no "
        "Param(paper=...) or Behaviour declares (docs/paper-fidelity.md would not show it)")
    # And every declaration tells the presets apart: none is left over from old code.
    assert declared_differences(cls) - preset_differences(cls) == set()


class _PlantedRule(IFCA):
    """IFCA with a rule only its paper preset runs, and no declaration of it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.extra_restart_rule = self.preset == "paper"


class _PlantedSeed(IFCA):
    """IFCA whose paper preset draws from another seed: a difference inside an object."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.preset == "paper":
            self.rng = np.random.default_rng(self.seed + 1)


def test_an_undeclared_difference_between_the_presets_is_found() -> None:
    assert undeclared(_PlantedRule) == {"extra_restart_rule"}
    # Inside an object too: the generator's state.
    assert undeclared(_PlantedSeed) == {"rng"}


def test_a_declared_rule_is_no_undeclared_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    rule = Behaviour("extra_restart_rule", "the paper's rule", "the library's rule",
                     "a reason", "a section")
    monkeypatch.setattr(_PlantedRule, "behaviours", (rule,), raising=False)
    assert undeclared(_PlantedRule) == set()
    assert "extra_restart_rule" in preset_differences(_PlantedRule)


# The only code that reads the preset, and why: the objects compared above are then
# the whole difference between the modes, because no code path branches on the
# preset itself (a branch anywhere else is an undeclared difference).
PRESET_READERS = {
    ("fl_clusters/strategies/kit/presets.py", "init_params"): "turns it into paper values",
    ("fl_clusters/config.py", "apply_paper_recipe"): "applies the declared recipes",
    ("fl_clusters/strategies/kit/behaviours.py", "behaviour_switches"): "into rule switches",
    ("fl_clusters/strategies/kit/shared_params.py", "<module>"): "declares the Param",
    ("fl_clusters/strategies/kit/base.py", "preset_fields"): "records it in the summary",
    ("fl_clusters/strategies/kit/base.py", "summary"): "logs it",
    ("fl_clusters/sweep/cells.py", "revision_settings"): "keys a run's revision",
    ("fl_clusters/sweep/cells.py", "keys_the_paper_sets"): "which defaults a paper run ignored",
    ("fl_clusters/sweep/twins.py", "<module>"): "names the key a twin cell differs in",
    ("fl_clusters/testing/checks.py", "check_builds_with_the_paper_preset"): "checks it builds",
    ("fl_clusters/testing/checks.py", "<module>"): "names the summary field every run has",
}
PACKAGE = Path(__file__).resolve().parent.parent / "fl_clusters"


def preset_reads(source: str, path: str) -> set[tuple[str, str]]:
    """Each (file, function) of ``source`` that reads a preset: ``x.preset``, a name
    ``preset`` or the string ``"preset"`` (a run-config or keyword lookup)."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else function
            loads = isinstance(getattr(child, "ctx", None), ast.Load)
            if ((isinstance(child, ast.Attribute) and child.attr == "preset" and loads)
                    or (isinstance(child, ast.Name) and child.id == "preset" and loads)
                    or (isinstance(child, ast.Constant) and child.value == "preset")):
                found.add((path, function))
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_no_code_path_branches_on_the_preset_outside_its_declarations() -> None:
    reads = set().union(*(
        preset_reads(path.read_text(), str(path.relative_to(PACKAGE.parent)))
        for path in sorted(PACKAGE.rglob("*.py"))))
    assert reads - set(PRESET_READERS) == set(), (
        "these functions read the preset: a code path the two modes take apart with no "
        "Param or Behaviour declaring it; declare the difference instead")
    assert set(PRESET_READERS) - reads == set(), "a listed reader no longer reads it"


def test_a_planted_branch_on_the_preset_is_found() -> None:
    planted = textwrap.dedent("""
        class Planted(IFCA):
            def aggregate_train(self, server_round, replies):
                if self.preset == "paper":
                    return None
                return super().aggregate_train(server_round, replies)
    """)
    assert preset_reads(planted, "planted.py") == {("planted.py", "aggregate_train")}


RECORD = Path(__file__).resolve().parent.parent / "docs" / "paper-digests.json"
# The digests recorded when the record was made: a record the generator rewrote
# must keep them until a class raises its revision.
FIRST_RECORDED = {
    "ACFL": (2, "3215aa7feea8"), "AWCFLOption": (2, "55cd70db821b"),
    "CFL": (2, "6efde5a95179"), "FLDC": (3, "3c1e803095c9"), "FLHC": (1, "25f86a6e2248"),
    "FedEM": (1, "5be69a31061e"), "FedSoft": (2, "ea3098fb73e0"),
    "IFCA": (2, "d86856d1958b"), "MCFLOption": (2, "61198e162e77"),
    "WeCFL": (1, "1839e154de65"),
}


def registered_digests() -> dict[str, tuple[int, str]]:
    """The digests of every registered strategy's declaring classes, as they are now."""
    return paper_digests(ClusteredStrategy.registry.values())


def test_a_change_to_what_the_paper_preset_computes_raises_its_revision() -> None:
    digests, recorded = registered_digests(), read_paper_digests(RECORD)
    forgotten = forgotten_revisions(recorded, digests)
    assert not forgotten, revision_problem(recorded, digests)
    # A class that raised its revision is recorded anew by the generator.
    behind = sorted(name for name in recorded
                    if name in digests and digests[name][0] != recorded[name][0])
    assert not behind, (f"{behind} changed paper_revision since {RECORD.name} was written; "
                        "run: python docs/generate_strategies.py")


def test_the_record_keeps_each_class_at_its_revision() -> None:
    recorded = read_paper_digests(RECORD)
    for name, (revision, digest) in FIRST_RECORDED.items():
        assert recorded[name][0] >= revision, name
        if recorded[name][0] == revision:
            assert recorded[name][1] == digest, name


def test_a_paper_value_changed_at_the_same_revision_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    params = tuple(replace(param, paper=1.7) if param.name == "eps2" else param
                   for param in CFL.params)
    monkeypatch.setattr(CFL, "params", params)
    recorded = read_paper_digests(RECORD)
    assert forgotten_revisions(recorded, registered_digests()) == ["CFL"]
    assert "set `paper_revision = 3` in the class" in str(
        revision_problem(recorded, registered_digests()))
    monkeypatch.setattr(CFL, "paper_revision", CFL.paper_revision + 1)
    assert forgotten_revisions(recorded, registered_digests()) == []


class _NewPaperStrategy(IFCA):
    """A strategy the record does not know yet, with a paper value of its own."""

    params = (Param("restarts_per_round", 1, "int", "restarts", low=1, paper=3,
                    why="a reason", source="a section"),)

    def __init__(self, *, restarts_per_round: int = 1, **arguments: Any) -> None:
        super().__init__(restarts_per_round=restarts_per_round, **arguments)


def test_the_generator_records_a_new_class_and_refuses_a_change_at_its_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = tmp_path / "paper-digests.json"
    record.write_text(RECORD.read_text())
    # Not recorded yet: nothing to compare with, so nothing is forgotten; recorded.
    assert "_NewPaperStrategy" not in read_paper_digests(record)
    assert forgotten_revisions(read_paper_digests(record),
                               paper_digests([_NewPaperStrategy])) == []
    record_paper_digests(record, [_NewPaperStrategy])
    recorded = read_paper_digests(record)
    assert recorded["_NewPaperStrategy"][0] == 1 and recorded["IFCA"] == FIRST_RECORDED["IFCA"]
    # Its paper value changes and its revision does not: refused, the record unchanged.
    changed = (Param("restarts_per_round", 1, "int", "restarts", low=1, paper=5,
                     why="a reason", source="a section"),)
    monkeypatch.setattr(_NewPaperStrategy, "params", changed)
    before = record.read_text()
    with pytest.raises(ValueError, match=r"_NewPaperStrategy's paper declarations changed at "
                       r"paper_revision 1: set `paper_revision = 2`"):
        record_paper_digests(record, [_NewPaperStrategy])
    assert record.read_text() == before
    monkeypatch.setattr(_NewPaperStrategy, "paper_revision", 2, raising=False)
    assert record_paper_digests(record, [_NewPaperStrategy])["_NewPaperStrategy"][0] == 2
