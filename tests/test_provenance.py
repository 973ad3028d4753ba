"""Every measured file records where its numbers come from; a file that does not is named."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fl_clusters.sweep import provenance
from fl_clusters.sweep.provenance import (
    REQUIRED_KEYS,
    changed_code,
    measured_folder_problems,
    measurement_provenance,
    record_problems,
    session_entry,
)

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "measured"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
RECORD = {"command": ["python", "benchmarks/x.py"], "commit": COMMIT,
          "date": "2026-11-27T01:00:00+00:00", "cores": 2, "gpu": None}


@pytest.fixture(autouse=True)
def _no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asking torch for the GPU imports it (seconds); the card's name is not under test.
    monkeypatch.setattr(provenance, "gpu_name", lambda: "test GPU")


def _write(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def test_every_measured_file_records_its_provenance() -> None:
    assert MEASURED.is_dir()
    assert measured_folder_problems(MEASURED) == []


def test_a_record_made_now_is_complete() -> None:
    record = measurement_provenance(["python", "benchmarks/reproduce.py", "cfl-iid"])
    assert set(REQUIRED_KEYS) <= set(record)
    assert record["command"] == ["python", "benchmarks/reproduce.py", "cfl-iid"]
    assert record["gpu"] == "test GPU"
    assert record_problems(record) == []
    assert measurement_provenance()["command"] == [sys.executable, *sys.argv]


def test_a_sweep_session_with_its_commit_under_git_is_complete(tmp_path: Path) -> None:
    entry = session_entry(["fl-clusters", "sweep", "x.toml"], tmp_path / "x.toml", "0" * 64)
    assert "commit" not in entry and "commit" in entry["git"]
    assert record_problems(entry) == []


def test_dirty_means_changed_code_not_changed_results() -> None:
    # Resuming a sweep changes its tracked runs.jsonl; that is no change to the code.
    porcelain = "\n".join([
        " M benchmarks/measured/sweeps/quick/runs.jsonl",
        " M docs/results.md",
        "M  fl_clusters/models.py",
        "R  benchmarks/old.py -> benchmarks/new.py",
        " M benchmarks/sweeps/quick.toml",
        " M docs/img/ari.png",
        # A sweep's copy of its file, rewritten when the sweep runs: a result.
        " M benchmarks/measured/sweeps/quick/sweep.toml",
    ])
    assert changed_code(porcelain) == [
        "benchmarks/new.py", "benchmarks/sweeps/quick.toml", "fl_clusters/models.py",
    ]
    assert changed_code(" M benchmarks/measured/x.json\n M README.md") == []


@pytest.mark.parametrize(("change", "problem"), [
    ({"gpu": ...}, "provenance lacks gpu"),
    ({"command": ..., "date": ...}, "provenance lacks command, date"),
    ({"commit": "bdf3e4f"}, "commit 'bdf3e4f' is not a 40-digit hash"),
    ({"commit": None}, "commit None is not a 40-digit hash"),
    ({"cores": 0}, "cores 0 is not a count"),
    ({"date": "yesterday"}, "date 'yesterday' is not an ISO 8601 date"),
    ({"command": ""}, "command '' is not a command line"),
    ({"gpu": 1}, "gpu 1 is neither a name nor null"),
    ({"retrofitted": {"on": "2026-11-27"}}, "retrofitted has no 'how'"),
])
def test_an_incomplete_record_is_named(change: dict[str, Any], problem: str) -> None:
    record = {k: v for k, v in {**RECORD, **change}.items() if v is not ...}
    problems = record_problems(record)
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_an_unknown_commit_needs_the_reason() -> None:
    retrofitted = {"on": "2026-11-27", "how": "the file predates the record; git has no trace"}
    assert record_problems({**RECORD, "commit": None, "retrofitted": retrofitted}) == []


def test_every_file_without_provenance_is_reported(tmp_path: Path) -> None:
    _write(tmp_path / "good.json", {"provenance": RECORD, "ari": 1.0})
    _write(tmp_path / "bare.json", {"ari": 1.0})
    _write(tmp_path / "rows.json", [{"ari": 1.0}])
    _write(tmp_path / "repeats" / "short.json",
           {"provenance": {**RECORD, "commit": "bdf3e4f"}, "runs": []})
    (tmp_path / "broken.json").write_text("{")
    sweep = tmp_path / "sweeps" / "grid"
    _write(sweep / "manifest.json", {"sweep": "grid", "sessions": [
        {**{k: v for k, v in RECORD.items() if k != "commit"}, "git": {"commit": COMMIT}},
        {"command": ["fl-clusters", "sweep"], "git": {"commit": COMMIT}},
    ]})
    # Files of a sweep's runs are outputs; its provenance is the manifest and runs.jsonl.
    _write(sweep / "runs" / "a" / "summary.json", {"ari": 1.0})
    (sweep / "runs.jsonl").write_text(
        json.dumps({"key": "a", "git_commit": COMMIT}) + "\n"
        + json.dumps({"key": "b"}) + "\n"
        + '{"key": "c", "git_com'  # the line a running sweep is writing
    )
    _write(tmp_path / "sweeps" / "unstarted" / "runs.jsonl", {})

    assert measured_folder_problems(tmp_path) == [
        'bare.json: no top-level "provenance" record',
        "broken.json: not JSON (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1))",
        "repeats/short.json: commit 'bdf3e4f' is not a 40-digit hash "
        "(null needs retrofitted.how)",
        'rows.json: no top-level "provenance" record',
        "sweeps/grid: manifest.json session 1: provenance lacks date, cores, gpu",
        "sweeps/grid: runs.jsonl line 2: no 40-digit git_commit",
        "sweeps/unstarted: no manifest.json",
    ]
    for name in ("bare.json", "rows.json", "broken.json", "repeats/short.json"):
        (tmp_path / name).unlink()
    (tmp_path / "sweeps" / "unstarted" / "runs.jsonl").unlink()
    (tmp_path / "sweeps" / "unstarted").rmdir()
    (sweep / "runs.jsonl").write_text(json.dumps({"key": "a", "git_commit": COMMIT}) + "\n")
    _write(sweep / "manifest.json", {"sweep": "grid", "sessions": [
        {**{k: v for k, v in RECORD.items() if k != "commit"}, "git": {"commit": COMMIT}}]})
    assert measured_folder_problems(tmp_path) == []
