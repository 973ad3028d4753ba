"""Sweeps: a cell whose run another cell makes (the same run under the other preset)
is recorded from that run, not run again, and follows it when it is run again."""

from __future__ import annotations

import contextlib
import io
import json
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fl_clusters.cli import main
from fl_clusters.strategies import LocalOnly
from fl_clusters.strategies.kit.behaviours import Behaviour
from fl_clusters.strategies.kit.registry import strategy_names
from fl_clusters.strategies.kit.shared_params import FRACTION_TRAIN
from fl_clusters.strategy_builder import build_strategy
from fl_clusters.sweep import Sweep, load_sweep, run_sweep
from fl_clusters.sweep import runner as runner_module
from fl_clusters.sweep.merge import merge_runs
from fl_clusters.sweep.report import stale_runs, table_rows
from fl_clusters.sweep.runner import append_run, pending_cells, read_runs
from fl_clusters.sweep.twins import (
    RUN_FIELDS,
    SAME_RUN_AS,
    SameRuns,
    SourceChange,
    latest_by_key,
    reads_preset,
    run_identity,
)
from tests.test_sweep import TINY_BASE

PRESET_FIELDS = ("preset", "preset_changes", "preset_kept", "preset_rules")


def write_sweep(folder: Path, text: str, name: str = "s") -> Sweep:
    path = folder / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return load_sweep(path)


def cells_by(sweep: Sweep) -> dict[tuple[str, ...], Any]:
    """Cells by their labels' values, in axis order, e.g. ``("fedavg", "paper", "0")``."""
    return {tuple(cell.labels.values()): cell for cell in sweep.cells}


def test_only_a_strategy_that_reads_nothing_the_preset_changes_repeats_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repeats = {name for name in strategy_names() if not reads_preset(name)}
    # Flower's baselines read no `preset`; local-only declares no paper value and
    # no switched rule. FLDC and WeCFL declare switched rules only: they read it.
    assert repeats == {"fedavg", "fedprox", "fedmedian", "local"}
    # Declarations decide, not a list: a paper value or a switched rule makes a
    # strategy read the preset.
    monkeypatch.setattr(LocalOnly, "params", (replace(
        FRACTION_TRAIN, paper=0.5, why="a reason", source="a source"),))
    assert reads_preset("local")
    monkeypatch.undo()
    monkeypatch.setattr(LocalOnly, "behaviours", (Behaviour(
        "own_rule", "the paper's rule", "ours", "a reason", "a source"),))
    assert reads_preset("local")


def test_a_strategy_with_paper_values_is_never_recorded_from_another_cell(
    tmp_path: Path,
) -> None:
    sweep = write_sweep(tmp_path, TINY_BASE + """
        [grid]
        strategy = ["ifca", "fedavg", "local"]
        preset = ["robust", "paper"]
        seed = [0]
    """)
    cell = cells_by(sweep)
    assert run_identity(cell["ifca", "paper", "0"]) is None
    assert run_identity(cell["fedavg", "paper", "0"]) == run_identity(cell["fedavg", "robust", "0"])
    # Another seed, another run.
    assert run_identity(cell["local", "robust", "0"]) != run_identity(cell["fedavg", "robust", "0"])
    robust = [fake_line(c) for name, c in cell.items() if name[1] == "robust"]
    latest = latest_by_key(robust)
    same_runs = SameRuns(sweep)
    todo = pending_cells(sweep, robust, retry_failed=False)
    assert same_runs.plan(todo, latest) == {
        cell["fedavg", "paper", "0"].key: cell["fedavg", "robust", "0"].key,
        cell["local", "paper", "0"].key: cell["local", "robust", "0"].key,
    }
    assert same_runs.source_line(cell["ifca", "paper", "0"], latest) is None


def fake_line(cell: Any, accuracy: float = 0.5, started: str = "2026-01-01T00:00:00+00:00",
              status: str = "ok") -> dict[str, Any]:
    """A run's line as the runner writes it, with made-up figures."""
    summary = {"personalized_accuracy": accuracy, "ari": 1.0, "nmi": 1.0,
               "num_clusters_found": 2, "rounds_to_target": None, "bytes_sent": 10,
               "bytes_received": 5, "wall_time_s": 1.0}
    return {"key": cell.key, "cell": cell.labels, "run_config": cell.run_config,
            "federation": {"num-supernodes": 4}, "started": started,
            "status": status, "error": None if status == "ok" else "RuntimeError: boom",
            "summary": summary if status == "ok" else None, "seconds": 2.0,
            "results_folder": f"runs/{cell.key}/run", "log": f"logs/{cell.key}.log",
            "settings": cell.recorded_settings, "git_commit": "0" * 40, "git_dirty": False,
            "ray_node_id": "node"}


class FakeRay:
    """Stands in for the sweep's Ray session: counts the sessions started."""

    started = 0

    def __enter__(self) -> FakeRay:
        FakeRay.started += 1
        self.node_id, self.resources = "fake-node", {"CPU": 2.0}
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The runner without Ray: each run writes a summary.json of made-up figures
    (its preset fields as its strategy reports them); the list holds each run's
    settings."""
    ran: list[dict[str, Any]] = []

    def simulate(settings: dict[str, Any], federation: Any, timeout_s: Any) -> Path:
        ran.append(dict(settings))
        folder = Path(settings["results-dir"]) / "run"
        folder.mkdir(parents=True)
        summary = {"personalized_accuracy": 0.5 + 0.01 * settings["seed"] + 0.1 * len(ran),
                   "ari": 1.0, "nmi": 1.0, "num_clusters_found": 2, "rounds_to_target": None,
                   "bytes_sent": 10, "bytes_received": 5, "wall_time_s": 1.0,
                   **build_strategy(settings).preset_fields()}
        (folder / "summary.json").write_text(json.dumps(summary))
        return folder

    FakeRay.started = 0
    monkeypatch.setattr(runner_module, "simulate", simulate)
    monkeypatch.setattr(runner_module, "RaySession", FakeRay)
    monkeypatch.setattr(runner_module, "actors_kept_between_runs", contextlib.nullcontext)
    monkeypatch.setattr("fl_clusters.sweep.report.write_plots", lambda *args: [])
    return ran


def quiet() -> Console:
    return Console(file=io.StringIO())


def test_the_runner_records_the_repeated_cell_from_its_run_and_does_not_run_it(
    tmp_path: Path, fake_runs: list[dict[str, Any]], capsys: pytest.CaptureFixture[str],
) -> None:
    # The paper preset first: a robust cell can repeat a paper cell's run too.
    sweep = write_sweep(tmp_path, 'record = ["preset", "preset_rules"]\n' + TINY_BASE + """
        [grid]
        seed = [0, 1]
        preset = ["paper", "robust"]
        strategy = ["ifca", "fedavg", "local"]
    """)
    cell = cells_by(sweep)
    out = tmp_path / "out"
    assert main(["sweep", str(sweep.path), "--out", str(out), "--dry-run"]) == 0
    listed = capsys.readouterr().out.splitlines()
    twin = cell["0", "robust", "fedavg"]
    assert f"{twin.key}  same run as {cell['0', 'paper', 'fedavg'].key}  {twin.name}" in listed
    assert listed[-1].startswith("12 cells, 12 to run (4 the same run as another cell: "
                                 "recorded from its run, 8 run)")

    run_sweep(sweep, out, console=quiet())
    # 2 seeds x (IFCA under both presets, FedAvg once, local once).
    assert len(fake_runs) == 8
    assert not any(s["strategy"] != "ifca" and s["preset"] == "robust" for s in fake_runs)
    lines = read_runs(out / "runs.jsonl")
    assert sorted(line["key"] for line in lines) == sorted(c.key for c in sweep.cells)
    latest = latest_by_key(lines)
    for seed in ("0", "1"):
        for strategy in ("fedavg", "local"):
            source = latest[cell[seed, "paper", strategy].key]
            repeat = latest[cell[seed, "robust", strategy].key]
            assert repeat[SAME_RUN_AS] == source["key"] and SAME_RUN_AS not in source
            assert all(repeat[name] == source[name] for name in RUN_FIELDS)
            assert repeat["settings"] == cell[seed, "robust", strategy].recorded_settings
            # The figures are the run's; the preset fields the cell's own.
            expected = {**source["summary"], "preset": None, "preset_rules": None}
            if strategy == "local":
                expected["preset"] = "robust"
            assert repeat["summary"] == expected
        assert SAME_RUN_AS not in latest[cell[seed, "robust", "ifca"].key]
    # The table counts every cell's run.
    assert all(row["runs_ok"] == 2 for row in table_rows(sweep, lines))
    assert stale_runs(sweep, lines) == []
    # Nothing left to run: no run, no Ray.
    run_sweep(sweep, out, console=quiet())
    assert len(fake_runs) == 8 and FakeRay.started == 1
    assert main(["sweep", str(sweep.path), "--out", str(out), "--dry-run"]) == 0
    assert (f"{twin.key}  recorded (same run as {cell['0', 'paper', 'fedavg'].key})  "
            f"{twin.name}") in capsys.readouterr().out


def test_a_repeated_cell_follows_its_source_run_again_and_runs_when_that_failed(
    tmp_path: Path, fake_runs: list[dict[str, Any]],
) -> None:
    sweep = write_sweep(tmp_path, TINY_BASE + """
        [grid]
        strategy = ["fedavg", "local"]
        preset = ["robust", "paper"]
    """)
    cell = cells_by(sweep)
    out = tmp_path / "out"
    run_sweep(sweep, out, console=quiet())
    assert len(fake_runs) == 2
    source, twin = cell["fedavg", "robust"], cell["fedavg", "paper"]
    # The source run again with other figures (another machine's run, merged).
    again = {**fake_line(source, accuracy=0.93, started="2026-02-02T00:00:00+00:00")}
    append_run(out / "runs.jsonl", again)
    lines = read_runs(out / "runs.jsonl")
    assert [c.key for c in pending_cells(sweep, lines, retry_failed=False)] == [twin.key]
    assert stale_runs(sweep, lines) == [(twin, [SourceChange(source.name, "was run again")])]
    assert (f"- {twin.name} ran with the run of {source.name} (same_run_as), which was "
            "run again") in _table(sweep, out)
    run_sweep(sweep, out, console=quiet())
    # Recorded again from the new run: no run.
    assert len(fake_runs) == 2
    latest = latest_by_key(read_runs(out / "runs.jsonl"))
    assert latest[twin.key]["summary"]["personalized_accuracy"] == 0.93
    assert latest[twin.key]["started"] == again["started"]
    # A source whose run again failed leaves its repeat no run to copy: it runs.
    local_source, local_twin = cell["local", "robust"], cell["local", "paper"]
    append_run(out / "runs.jsonl", fake_line(local_source, status="failed",
                                             started="2026-03-03T00:00:00+00:00"))
    run_sweep(sweep, out, console=quiet())
    assert [(s["strategy"], s["preset"]) for s in fake_runs[2:]] == [("local", "paper")]
    assert SAME_RUN_AS not in latest_by_key(read_runs(out / "runs.jsonl"))[local_twin.key]
    # A stale source stales its repeat with it.
    stale_source = {**again, "settings": {**again["settings"], "lr": 0.5}}
    changes = stale_runs(sweep, [*read_runs(out / "runs.jsonl"), stale_source])
    assert [(c.name, [str(x) for x in found]) for c, found in changes] == [
        (source.name, ["lr=0.5, now 0.1"]),
        (twin.name, [f"the run of {source.name} (same_run_as), which is stale "
                      "(lr=0.5, now 0.1)"]),
    ]


def _table(sweep: Sweep, out: Path) -> str:
    from fl_clusters.sweep.report import write_report

    write_report(sweep, read_runs(out / "runs.jsonl"), out, plots=False)
    return (out / "table.md").read_text()


def test_repeated_cells_are_recorded_past_stop_after_and_only_with_their_source(
    tmp_path: Path, fake_runs: list[dict[str, Any]], capsys: pytest.CaptureFixture[str],
) -> None:
    sweep = write_sweep(tmp_path, TINY_BASE + """
        [grid]
        preset = ["robust", "paper"]
        strategy = ["fedavg", "local"]
    """)
    cell = cells_by(sweep)
    out = tmp_path / "out"
    # A budget over once the first run has ended.
    run_sweep(sweep, out, console=Console(file=io.StringIO()), stop_after_s=1e-9)
    keys = [line["key"] for line in read_runs(out / "runs.jsonl")]
    assert keys == [cell["robust", "fedavg"].key, cell["paper", "fedavg"].key]
    assert len(fake_runs) == 1


def test_merge_takes_a_repeated_line_only_with_the_run_it_repeats(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path, TINY_BASE + """
        [grid]
        strategy = ["fedavg"]
        preset = ["robust", "paper"]
    """)
    source_cell, twin_cell = sweep.cells
    same_runs = SameRuns(sweep)
    source = fake_line(source_cell)
    twin = same_runs.twin_line(twin_cell, source, "2026-01-01T00:01:00+00:00")
    other = tmp_path / "other"
    other.mkdir()
    for line in (source, twin):
        append_run(other / "runs.jsonl", line)
    # Here: the source cell ran already, another run: theirs is not ours.
    here = tmp_path / "here"
    here.mkdir()
    append_run(here / "runs.jsonl", fake_line(source_cell, 0.7, "2026-05-05T00:00:00+00:00"))
    result = merge_runs(sweep, here, other)
    assert (result.added, result.already_recorded, result.repeat_other_runs) == (
        [], [source_cell.key], [twin_cell.key])
    assert pending_cells(sweep, read_runs(here / "runs.jsonl"), False) == [twin_cell]
    # An empty folder takes both; the repeat reads as the cell's run.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert merge_runs(sweep, empty, other).added == [source_cell.key, twin_cell.key]
    lines = read_runs(empty / "runs.jsonl")
    assert stale_runs(sweep, lines) == [] and pending_cells(sweep, lines, False) == []


@pytest.mark.slow
def test_a_baselines_paper_run_is_its_robust_run_so_the_sweep_records_it_unrun(
    tmp_path: Path, no_ray_in_this_process: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real runs: the line a sweep records for FedAvg's and local-only's paper cells
    from their robust runs is the line their own paper runs give."""
    record = ('record = ["preset", "preset_changes", "preset_kept", "preset_rules", '
              '"models_sha256", "per_client_accuracy", "cluster_accuracy"]\n')
    grid = '[grid]\npreset = {}\nstrategy = ["fedavg", "local"]\n'
    both = write_sweep(tmp_path, record + TINY_BASE + grid.format('["robust", "paper"]'),
                       "both")
    paper_only = write_sweep(tmp_path, record + TINY_BASE + grid.format('["paper"]'), "paper")
    ran: list[str] = []
    simulate = runner_module.simulate

    def counted(settings: dict[str, Any], *args: Any) -> Path:
        ran.append(f"{settings['strategy']},{settings['preset']}")
        return simulate(settings, *args)

    monkeypatch.setattr(runner_module, "simulate", counted)
    run_sweep(both, tmp_path / "both", console=quiet())
    assert sorted(ran) == ["fedavg,robust", "local,robust"]
    run_sweep(paper_only, tmp_path / "paper", console=quiet())
    assert sorted(ran[2:]) == ["fedavg,paper", "local,paper"]
    repeated = latest_by_key(read_runs(tmp_path / "both" / "runs.jsonl"))
    real = latest_by_key(read_runs(tmp_path / "paper" / "runs.jsonl"))
    for cell in paper_only.cells:  # the same cells, keys included
        twin, own = repeated[cell.key], real[cell.key]
        assert twin[SAME_RUN_AS] and SAME_RUN_AS not in own and own["status"] == "ok"

        def figures(line: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in line["summary"].items() if k != "wall_time_s"}

        assert figures(twin) == figures(own), cell.name
        assert twin["summary"]["models_sha256"] and twin["summary"]["per_client_accuracy"]
        # The whole summary.json too, but the preset's own fields, the time and the
        # Ray node the clients trained on (each sweep starts its own Ray).
        files = [json.loads((folder / line["results_folder"] / "summary.json").read_text())
                 for folder, line in ((tmp_path / "both", twin), (tmp_path / "paper", own))]
        left_out = ("wall_time_s", "placement", *PRESET_FIELDS)
        assert ({k: v for k, v in files[0].items() if k not in left_out}
                == {k: v for k, v in files[1].items() if k not in left_out}), cell.name
    assert real[cells_by(paper_only)["paper", "local"].key]["summary"]["preset"] == "paper"
