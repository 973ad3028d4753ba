"""Sweeps: file checks, cell keys, the table's paired differences, and real sweeps that
run, fail a cell, time out, and resume after being killed."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from fl_clusters.cli import main
from fl_clusters.strategies import CFL, FLDC, FLHC
from fl_clusters.strategies.kit.options.mcfl import MCFLOption
from fl_clusters.sweep import Sweep, SweepFileError, load_sweep, parse_sweep, run_sweep
from fl_clusters.sweep.cells import (
    PAPER_REVISION,
    ROBUST_REVISION,
    Cell,
    SettingChange,
    cell_key,
    keys_the_paper_sets,
    resolve_federation,
    revision_settings,
)
from fl_clusters.sweep.cli import sweep_main
from fl_clusters.sweep.lock import LOCK_FILE, SweepFolderInUse, sweep_folder_lock
from fl_clusters.sweep.merge import MergeError, merge_runs
from fl_clusters.sweep.provenance import append_session
from fl_clusters.sweep.report import stale_runs, table_rows, write_report
from fl_clusters.sweep.runner import append_run, pending_cells, read_runs
from fl_clusters.sweep.spec import parse_only
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]

# Digits, 4 clients in 2 rotation groups, 2 short rounds: the smallest real runs.
TINY_BASE = """
[base]
dataset = "digits"
num-rounds = 2
num-clusters = 2
ifca-init-steps = 5
plots = false
[federation]
num-supernodes = 4
"""


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_sweep(text, Path("sweep.toml"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[grids]\nseed = [0]', "unknown top-level key 'grids' (did you mean 'grid'?)"),
        ('[base]\nnum-round = 3\n[grid]\nseed = [0]',
         "[base]: unknown run-config key 'num-round' (did you mean 'num-rounds'?)"),
        ('[grid]\nstrategi = ["ifca"]', "unknown run-config key 'strategi'"),
        ('[grid]\nseed = 3', "[grid] key 'seed' must be a list of values, e.g. seed = [3]"),
        ('[grid]\nstrategy = "ifca"', "[grid] key 'strategy' must be a list of values"),
        ("name = 'x'", "[grid] is missing or empty"),
        ("[grid]", "[grid] is missing or empty"),
        ("[grid]\nseed = []", "[grid] key 'seed' is an empty list"),
        ('baseline = {strategy = "fedavg"}\n[grid]\nseed = [0, 1]',
         "baseline: 'strategy' is not a [grid] axis"),
        ('baseline = {strategy = "fedprox"}\n[grid]\nstrategy = ["ifca", "fedavg"]',
         "baseline: 'fedprox' is not a value of [grid] 'strategy' (ifca, fedavg)"),
        ('baseline = {seed = 0}\n[grid]\nseed = [0, 1]', "the baseline axis cannot be 'seed'"),
        ('baseline = "fedavg"\n[grid]\nstrategy = ["ifca", "fedavg"]',
         "baseline must name one grid axis"),
        ('[grid]\nstrategy = ["ifca", "fedavgg"]',
         "cell strategy=fedavgg: run-config key 'strategy' must be one of 'acfl', 'cfl', "
         "'fedavg'"),
        ('[base]\nresults-dir = "x"\n[grid]\nseed = [0]',
         "run-config key 'results-dir' is set by the sweep"),
        ('[grid]\nseed = [0]\n[federation]\nnum-nodes = 4',
         "[federation]: unknown key 'num-nodes'"),
        ('[grid]\nseed = [0]\n[federation]\nclient-resources-num-gpus = "half"',
         "[federation] key 'client-resources-num-gpus' must be a number >= 0 or \"auto\""),
        ('[grid]\nlr = [0.1]\n[grid.opt]\nfast = {lr = 0.5}',
         "run-config key 'lr' is set by both axes 'lr' and 'opt'"),
        ('[grid.opt]\ndefault = {}\nsame = {lr = 0.1}',
         "cells opt=default and opt=same have the same run config"),
        ('exclude = [{model = "cnn"}]\n[grid]\nseed = [0]',
         "exclude, item 0: 'model' is not a [grid] axis"),
        ('run-timeout-s = 0\n[grid]\nseed = [0]', "run-timeout-s must be a number of seconds > 0"),
        ('record = "ari"\n[grid]\nseed = [0]', "record must be a list of summary.json field"),
    ],
)
def test_a_bad_sweep_file_names_the_key_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(SweepFileError) as error:
        parse(text)
    assert str(error.value).startswith("sweep.toml: ")
    assert message in str(error.value)


def test_a_bad_file_stops_the_command_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[grid]\nstrategy = ["ifca", "cfl"]\nseed = [0, 1]\nlr = [0.1, -1.0]\n')
    out = tmp_path / "out"
    assert sweep_main([str(path), "--out", str(out)]) == 2
    assert not out.exists()


def test_the_grid_expands_with_variants_and_exclusions() -> None:
    sweep = parse("""
        exclude = [{strategy = "fedsoft", structure = "rotation"},
                   {strategy = "ifca", structure = ["mixture"]}]
        [base]
        num-rounds = 3
        [grid]
        strategy = ["ifca", "fedsoft", "fedavg"]
        seed = [0, 1]
        [grid.structure]
        rotation = {cluster-structure = "rotation", num-clusters = 4}
        mixture = {cluster-structure = "rotation-mixture", num-clusters = 2}
        [federation]
        num-supernodes = 8
    """)
    names = [cell.name for cell in sweep.cells]
    assert len(names) == 3 * 2 * 2 - 2 * 2
    assert "strategy=fedsoft,seed=0,structure=mixture" in names
    assert not any("fedsoft" in n and "rotation" in n for n in names)
    mixture = next(c for c in sweep.cells if c.name == "strategy=fedavg,seed=1,structure=mixture")
    assert mixture.settings["cluster-structure"] == "rotation-mixture"
    assert mixture.settings["num-clusters"] == 2
    assert mixture.settings["num-rounds"] == 3
    assert mixture.settings["seed"] == 1
    # Every run waits for the whole federation unless the file says otherwise.
    assert mixture.settings["min-nodes"] == 8
    assert len({cell.key for cell in sweep.cells}) == len(sweep.cells)


def test_a_cell_key_is_what_its_sweep_sets() -> None:
    """The keys' order keeps a cell's key; a value the file sets, or the federation,
    moves it; a default it leaves out is no part of it."""
    plain = parse('[grid]\nstrategy = ["ifca"]\nseed = [0]').cells[0]
    reordered = parse('[grid]\nseed = [0]\nstrategy = ["ifca"]').cells[0]
    other_lr = parse('[base]\nlr = 0.05\n[grid]\nstrategy = ["ifca"]\nseed = [0]').cells[0]
    more_nodes = parse(
        '[grid]\nstrategy = ["ifca"]\nseed = [0]\n[federation]\nnum-supernodes = 10'
    ).cells[0]
    assert plain.key == reordered.key
    assert len({plain.key, other_lr.key, more_nodes.key}) == 3
    assert plain.key == cell_key({"strategy": "ifca", "seed": 0, "min-nodes": 20},
                                 {"num-supernodes": 20, "client-resources-num-cpus": 1})
    # Where a run computes is not what it computes: a GPU share keeps the key, so a
    # GPU machine resumes a sweep a CPU machine began.
    on_gpus = parse(
        '[grid]\nstrategy = ["ifca"]\nseed = [0]\n[federation]\nclient-resources-num-gpus = 0.25'
    ).cells[0]
    assert on_gpus.key == plain.key


@pytest.mark.parametrize(
    ("gpus", "resources", "expected"),
    [
        ("auto", {"CPU": 2.0}, 0.0),
        ("auto", {"CPU": 16.0, "GPU": 1.0}, 0.0625),  # 16 clients at once share one GPU
        ("auto", {"CPU": 16.0, "GPU": 2.0}, 0.125),
        ("auto", {"CPU": 3.0, "GPU": 1.0}, 0.3333),  # Ray's 0.0001 steps, rounded down
        ("auto", {"CPU": 2.0, "GPU": 4.0}, 1.0),  # at most a whole GPU a client
        (0.0, {"CPU": 16.0, "GPU": 1.0}, 0.0),  # the file keeps a run on the CPU
        (0.5, {"CPU": 16.0, "GPU": 1.0}, 0.5),
    ],
)
def test_an_auto_gpu_share_splits_the_gpus_among_the_clients_that_run_at_once(
    gpus: object, resources: dict[str, float], expected: float
) -> None:
    gpu_line = "" if gpus == "auto" else f"client-resources-num-gpus = {gpus}\n"
    sweep = parse(f'[grid]\nseed = [0]\n[federation]\n{gpu_line}')
    assert sweep.federation["client-resources-num-gpus"] == gpus
    resolved = resolve_federation(sweep.federation, resources)
    assert resolved["client-resources-num-gpus"] == expected
    assert resolved["client-resources-num-cpus"] == 1


def _line(cell, status: str, accuracy: float, ari: float) -> dict:  # type: ignore[no-untyped-def]
    summary = {"personalized_accuracy": accuracy, "ari": ari, "nmi": ari,
               "num_clusters_found": 2, "rounds_to_target": None, "bytes_sent": 10,
               "bytes_received": 5, "wall_time_s": 1.0}
    return {"key": cell.key, "cell": cell.labels, "settings": cell.settings,
            "status": status, "seconds": 2.0,
            "summary": summary if status == "ok" else None,
            "error": None if status == "ok" else "RuntimeError: boom"}


def test_the_table_pairs_each_seed_with_the_baseline_of_the_same_seed(tmp_path: Path) -> None:
    sweep = parse('baseline = {strategy = "fedavg"}\n'
                  '[grid]\nstrategy = ["ifca", "fedavg"]\nseed = [0, 1, 2]')
    cell = {c.name: c for c in sweep.cells}
    accuracy = {("ifca", 0): 0.9, ("ifca", 1): 0.8, ("ifca", 2): 0.7,
                ("fedavg", 0): 0.5, ("fedavg", 1): 0.7, ("fedavg", 2): 0.1}
    runs = [
        _line(cell[f"strategy={s},seed={seed}"], "ok", acc, 1.0 if s == "ifca" else 0.0)
        for (s, seed), acc in accuracy.items()
    ]
    # Seed 2 of the baseline failed: seed 2 has no pair, and its failure is counted.
    runs[-1] = _line(cell["strategy=fedavg,seed=2"], "failed", 0.0, 0.0)
    # Seed 1 of the baseline ran on a GPU (a sweep resumed on a GPU machine).
    runs[-2]["federation"] = {"num-supernodes": 20, "client-resources-num-cpus": 1,
                              "client-resources-num-gpus": 0.0625}
    rows = {row["strategy"]: row for row in table_rows(sweep, runs)}
    ifca, fedavg = rows["ifca"], rows["fedavg"]
    assert ifca["personalized_accuracy_mean"] == pytest.approx(0.8)
    assert ifca["personalized_accuracy_std"] == pytest.approx(0.1)
    assert ifca["personalized_accuracy_minus_fedavg_n"] == 2
    assert ifca["personalized_accuracy_minus_fedavg_mean"] == pytest.approx((0.4 + 0.1) / 2)
    assert ifca["ari_minus_fedavg_mean"] == pytest.approx(1.0)
    assert fedavg["runs_ok"] == 2 and fedavg["runs_failed"] == 1
    assert fedavg["runs_on_gpu"] == 1 and ifca["runs_on_gpu"] == 0
    assert "personalized_accuracy_minus_fedavg_n" not in fedavg
    written = write_report(sweep, runs, tmp_path)
    assert {p.name for p in written} == {
        "table.csv", "table.md", "accuracy.png", "ari.png", "paired-difference.png"
    }
    assert "| ifca | 0,1,2 | 0.8000 ± 0.1000 |" in (tmp_path / "table.md").read_text()
    table = (tmp_path / "table.md").read_text()
    assert "| fedavg | 0,1 (1 failed, 0 not run) (1 on GPU) |" in table
    assert "+0.2500 ± 0.2121 (2)" in (tmp_path / "table.md").read_text()


def test_a_default_the_paper_preset_replaces_stales_no_paper_run() -> None:
    """FedSoft's K default went from 5 to 0 (every node); preset='paper' runs K = 15
    either way unless the cell names K, so only the robust run and a cell that names
    K are stale."""
    sweep = parse('[grid]\nstrategy = ["fedsoft"]\npreset = ["paper", "robust"]\n'
                  'fedsoft-clients-per-cluster = [0, 4]\nseed = [0]')
    by_name = {(cell.settings["preset"], cell.settings["fedsoft-clients-per-cluster"]): cell
               for cell in sweep.cells}
    assert "fedsoft-clients-per-cluster" in keys_the_paper_sets(by_name["paper", 0].settings)
    assert keys_the_paper_sets(by_name["robust", 0].settings) == set()

    def ran_with_k_5(cell: Cell) -> dict:
        return {**cell.settings, "fedsoft-clients-per-cluster": 5,
                **revision_settings(cell.settings)}

    # The grid names K, so every cell's run config sets it: a named key counts.
    assert [str(c) for c in by_name["paper", 4].changed_settings(ran_with_k_5(
        by_name["paper", 4]))] == ["fedsoft-clients-per-cluster=5, now 4"]
    unnamed = parse('[grid]\nstrategy = ["fedsoft"]\npreset = ["paper", "robust"]\n'
                    'seed = [0]')
    paper, robust = sorted(unnamed.cells, key=lambda cell: cell.settings["preset"])
    assert paper.changed_settings(ran_with_k_5(paper)) == []
    assert [str(c) for c in robust.changed_settings(ran_with_k_5(robust))] == [
        "fedsoft-clients-per-cluster=5, now 0"]


def test_a_run_is_stale_only_when_a_setting_it_used_has_another_value_now(
    tmp_path: Path,
) -> None:
    sweep = parse('[grid]\nstrategy = ["ifca", "cfl"]\nseed = [0]')
    ifca, cfl = sweep.cells
    ran_other_lr = {**ifca.settings, "ifca-server-lr": 0.25}
    # CFL reads no IFCA key, and a key added since the run stales nothing.
    ran_before_a_key = {k: v for k, v in cfl.settings.items() if k != "cfl-eps2"}
    ran_before_a_key["ifca-server-lr"] = 0.25
    assert [str(c) for c in ifca.changed_settings(ran_other_lr)] == [
        "ifca-server-lr=0.25, now 0.5"]
    assert cfl.changed_settings(ran_before_a_key) == []
    runs = [{**_line(ifca, "ok", 0.9, 1.0), "settings": ran_other_lr},
            {**_line(cfl, "ok", 0.8, 1.0), "settings": ran_before_a_key}]
    assert pending_cells(sweep, runs, retry_failed=False) == [ifca]
    assert stale_runs(sweep, runs) == [(ifca, [SettingChange("ifca-server-lr", 0.25, 0.5)])]
    # The stale run still counts in the table, which names it and the setting.
    assert {row["strategy"]: row["runs_ok"] for row in table_rows(sweep, runs)} == {
        "ifca": 1, "cfl": 1}
    write_report(sweep, runs, tmp_path, plots=False)
    assert ("- strategy=ifca,seed=0 ran with ifca-server-lr=0.25, now 0.5"
            in (tmp_path / "table.md").read_text())
    # Merging: another machine's current run replaces a stale one, not a current one.
    here, other = tmp_path / "here", tmp_path / "other"
    for folder, lines in ((here, runs), (other, [_line(ifca, "ok", 0.7, 1.0),
                                                 _line(cfl, "ok", 0.6, 1.0)])):
        folder.mkdir()
        for line in lines:
            append_run(folder / "runs.jsonl", line)
    result = merge_runs(sweep, here, other)
    assert (result.added, result.already_recorded) == ([ifca.key], [cfl.key])
    assert stale_runs(sweep, read_runs(here / "runs.jsonl")) == []


def test_a_paper_preset_run_is_stale_when_its_strategys_paper_revision_rose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sweep = parse('[grid]\nstrategy = ["cfl", "flhc"]\npreset = ["paper", "robust"]\nseed = [0]')
    cells = {(cell.labels["strategy"], cell.labels["preset"]): cell for cell in sweep.cells}
    # Lines recorded before the key existed: each ran its preset's revision 1.
    before = {name: {k: v for k, v in cell.recorded_settings.items() if k != PAPER_REVISION}
              for name, cell in cells.items()}
    assert cells["cfl", "paper"].recorded_settings[PAPER_REVISION] == CFL.paper_revision
    assert CFL.paper_revision > 1 and "paper_revision" not in vars(FLHC)
    assert PAPER_REVISION not in cells["cfl", "robust"].recorded_settings
    assert [str(c) for c in cells["cfl", "paper"].changed_settings(before["cfl", "paper"])] == [
        f"paper-revision=1, now {CFL.paper_revision}"]
    assert cells["flhc", "paper"].changed_settings(before["flhc", "paper"]) == []
    assert cells["cfl", "robust"].changed_settings(before["cfl", "robust"]) == []
    # A line of the current revision is current; a later rise stales it, never a robust run.
    current = {name: cell.recorded_settings for name, cell in cells.items()}
    assert all(cell.changed_settings(current[name]) == [] for name, cell in cells.items())
    monkeypatch.setattr(FLHC, "paper_revision", 2, raising=False)
    stale = [name for name, cell in cells.items() if cell.changed_settings(current[name])]
    assert stale == [("flhc", "paper")]
    # An option's rules count only in the runs that switch it on.
    with_mcfl = parse('[grid]\nstrategy = ["flhc"]\npreset = ["paper"]\nmcfl = [true, false]')
    on, off = with_mcfl.cells
    assert MCFLOption.paper_revision > 1
    assert (on.recorded_settings[PAPER_REVISION] - off.recorded_settings[PAPER_REVISION]
            == MCFLOption.paper_revision - 1)


def test_a_robust_run_is_stale_when_its_strategys_robust_revision_rose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sweep = parse('[grid]\nstrategy = ["fldc", "flhc"]\npreset = ["robust", "paper"]\nseed = [0]')
    cells = {(cell.labels["strategy"], cell.labels["preset"]): cell for cell in sweep.cells}
    assert FLDC.robust_revision > 1 and "robust_revision" not in vars(FLHC)
    fldc = cells["fldc", "robust"]
    assert fldc.recorded_settings[ROBUST_REVISION] == FLDC.robust_revision
    # A line recorded before FLDC's robust rules changed has no revision: 1.
    before = {k: v for k, v in fldc.recorded_settings.items() if k != ROBUST_REVISION}
    assert [str(c) for c in fldc.changed_settings(before)] == [
        f"robust-revision=1, now {FLDC.robust_revision}"]
    # Revision 1 is not recorded, so no line of a strategy that never rose goes stale;
    # the paper preset counts its own revision only.
    assert ROBUST_REVISION not in cells["flhc", "robust"].recorded_settings
    assert ROBUST_REVISION not in cells["fldc", "paper"].recorded_settings
    current = {name: cell.recorded_settings for name, cell in cells.items()}
    monkeypatch.setattr(FLHC, "robust_revision", 2, raising=False)
    stale = [name for name, cell in cells.items() if cell.changed_settings(current[name])]
    assert stale == [("flhc", "robust")]


def test_rekeying_gives_old_lines_todays_keys_and_their_folders(tmp_path: Path) -> None:
    rekey_sweeps = load_script(ROOT / "benchmarks" / "rekey_sweeps.py")
    sweep = parse('[grid]\nstrategy = ["ifca", "cfl"]\nseed = [0]')
    old_keys = ["0" * 16, "1" * 16]
    for old, cell in zip(old_keys, sweep.cells, strict=True):
        (tmp_path / "runs" / old / "run").mkdir(parents=True)
        (tmp_path / "logs").mkdir(exist_ok=True)
        (tmp_path / "logs" / f"{old}.log").write_text(cell.name)
        append_run(tmp_path / "runs.jsonl", {
            **_line(cell, "ok", 0.5, 1.0), "key": old, "run_config": cell.run_config,
            "federation": {**sweep.federation, "client-resources-num-gpus": 0.0},
            "results_folder": f"runs/{old}/run", "log": f"logs/{old}.log"})
    assert rekey_sweeps.rekey(tmp_path) == 2
    lines = read_runs(tmp_path / "runs.jsonl")
    assert [line["key"] for line in lines] == [cell.key for cell in sweep.cells]
    for line, cell in zip(lines, sweep.cells, strict=True):
        assert (tmp_path / line["results_folder"]).is_dir()
        assert (tmp_path / line["log"]).read_text() == cell.name
    assert rekey_sweeps.rekey(tmp_path) == 0


def test_a_line_cut_off_by_a_kill_is_dropped_and_the_next_starts_clean(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    append_run(path, {"key": "a", "status": "ok"})
    with path.open("a") as out:
        out.write('{"key": "b", "sta')
    assert read_runs(path) == [{"key": "a", "status": "ok"}]
    append_run(path, {"key": "c", "status": "ok"})
    assert [line["key"] for line in read_runs(path)] == ["a", "c"]


@pytest.mark.slow
def test_a_tiny_sweep_runs_every_cell_on_one_ray_session_and_records_a_failed_one(
    tmp_path: Path, no_ray_in_this_process: None
) -> None:
    path = tmp_path / "tiny.toml"
    # "broken": IFCA with more cluster models than nodes stops before round 1.
    head = 'baseline = {strategy = "fedavg"}\nrecord = ["preset"]\n'
    path.write_text(head + TINY_BASE + textwrap.dedent("""
        [grid]
        seed = [0, 1]
        [grid.strategy]
        ifca = {strategy = "ifca"}
        fedavg = {strategy = "fedavg"}
        broken = {strategy = "ifca", num-clusters = 6}
    """))
    sweep = load_sweep(path)
    folder = run_sweep(sweep, tmp_path / "out", command=["test"],
                       console=Console(file=io.StringIO()))
    lines = read_runs(folder / "runs.jsonl")
    assert sorted(line["key"] for line in lines) == sorted(cell.key for cell in sweep.cells)
    by_name = {",".join(f"{k}={v}" for k, v in line["cell"].items()): line for line in lines}
    for seed in (0, 1):
        broken = by_name[f"seed={seed},strategy=broken"]
        assert broken["status"] == "failed"
        assert "ConfigurationError" in broken["error"] and broken["summary"] is None
        for strategy in ("ifca", "fedavg"):
            line = by_name[f"seed={seed},strategy={strategy}"]
            assert line["status"] == "ok", line["error"]
            summary = json.loads((folder / line["results_folder"] / "summary.json").read_text())
            assert line["summary"]["personalized_accuracy"] == summary["personalized_accuracy"]
            assert line["settings"]["seed"] == seed
            assert line["git_commit"] is not None
        ifca = by_name[f"seed={seed},strategy=ifca"]["summary"]
        assert ifca["num_clusters_found"] == 2 and ifca["ari"] == 1.0
        assert ifca["preset"] == "robust"  # a field the sweep file's `record` asks for
    # One Ray session for every cell.
    assert len({line["ray_node_id"] for line in lines}) == 1
    rows = {row["strategy"]: row for row in table_rows(sweep, lines)}
    expected = sum(
        by_name[f"seed={s},strategy=ifca"]["summary"]["personalized_accuracy"]
        - by_name[f"seed={s},strategy=fedavg"]["summary"]["personalized_accuracy"]
        for s in (0, 1)
    ) / 2
    assert rows["ifca"]["personalized_accuracy_minus_fedavg_mean"] == pytest.approx(expected)
    assert rows["broken"]["runs_failed"] == 2
    for name in ("table.csv", "table.md", "accuracy.png", "ari.png", "paired-difference.png",
                 "manifest.json", "sweep.toml"):
        assert (folder / name).stat().st_size > 0, name
    session = json.loads((folder / "manifest.json").read_text())["sessions"][0]
    assert session["cores"] == os.cpu_count() and session["command"] == ["test"]
    assert {"flwr", "torch"} <= set(session["versions"])


def test_a_run_past_its_timeout_is_recorded_failed_and_the_command_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray_in_this_process: None
) -> None:
    path = tmp_path / "timeout.toml"
    path.write_text("run-timeout-s = 1\n" + TINY_BASE + '[grid]\nstrategy = ["fedavg"]\n')
    folder = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(folder)]) == 1
    (line,) = read_runs(folder / "runs.jsonl")
    assert line["status"] == "failed"
    assert "RunTimeoutError: the run took longer than run-timeout-s = 1 s" in line["error"]
    assert f"1 of 1 runs failed (their logs: {line['log']})" in capsys.readouterr().err
    # Started again, the sweep keeps the failed run, says how to run it again, and
    # runs nothing: no run of this command failed.
    assert main(["sweep", str(path), "--out", str(folder)]) == 0
    assert "1 recorded (1 failed; --retry-failed runs them again), 0 to run" in (
        capsys.readouterr().err)
    assert len(read_runs(folder / "runs.jsonl")) == 1


def test_a_sweep_folder_that_cannot_be_written_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_BASE + '[grid]\nstrategy = ["fedavg"]\n')
    (tmp_path / "a-file").write_text("")
    assert main(["sweep", str(path), "--out", str(tmp_path / "a-file" / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cannot write the sweep's folder")
    assert "a-file/out" in line and "--out" in line


def test_a_sweep_of_more_than_a_thousand_runs_names_its_size_and_waits_for_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.toml"
    seeds = ", ".join(str(seed) for seed in range(1001))
    path.write_text(TINY_BASE + f'[grid]\nstrategy = ["fedavg"]\nseed = [{seeds}]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("large sweep 1,001 runs to do (none of its runs is recorded yet")
    assert "--dry-run lists them" in line and "--yes starts all of them" in line
    assert not (out / "runs.jsonl").exists()
    # --yes goes on to run it (stopped here before any run starts).
    started: list[int] = []
    monkeypatch.setattr("fl_clusters.sweep.cli.run_sweep",
                        lambda sweep, *args, **kwargs: started.append(len(sweep.cells)))
    assert main(["sweep", str(path), "--out", str(out), "--yes"]) == 0
    assert started == [1001]


def test_stop_after_finishes_the_run_under_way_and_starts_no_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_ray_in_this_process: None
) -> None:
    path = tmp_path / "budget.toml"
    path.write_text(TINY_BASE + '[grid]\nstrategy = ["fedavg"]\nseed = [0, 1, 2]\n')
    out = tmp_path / "out"
    # A budget of 6 ms: over once the first run has taken its seconds.
    assert main(["sweep", str(path), "--out", str(out), "--stop-after", "0.0001"]) == 0
    lines = read_runs(out / "runs.jsonl")
    assert [line["status"] for line in lines] == ["ok"]
    assert "2 of 3 runs not started" in capsys.readouterr().err
    assert (out / "table.md").exists()
    for wrong in ("0", "-5", "soon", "inf"):
        with pytest.raises(SystemExit):
            main(["sweep", str(path), "--stop-after", wrong, "--dry-run"])
    assert "is not a number of minutes > 0" in capsys.readouterr().err


def _sweep_process(path: Path, out: Path) -> subprocess.Popen[str]:
    # A session of its own: killing its group also kills the Ray processes it started.
    return subprocess.Popen(
        [sys.executable, "-m", "fl_clusters.sweep", str(path), "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_killed_sweep_started_again_runs_only_the_cells_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "resume.toml"
    path.write_text(TINY_BASE + '[grid]\nstrategy = ["ifca", "fedavg"]\nseed = [0, 1]\n')
    out = tmp_path / "out"
    runs = out / "runs.jsonl"
    first = _sweep_process(path, out)
    try:
        deadline = time.monotonic() + 600
        while not (out / LOCK_FILE).exists() or not (out / LOCK_FILE).read_text():
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "the sweep took no lock within 10 minutes"
            time.sleep(0.05)
        # A second sweep on the folder is refused and leaves the first to its runs.
        assert main(["sweep", str(path), "--out", str(out)]) == 2
        (refusal,) = capsys.readouterr().err.splitlines()
        assert f"the sweep of PID {first.pid} on host" in refusal
        while not (runs.exists() and runs.read_text().count("\n") >= 1):
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "no run finished within 10 minutes"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    before = runs.read_text().splitlines()
    assert 1 <= len(before) < 4
    assert all(json.loads(line)["status"] == "ok" for line in before)
    second = _sweep_process(path, out)
    output, _ = second.communicate(timeout=900)
    assert second.returncode == 0, output
    # The killed sweep's lock is taken over.
    assert f"the sweep of PID {first.pid} on host" in output
    assert "ended without releasing it" in output
    assert f"{len(before)} recorded, {4 - len(before)} to run" in output
    after = runs.read_text().splitlines()
    # The lines of the first session stay as they were; each cell has exactly one line.
    assert after[: len(before)] == before
    keys = [json.loads(line)["key"] for line in after]
    assert sorted(keys) == sorted(cell.key for cell in load_sweep(path).cells)
    assert all(json.loads(line)["status"] == "ok" for line in after)
    # Only the finished runs' folders remain (the killed run's was removed).
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(keys)
    assert len(json.loads((out / "manifest.json").read_text())["sessions"]) == 2


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "sweeps").glob("*.toml")),
                         ids=lambda path: path.name)
def test_every_benchmark_sweep_file_is_valid(path: Path) -> None:
    sweep = load_sweep(path)
    # The paper-scale cells use 20 clients; the held-out cell 40, on purpose; a
    # paper's reproduction its paper's 10 or 100 where 2 cores allow; issue 58's
    # held-out placement settings 8 and 24, sizes no default was chosen on.
    sizes = (8, 24) if path.name.startswith("placement-held-out") else (10, 20, 40, 100)
    assert sweep.cells and sweep.federation["num-supernodes"] in sizes


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks" / "sweeps").glob("reproduce-*.toml")),
                         ids=lambda path: path.name)
def test_a_reproduction_sweep_runs_both_presets_on_five_seeds_and_says_what_it_scaled(
    path: Path,
) -> None:
    sweep = load_sweep(path)
    labels = {axis.name: {label for label, _ in axis.values} for axis in sweep.axes}
    assert labels["seed"] == {"0", "1", "2", "3", "4"}
    assert labels["preset"] == {"robust", "paper"}
    # The paper's baselines are in the grid, every cell paired with them.
    assert sweep.baseline_axis == "strategy" and sweep.baselines
    # Its header cites each setting's source and says what was scaled down.
    header = path.read_text().partition("\nname = ")[0]
    assert "Settings and their sources:" in header and "Scaled down, and why:" in header
    assert sweep.name == path.stem


def test_the_console_script_lists_cells_and_which_are_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tomllib

    module, _, function = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "scripts"]["fl-clusters"].partition(":")
    main = getattr(__import__(module, fromlist=[function]), function)
    path = tmp_path / "s.toml"
    path.write_text('[grid]\nstrategy = ["ifca", "fedavg"]\n')
    done = load_sweep(path).cells[1]
    out = tmp_path / "out"
    out.mkdir()
    append_run(out / "runs.jsonl", _line(done, "ok", 0.5, 1.0))
    assert main(["sweep", str(path), "--out", str(out), "--dry-run"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split() == [load_sweep(path).cells[0].key, "to", "run", "strategy=ifca"]
    assert listed[1].split() == [done.key, "recorded", "strategy=fedavg"]
    assert listed[2].startswith("2 cells, 1 to run")


def _write_sweep(folder: Path, text: str) -> tuple[Path, Sweep]:
    path = folder / "s.toml"
    path.write_text(text)
    return path, load_sweep(path)


def test_only_runs_the_chosen_cells_and_names_a_wrong_axis_or_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, sweep = _write_sweep(tmp_path, '[grid]\nseed = [0, 1, 2]\nmodel = ["mlp", "cnn"]\n'
                                         'strategy = ["ifca", "fedavg"]\n')
    only = parse_only(sweep, ["model=mlp", "seed=1", "seed=2"])
    assert only == {"model": {"mlp"}, "seed": {"1", "2"}}
    chosen = pending_cells(sweep, [], retry_failed=False, only=only)
    assert sorted(cell.name for cell in chosen) == sorted(
        f"seed={seed},model=mlp,strategy={strategy}"
        for seed in (1, 2) for strategy in ("ifca", "fedavg")
    )
    # A recorded cell stays recorded; the cells --only leaves out are listed as such.
    out = tmp_path / "out"
    out.mkdir()
    append_run(out / "runs.jsonl", _line(chosen[0], "ok", 0.5, 1.0))
    assert main(["sweep", str(path), "--out", str(out), "--dry-run",
                 "--only", "model=mlp", "--only", "seed=1,2"]) == 0
    states = [line.split()[1] for line in capsys.readouterr().out.splitlines()[:-1]]
    assert states.count("recorded") == 1
    assert states.count("to") == 3
    assert states.count("left") == 12 - 4
    for wrong, message in [
        ("modl=mlp", "'modl' is not a [grid] axis (did you mean 'model'?)"),
        ("model=mpl", "'mpl' is not a value of [grid] 'model' (mlp, cnn)"),
        ("model", "write AXIS=LABEL[,LABEL...]"),
    ]:
        with pytest.raises(SweepFileError, match=re.escape(message)):
            parse_only(sweep, [wrong])
        assert main(["sweep", str(path), "--only", wrong, "--dry-run"]) == 2


def test_merge_adds_another_machines_runs_with_their_folders_and_sessions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, sweep = _write_sweep(
        tmp_path, 'name = "shared"\n[grid]\nstrategy = ["ifca", "fedavg", "cfl"]\nseed = [0, 1]\n'
    )
    cell = {c.name: c for c in sweep.cells}
    here, gpu = tmp_path / "here", tmp_path / "gpu"

    def record(folder: Path, name: str, status: str = "ok") -> None:
        append_run(folder / "runs.jsonl", _line(cell[name], status, 0.5, 1.0))
        (folder / "runs" / cell[name].key).mkdir(parents=True)
        (folder / "runs" / cell[name].key / "summary.json").write_text("{}")
        (folder / "logs").mkdir(exist_ok=True)
        (folder / "logs" / f"{cell[name].key}.log").write_text(name)

    here.mkdir()
    gpu.mkdir()
    record(here, "strategy=ifca,seed=0")
    record(here, "strategy=cfl,seed=0", status="failed")
    record(gpu, "strategy=ifca,seed=0")  # both machines ran it: ours is kept
    record(gpu, "strategy=cfl,seed=0")  # ours failed, theirs is ok: theirs counts
    record(gpu, "strategy=fedavg,seed=1")
    append_run(gpu / "runs.jsonl", {"key": "0" * 16, "status": "ok"})  # another file's
    append_session(here / "manifest.json", "shared", {"machine": "laptop"})
    append_session(gpu / "manifest.json", "shared", {"machine": "H200"})

    result = merge_runs(sweep, here, gpu)
    assert result.added == [cell["strategy=cfl,seed=0"].key, cell["strategy=fedavg,seed=1"].key]
    assert result.already_recorded == [cell["strategy=ifca,seed=0"].key]
    assert result.not_in_sweep == ["0" * 16]
    lines = read_runs(here / "runs.jsonl")
    assert [line["key"] for line in lines].count(cell["strategy=cfl,seed=0"].key) == 2
    rows = {row["strategy"]: row for row in table_rows(sweep, lines)}
    assert rows["cfl"]["runs_ok"] == 1 and rows["cfl"]["runs_failed"] == 0
    key = cell["strategy=fedavg,seed=1"].key
    assert (here / "runs" / key / "summary.json").exists()
    assert (here / "logs" / f"{key}.log").read_text() == "strategy=fedavg,seed=1"
    sessions = json.loads((here / "manifest.json").read_text())["sessions"]
    assert sessions == [{"machine": "laptop"}, {"machine": "H200"}]
    # Merging again adds nothing and repeats no session.
    assert merge_runs(sweep, here, gpu).added == []
    assert len(json.loads((here / "manifest.json").read_text())["sessions"]) == 2

    # The command: merges, writes the table, and names what it left out.
    other = tmp_path / "other"
    other.mkdir()
    record(other, "strategy=cfl,seed=1")
    assert main(["sweep", str(path), "--out", str(here), "--merge", str(other)]) == 0
    assert "1 runs added, 0 already recorded here" in capsys.readouterr().out
    assert (here / "table.md").exists()
    # Bad folders are refused with the reason.
    with pytest.raises(MergeError, match=re.escape("no runs.jsonl")):
        merge_runs(sweep, here, tmp_path / "nowhere")
    with pytest.raises(MergeError, match="is the sweep's own folder"):
        merge_runs(sweep, here, here)
    append_session(other / "manifest.json", "another", {})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "runs.jsonl").write_text("")
    append_session(elsewhere / "manifest.json", "another", {})
    with pytest.raises(MergeError, match="holds sweep 'another', not 'shared'"):
        merge_runs(sweep, here, elsewhere)
    assert main(["sweep", str(path), "--out", str(here), "--merge", str(elsewhere)]) == 2


def test_a_sweep_folder_in_use_is_refused_in_one_line_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, sweep = _write_sweep(tmp_path, TINY_BASE + '[grid]\nstrategy = ["fedavg"]\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "runs.jsonl").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    (other / "runs.jsonl").write_text("")
    with sweep_folder_lock(out):
        holder = json.loads((out / LOCK_FILE).read_text())
        before = sorted(p.name for p in out.iterdir())
        for extra in ([], ["--report"], ["--merge", str(other)]):
            assert main(["sweep", str(path), "--out", str(out), *extra]) == 2, extra
            (line,) = capsys.readouterr().err.splitlines()
            assert line.startswith(f"sweep folder in use {out}: the sweep of PID {os.getpid()} "
                                   f"on host {socket.gethostname()}, started "
                                   f"{holder['started']}"), line
            assert "wait for it to end or stop it, or give this one another --out" in line
        assert sorted(p.name for p in out.iterdir()) == before
        assert (out / "runs.jsonl").read_text() == ""
        with pytest.raises(SweepFolderInUse):
            run_sweep(sweep, out, console=Console(file=io.StringIO()))
    # Released on leaving, an exception or Ctrl-C too.
    assert not (out / LOCK_FILE).exists()
    with pytest.raises(KeyboardInterrupt), sweep_folder_lock(out):
        raise KeyboardInterrupt
    assert not (out / LOCK_FILE).exists()


def test_a_lock_a_dead_sweep_left_is_taken_over_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _write_sweep(tmp_path, '[grid]\nstrategy = ["ifca", "fedavg"]\n')
    out = tmp_path / "out"
    out.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = {"pid": gone.pid, "host": socket.gethostname(),
            "started": "2026-01-01T00:00:00+00:00", "command": ["fl-clusters", "sweep"]}
    (out / LOCK_FILE).write_text(json.dumps(left))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert main(["sweep", str(path), "--out", str(out), "--report"]) == 0
    assert (f"the sweep of PID {gone.pid} on host {socket.gethostname()}, started "
            "2026-01-01T00:00:00+00:00 (fl-clusters sweep) ended without releasing it"
            in caplog.text)
    assert (out / "table.md").exists() and not (out / LOCK_FILE).exists()
    # A lock another machine wrote is not taken over: it may still be running there.
    (out / LOCK_FILE).write_text(json.dumps({**left, "host": "gpu-node-7"}))
    capsys.readouterr()
    assert main(["sweep", str(path), "--out", str(out), "--report"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"names the sweep of PID {gone.pid} on host gpu-node-7" in line
    assert line.endswith("another machine's; delete the file once that sweep has stopped")
    assert (out / LOCK_FILE).exists()
