"""The paper's training recipe: declared per strategy, applied by fl-clusters' ServerApp
under ``preset='paper'`` to the keys the user left at their defaults, never in a sweep."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict

from fl_clusters import server_app
from fl_clusters.client_app import build_client_app
from fl_clusters.config import (
    PAPER_RECIPE,
    config_keys,
    parse_run_config,
    resolve_run_config,
    strategy_keys,
)
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.strategies.kit.base import ClusteredStrategy
from fl_clusters.strategies.kit.recipes import FIXED_KEYS, RecipeValue, check_recipe
from fl_clusters.sweep import simulation
from fl_clusters.sweep.cells import RESERVED_RUN_CONFIG_KEYS
from fl_clusters.sweep.spec import load_sweep
from fl_clusters.testing import in_process_server

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = sorted((ROOT / "benchmarks" / "sweeps").glob("*.toml"))


def test_the_paper_preset_takes_the_papers_recipe_for_keys_left_at_their_defaults() -> None:
    settings, outcome = resolve_run_config({"strategy": "fldc", "preset": "paper"})
    # Wang and Li 2025 (seed 002), section 2.2.
    assert (settings["lr"], settings["local-epochs"], settings["local-steps"],
            settings["batch-size"], settings["num-rounds"]) == (0.01, 5, 0, 64, 50)
    assert outcome is not None and outcome.kept == {} and outcome.not_applied == {}
    assert set(outcome.applied) == {"lr", "local-epochs", "local-steps", "batch-size",
                                    "num-rounds"}
    assert "section 2.2" in outcome.applied["lr"]["source"]
    # The robust preset and the paper preset's constructor arguments are untouched.
    robust, none = resolve_run_config({"strategy": "fldc"})
    assert none is None and robust == parse_run_config({"strategy": "fldc"})
    assert settings["fldc-r"] == robust["fldc-r"]


def test_a_key_the_user_set_is_kept_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flwr"):
        settings, outcome = resolve_run_config(
            {"strategy": "acfl", "preset": "paper", "batch-size": 16, "num-rounds": 4})
    assert outcome is not None
    assert settings["batch-size"] == 16 and settings["local-epochs"] == 15
    assert outcome.kept == {"batch-size": {
        "value": 16, "paper": 128, "source": "Zhu et al. 2024 (seed 003), section 5.1: "
        "batch_size 128"}}
    # ACFL's paper gives no round count: the user's stands, recorded as nothing.
    assert settings["num-rounds"] == 4 and "num-rounds" not in outcome.applied
    assert "preset 'paper' keeps batch-size=16, the user's; the paper's 128" in caplog.text
    assert "preset 'paper' sets local-epochs=15 (Zhu et al. 2024 (seed 003)" in caplog.text
    assert outcome.fields()["paper_recipe"]["kept"]["batch-size"]["value"] == 16


def test_what_the_learner_cannot_run_is_recorded_and_changes_nothing() -> None:
    settings, outcome = resolve_run_config({"strategy": "fedsoft", "preset": "paper"})
    assert outcome is not None
    # Adam's lr is not plain SGD's: the library's lr stays.
    assert settings["lr"] == config_keys()["lr"].config_default
    assert set(outcome.not_applied) == {"optimizer", "lr"}
    assert outcome.not_applied["optimizer"]["paper"] == "Adam"
    assert (settings["local-epochs"], settings["batch-size"], settings["num-rounds"]) == (
        10, 10, 200)


def test_paper_recipe_false_keeps_the_apps_recipe() -> None:
    run_config = {"strategy": "ifca", "preset": "paper", PAPER_RECIPE: False}
    settings, outcome = resolve_run_config(run_config)
    assert outcome is None and settings == parse_run_config(run_config)


def test_an_options_paper_comes_before_the_strategys_own_recipe() -> None:
    plain, _ = resolve_run_config({"strategy": "cfl", "preset": "paper"})
    awcfl, outcome = resolve_run_config({"strategy": "cfl", "preset": "paper",
                                         "awcfl-beta": 0.5})
    assert plain["batch-size"] == 128
    assert awcfl["batch-size"] == 30 and outcome is not None
    assert "seed 000" in outcome.applied["batch-size"]["source"]


@pytest.mark.parametrize("name", sorted(ClusteredStrategy.registry))
def test_every_recipe_value_is_a_key_the_strategy_reads_and_a_valid_value(name: str) -> None:
    cls = ClusteredStrategy.registry[name]
    for options in ({}, {"awcfl-beta": 0.5, "mcfl": True}):
        for value in cls.paper_recipe(options):
            assert value.source
            if value.applies:
                assert value.key in strategy_keys(name)
                config_keys()[value.key].run_config_value(value.value)
            else:
                assert value.not_applied or value.value == FIXED_KEYS[value.key]


def test_a_recipe_value_the_learner_cannot_run_must_say_why() -> None:
    with pytest.raises(ValueError, match="say why it is not applied"):
        RecipeValue("optimizer", "Adam", "a section")
    with pytest.raises(ValueError, match="is none of"):
        RecipeValue("momentum", 0.9, "a section")
    with pytest.raises(ValueError, match="needs its source"):
        RecipeValue("lr", 0.1, "")
    with pytest.raises(ValueError, match="gives lr more than once"):
        check_recipe("X", (RecipeValue("lr", 0.1, "a"), RecipeValue("lr", 0.2, "b")))


def test_the_server_app_runs_the_recipe_and_records_it_in_the_summary(tmp_path: Path) -> None:
    run_config: dict[str, Any] = {
        "strategy": "fldc", "preset": "paper", "dataset": "digits",
        "cluster-structure": "label-permutation", "num-clusters": 2, "num-rounds": 2,
        "plots": False, "seed": 1, "min-nodes": 6, "results-dir": str(tmp_path),
    }
    grid = LoopbackGrid(build_client_app(run_config), 6, run_config)
    sent: list[Any] = []
    original = server_app.train_config
    with in_process_server(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_app, "train_config",
                      lambda settings: sent.append(original(settings)) or sent[-1])
        server_app.build_server_app()._main(grid, Context(  # type: ignore[misc]
            run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    (summary_file,) = tmp_path.glob("*/summary.json")
    recipe = json.loads(summary_file.read_text())["paper_recipe"]
    assert set(recipe["applied"]) == {"lr", "local-epochs", "local-steps", "batch-size"}
    assert recipe["kept"]["num-rounds"]["value"] == 2
    assert recipe["kept"]["num-rounds"]["paper"] == 50
    # What the clients were told to train with is the paper's.
    assert dict(sent[0]) == {"lr": 0.01, "local-epochs": 5, "local-steps": 0, "batch-size": 64}


def _paper_cells() -> list[tuple[str, Any]]:
    cells = []
    for path in SWEEPS:
        sweep = load_sweep(path)
        cells += [(path.name, cell) for cell in sweep.cells
                  if cell.settings.get("preset") == "paper"]
    return cells


def test_a_sweep_cell_runs_its_own_settings_under_the_paper_preset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    cells = _paper_cells()
    assert cells, "no sweep file runs the paper preset"
    # The run config the sweep hands the ServerApp (simulation.simulate).
    handed: list[dict[str, Any]] = []
    monkeypatch.setattr(server_app, "build_server_app",
                        lambda overrides, **_: handed.append(dict(overrides)))
    monkeypatch.setattr("flwr.simulation.run_simulation", lambda **_: None)
    changed_without_the_switch = 0
    for name, cell in cells:
        settings = {**cell.settings, "results-dir": str(tmp_path)}
        with pytest.raises(RuntimeError, match="not one"):
            simulation.simulate(settings, {"num-supernodes": 2, "client-resources-num-cpus": 1,
                                           "client-resources-num-gpus": 0.0}, None)
        resolved, outcome = resolve_run_config(handed[-1])
        assert outcome is None, name
        assert {k: v for k, v in resolved.items() if k not in RESERVED_RUN_CONFIG_KEYS} == (
            cell.settings), f"{name}: {cell.name}"
        changed_without_the_switch += resolve_run_config(settings)[0] != resolved
    # The switch is what keeps them: without it some cell would take a paper's recipe.
    assert changed_without_the_switch > 0


def test_the_recipe_switch_leaves_every_recorded_cell_key() -> None:
    for name in ("presets", "held-out"):
        lines = (ROOT / "benchmarks" / "measured" / "sweeps" / name / "runs.jsonl")
        recorded = {json.loads(line)["key"] for line in lines.read_text().splitlines() if line}
        keys = {cell.key for cell in load_sweep(ROOT / "benchmarks" / "sweeps"
                                                / f"{name}.toml").cells}
        assert recorded <= keys, name


def test_a_sweep_file_may_not_set_the_recipe_switch(tmp_path: Path) -> None:
    from fl_clusters.sweep.spec import SweepFileError

    path = tmp_path / "s.toml"
    path.write_text(f'[base]\n{PAPER_RECIPE} = true\n[grid]\nseed = [0]\n')
    with pytest.raises(SweepFileError, match="paper preset's recipe is off in a sweep"):
        load_sweep(path)


def test_the_fidelity_page_lists_each_recipe_with_sources_and_what_no_paper_gives() -> None:
    page = (ROOT / "docs" / "paper-fidelity.md").read_text()
    assert "| `lr` | `0.01` | the paper's, unless the user set the key | Wang and Li 2025 " \
           "(seed 002), section 2.2: learning rate 0.01 |" in page
    assert "| `optimizer` | `'Adam'` | not applied: the built-in learner runs plain SGD" in page
    assert ("- `num-rounds`: not given by the paper; this library uses `15` because"
            in page)
    assert "the paper's `15`" not in page
