"""The results folder's files are standard JSON, and its models are checked when read."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import Result

from fl_clusters.config import parse_run_config
from fl_clusters.files import strict_json
from fl_clusters.results import load_models, write_results


def test_undefined_metrics_become_null_not_nan() -> None:
    summary = {"inter_cluster_accuracy": float("nan"), "cluster_accuracy": [0.9, float("inf")]}
    text = strict_json(summary)
    assert "NaN" not in text and "Infinity" not in text
    # The strict parser rejects the non-standard tokens Python's json would write.
    parsed = json.loads(text, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    assert parsed == {"inter_cluster_accuracy": None, "cluster_accuracy": [0.9, None]}


@pytest.fixture
def results(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A results folder written by write_results, and the models it holds."""
    models = {"c0.w": np.arange(6, dtype=np.float32).reshape(2, 3), "c1.w": np.full(3, np.nan)}
    result = Result(arrays=ArrayRecord({key: Array(value) for key, value in models.items()}))
    grid = SimpleNamespace(sent={}, received={})
    write_results(tmp_path, parse_run_config({"num-rounds": 1}), result, grid,  # type: ignore[arg-type]
                  [], {"per_client_accuracy": []})
    return tmp_path, models


def test_models_read_back_as_written_and_nothing_else_is_left(
    results: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder, models = results
    loaded = load_models(folder)
    assert list(loaded) == list(models)
    for key, value in models.items():
        np.testing.assert_array_equal(loaded[key], value, err_msg=key)
    assert not [name for name in os.listdir(folder) if name.endswith(".partial")]


def test_damaged_models_are_refused(results: tuple[Path, dict[str, np.ndarray]]) -> None:
    folder, _ = results
    models, summary = folder / "models.npz", folder / "summary.json"
    original = models.read_bytes()
    flipped = bytearray(original)
    flipped[len(original) // 2] ^= 0xFF
    models.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=r"models\.npz is damaged: checksum mismatch"):
        load_models(folder)
    models.write_bytes(original)
    unchecked = {k: v for k, v in json.loads(summary.read_text()).items() if k != "models_sha256"}
    summary.write_text(json.dumps(unchecked))
    with pytest.raises(ValueError, match="records no models_sha256"):
        load_models(folder)


def test_models_that_need_a_pickle_are_refused_even_with_a_matching_checksum(
    results: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder, _ = results
    models, summary = folder / "models.npz", folder / "summary.json"
    np.savez(models, allow_pickle=True, c0=np.array([{"any": "object"}], dtype=object))
    digest = hashlib.sha256(models.read_bytes()).hexdigest()
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "models_sha256": digest}))
    with pytest.raises(ValueError, match="is not plain arrays") as refused:
        load_models(folder)
    assert "\n" not in str(refused.value)
