"""The held-out settings sweep (benchmarks/plugin_settings.py): its settings apply, its
records resume, and docs/plugin.md's section is the one its results file renders.

``pytest -k plugin_settings`` selects these.
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fl_clusters.strategies
from benchmarks import plugin_settings as sweep
from benchmarks.plugin_quickstart import EXAMPLE, app_package, plugged_diffs, write_app

RENDERER = sweep.measured_numbers()


@pytest.mark.parametrize("name", list(sweep.SETTINGS))
def test_every_strategys_app_in_every_setting_is_written_and_compiles(
    name: str, tmp_path: Path
) -> None:
    setting = sweep.SETTINGS[name]
    for strategy in sweep.STRATEGIES:
        folder = write_app(tmp_path / strategy, plugged_diffs(strategy, setting.groups),
                           setting.task_diffs)
        for module in ("client_app", "server_app", "task"):
            path = folder / "pytorchexample" / f"{module}.py"
            compile(path.read_text(), str(path), "exec")
        server = (folder / "pytorchexample" / "server_app.py").read_text()
        call = sweep.run_settings(name, strategy)["strategy_call"]
        assert strategy == sweep.FEDAVG or f"    strategy = {call}\n" in server


def test_three_groups_ask_for_three_clusters_where_the_call_takes_a_number() -> None:
    assert sweep.run_settings("three-groups", "IFCA")["strategy_call"] == (
        "IFCA(num_clusters=3, fraction_evaluate=fraction_evaluate)")
    assert sweep.run_settings("three-groups", "CFL")["strategy_call"] == (
        "CFL(fraction_evaluate=fraction_evaluate)")


def _label_maps(folder: Path, groups: int) -> np.ndarray:
    """Each group's name for every digit, from the task under ``folder``."""
    with app_package(folder):
        task = importlib.import_module("pytorchexample.task")
        digits = np.arange(10)
        return np.stack([task._split(np.zeros((10, 1, 8, 8), np.float32), digits, g).labels.numpy()
                         for g in range(groups)])


def test_three_groups_give_three_label_maps_that_disagree_on_every_digit(
    tmp_path: Path,
) -> None:
    folder = write_app(tmp_path, plugged_diffs("IFCA", 3), (sweep.groups_diff(3),))
    maps = _label_maps(folder, 3)
    assert all((maps[a] != maps[b]).all() for a in range(3) for b in range(a + 1, 3)), maps
    with app_package(folder):
        task = importlib.import_module("pytorchexample.task")
        assert [task.group_of(p) for p in range(9)] == [0, 1, 2] * 3


def test_the_examples_two_groups_are_as_before() -> None:
    # Group 1 names every digit five further along, as the example always did.
    assert _label_maps(EXAMPLE, 2).tolist() == [list(range(10)),
                                                [(d + 5) % 10 for d in range(10)]]


def test_the_adam_setting_trains_with_adam_at_its_own_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_app(tmp_path, plugged_diffs("IFCA"), (sweep.ADAM_DIFF,))
    made: list[float] = []
    adam = torch.optim.Adam

    def recording_adam(params: Any, lr: float) -> torch.optim.Optimizer:
        made.append(lr)
        return adam(params, lr=lr)

    monkeypatch.setattr(torch.optim, "Adam", recording_adam)
    with app_package(folder):
        task = importlib.import_module("pytorchexample.task")
        loader, _ = task.load_data(0, 6, 16)
        one_batch = DataLoader(torch.utils.data.Subset(loader.dataset, range(16)),
                               batch_size=16)
        # The run's lr (0.03) no longer reaches the optimizer.
        task.train(task.Net(), one_batch, 1, 0.03, torch.device("cpu"))
    assert made == [1e-3]


def test_an_error_counts_as_a_refusal_only_when_fl_clusters_raised_it() -> None:
    with pytest.raises(ValueError) as refused:
        fl_clusters.strategies.IFCA(num_clusters=0)
    assert sweep.raised_by_fl_clusters(refused.value)
    with pytest.raises(RuntimeError) as elsewhere:
        raise RuntimeError("the app's own bug")
    assert not sweep.raised_by_fl_clusters(elsewhere.value)


def test_the_logged_warnings_are_collected_once_each() -> None:
    logger = logging.getLogger("flwr")
    with sweep.logged_warnings() as warnings:
        for _ in range(2):
            logger.warning("FLDC: 6 nodes, min_pts=4: a group ... cannot form its own ...")
        logger.info("round 1")
    logger.warning("after the block")
    assert warnings == ["FLDC: 6 nodes, min_pts=4: a group ... cannot form its own ..."]


def _results() -> dict[str, Any]:
    """A results file's content: IFCA measured with two seeds, FLDC saying it cannot."""
    def run(ari: float, mean: float, low: float, **more: Any) -> dict[str, Any]:
        return {"ari": ari, "mean_accuracy": mean, "min_accuracy": low, "seconds": 4.0, **more}

    return {"runs": [], "results": {
        sweep.run_key("adam", "IFCA", 0): run(1.0, 0.9, 0.8),
        sweep.run_key("adam", "IFCA", 1): run(0.5, 0.7, 0.2),
        sweep.run_key("adam", "FLDC", 0): run(0.0, 0.4, 0.1, cannot="FLDC: too few nodes"),
    }}


def test_the_section_renders_the_runs_and_the_reasons_from_the_file() -> None:
    results = _results()
    text = sweep.section(results)
    values = {m["expr"]: RENDERER.evaluate(sweep.OUT.name, m["expr"], results)
              for m in RENDERER.INLINE.finditer(text)}
    assert sorted(map(str, values.values())) == sorted(
        ["[1.0, 0.5]", "0.8", "0.2", "4.0", "FLDC: too few nodes"]), values
    ifca = next(line for line in text.splitlines() if line.startswith("| Adam, lr 0.001 | IFCA"))
    assert ifca.count("<!--m ") == 4
    fldc = next(line for line in text.splitlines() if line.startswith("| Adam, lr 0.001 | FLDC"))
    assert "cannot" in fldc and "<!--m " not in fldc
    assert "- FLDC (Adam, lr 0.001): <!--m plugin-settings.json: " in text


def test_docs_section_is_the_one_the_results_file_renders() -> None:
    page = sweep.PAGE.read_text()
    assert sweep.page_with_section(page, sweep.rendered_section(sweep.load(sweep.OUT))) == page, (
        "docs/plugin.md's held-out settings section is stale: run "
        "PYTHONPATH=$PWD python benchmarks/plugin_settings.py --table")


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Runs that cost nothing: the keys measured, in order; a clean commit."""
    measured: list[str] = []

    def measure(name: str, strategy: str, seed: int) -> dict[str, Any]:
        measured.append(sweep.run_key(name, strategy, seed))
        if strategy == "CFL" and seed == 1:
            raise KeyboardInterrupt
        return {"ari": 1.0}

    monkeypatch.setattr(sweep, "measure", measure)
    monkeypatch.setattr(sweep, "set_up_process", lambda: None)
    monkeypatch.setattr(sweep, "measurement_provenance",
                        lambda: {"commit": "a" * 40, "dirty": False})
    return measured


def test_runs_are_written_as_they_finish_and_skipped_when_recorded(
    tmp_path: Path, fake_runs: list[str]
) -> None:
    out = tmp_path / "settings.json"
    args = ["--settings", "adam", "--strategies", "IFCA", "CFL", "--seeds", "0", "1",
            "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        sweep.main(args)
    # Cut short at its fourth run: the three before it are in the file.
    assert sorted(json.loads(out.read_text())["results"]) == [
        "adam|CFL|0", "adam|IFCA|0", "adam|IFCA|1"]
    fake_runs.clear()
    with pytest.raises(KeyboardInterrupt):
        sweep.main(args)
    assert fake_runs == ["adam|CFL|1"]


def test_a_run_recorded_with_other_settings_or_a_changed_tree_runs_again(
    tmp_path: Path, fake_runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "settings.json"
    args = ["--settings", "one-epoch", "--strategies", "IFCA", "--seeds", "0", "--out", str(out)]
    sweep.main(args)
    changed = sweep.Setting("1 local epoch", "test", nodes=6, run_config={"local-epochs": 2})
    monkeypatch.setitem(sweep.SETTINGS, "one-epoch", changed)
    sweep.main(args)
    monkeypatch.setattr(sweep, "measurement_provenance",
                        lambda: {"commit": "a" * 40, "dirty": True})
    sweep.main(args)
    assert fake_runs == ["one-epoch|IFCA|0"] * 3
    written = json.loads(out.read_text())
    assert written["results"]["one-epoch|IFCA|0"]["settings"]["run_config"]["local-epochs"] == 2
    assert len(written["runs"]) == 3


@pytest.mark.slow
@pytest.mark.usefixtures("server_identity")
def test_a_strategy_that_warns_it_cannot_records_its_reason() -> None:
    torch.set_num_threads(1)
    # FLDC's one global model cannot serve two groups whose labels conflict: its start-up
    # warning is the result, the first of its warnings that says so.
    row = sweep.measure("one-epoch", "FLDC", 0)
    assert "FLDC trains one global model for all nodes" in row["cannot"]
    assert row["cannot"] in row["warnings"]
    assert any("cannot form its own DBSCAN cluster" in line for line in row["warnings"])


def test_a_miss_is_judged_against_fedavg_on_the_same_setting_and_seed() -> None:
    fedavg = {"ari": 0.0, "mean_accuracy": 0.30, "min_accuracy": 0.13}
    found = {"ari": 1.0, "mean_accuracy": 0.44, "min_accuracy": 0.30}
    # Every model under-trained (FedAvg at 0.30), but the groups found and well above it.
    assert not sweep.missed_groups(found, fedavg)
    assert sweep.missed_groups({**found, "ari": 0.32}, fedavg)
    assert sweep.missed_groups({**found, "mean_accuracy": 0.32}, fedavg)
    assert sweep.missed_groups({**found, "min_accuracy": 0.10}, fedavg)
    assert not sweep.missed_groups(found, None)
