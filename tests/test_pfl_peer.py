"""benchmarks/pfl_peer.py, pfl-research on scale.py's job (issue 54), at a tiny scale.

pfl is optional: its test runs only where ``.venv-pfl`` holds it (the script's
docstring says how to make it). The users' data, the job list and the plain PyTorch
loop need no pfl and run in the suite's own environment, on a small fake
Fashion-MNIST written as IDX files.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.conftest import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "pfl_peer.py"
PFL_PYTHON = ROOT / ".venv-pfl" / "bin" / "python"


@pytest.fixture(scope="module")
def peer() -> ModuleType:
    return load_script(SCRIPT)


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture(scope="module")
def fake_fashion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 train and 50 test images of 28x28 with labels 0..9, as gzip'ed IDX files."""
    root = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(1)
    for part, n in (("train", 200), ("t10k", 50)):
        _write_idx(root / f"{part}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(root / f"{part}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


def test_a_user_is_built_from_its_id_in_its_rotation_group(peer: ModuleType,
                                                          fake_fashion: Path) -> None:
    users = peer.Users(fake_fashion, seed=0)
    x, y = users.arrays(5, "train")
    x_test, y_test = users.arrays(5, "test")
    assert x.shape == (40, 784) and x.dtype == np.float32 and y.shape == (40,)
    assert x_test.shape == (10, 784) and y_test.shape == (10,)
    assert x.min() >= 0.0 and x.max() <= 1.0
    # Same id, same data: nothing is kept per user, so a user is rebuilt identically.
    again, _ = peer.Users(fake_fashion, seed=0).arrays(5, "train")
    np.testing.assert_array_equal(x, again)
    # A held-out image is never trained on, in any group.
    train = {i for g in users.order["train"] for i in g.tolist()}
    assert train.isdisjoint({i for g in users.order["test"] for i in g.tolist()})
    # User u is in group u % 4: its images are turned by 90 * (u % 4) degrees.
    index = users.order["train"][1][:40]
    turned = np.rot90(users.images[index], k=1, axes=(1, 2)).reshape(40, -1) / 255.0
    np.testing.assert_allclose(users.arrays(1, "train")[0], turned, rtol=1e-6)


def test_the_jobs_are_pfl_at_each_process_count_then_the_plain_loop(peer: ModuleType) -> None:
    args = peer.parse_args(["--users", "1000", "10000", "--processes", "1", "2"])
    assert peer.jobs(args) == [
        ("pfl", 1000, 1, "each-round"), ("pfl", 1000, 2, "each-round"),
        ("plain", 1000, 1, "each-round"),
        ("pfl", 10000, 1, "each-round"), ("pfl", 10000, 2, "each-round"),
        ("plain", 10000, 1, "each-round"),
    ]
    with pytest.raises(SystemExit):
        peer.parse_args(["--users", "50", "--sampled", "100"])


def _rows(out: Path) -> list[dict]:
    document = json.loads(out.read_text())
    assert document["provenance"]["commit"] and document["provenance"]["cores"] >= 1
    return document["jobs"]


def _check_row(row: dict, rounds: int) -> None:
    assert len(row["round_s"]) == rounds and all(s > 0 for s in row["round_s"])
    assert row["startup_to_round1_end_s"] > row["round_s"][0]
    assert 0.0 <= row["accuracy"] <= 1.0
    assert row["memory"]["rusage_maxrss_mb"] > 0 and row["what_was_measured"]
    assert len(row["machine"]["load_average_before"]) == 3


def test_the_plain_loop_runs_without_pfl(fake_fashion: Path, tmp_path: Path) -> None:
    out = tmp_path / "plain.json"
    subprocess.run([sys.executable, str(SCRIPT), "--users", "200", "--sampled", "20",
                    "--rounds", "2", "--frameworks", "plain", "--data-root", str(fake_fashion),
                    "--out", str(out)], check=True, cwd=ROOT, timeout=120)
    [row] = _rows(out)
    assert (row["framework"], row["users"], row["sampled"], row["processes"]) == (
        "plain", 200, 20, 1)
    _check_row(row, rounds=2)


@pytest.mark.skipif(not PFL_PYTHON.exists(), reason="pfl is not installed in .venv-pfl")
def test_pfl_and_the_plain_loop_measure_the_same_job(fake_fashion: Path,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "scale-pfl.json"
    subprocess.run([str(PFL_PYTHON), str(SCRIPT), "--users", "200", "--sampled", "20",
                    "--rounds", "2", "--processes", "1", "--data-root", str(fake_fashion),
                    "--out", str(out)], check=True, cwd=ROOT, timeout=120)
    rows = _rows(out)
    assert [(r["framework"], r["processes"]) for r in rows] == [("pfl", 1), ("plain", 1)]
    for row in rows:
        _check_row(row, rounds=2)
    assert rows[0]["pfl_version"] == "0.6.0"
