"""Behaviour pinned: a short seeded run of every strategy and option, against its summary.

``tests/data/golden.json`` holds what each run gave when it was recorded (before the
layout of fl_clusters/ was reshaped); a change that alters any of these numbers alters
what the library computes. Record anew only for a change meant to alter results:

    FLC_RECORD_GOLDEN=1 python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Federation

GOLDEN = Path(__file__).parent / "data" / "golden.json"
RECORD = os.environ.get("FLC_RECORD_GOLDEN") == "1"

# 8 clients in 4 groups, 3 rounds: short, and long enough for every strategy's
# clustering step (CFL's split, FL+HC's and WeCFL's one-shot clustering) to act.
COMMON = {"num-rounds": 3, "seed": 1, "local-steps": 5, "num-groups": 4}
OPTIONS: dict[str, dict[str, Any]] = {
    "ifca": {"strategy": "ifca", "num-clusters": 4},
    "cfl": {"strategy": "cfl", "cfl-warmup-rounds": 1},
    "acfl": {"strategy": "acfl", "acfl-phase1-rounds": 1},
    "fedsoft": {"strategy": "fedsoft", "num-clusters": 2, "fedsoft-clients-per-cluster": 2},
    "fldc": {"strategy": "fldc", "fldc-min-pts": 2},
    "flhc": {"strategy": "flhc", "flhc-warmup-rounds": 1},
    "wecfl": {"strategy": "wecfl", "num-clusters": 4},
    "fedem": {"strategy": "fedem", "num-clusters": 2, "fedem-init-steps": 5},
    "local": {"strategy": "local"},
    "fedavg": {"strategy": "fedavg"},
    "fedprox": {"strategy": "fedprox", "proximal-mu": 0.1},
    "awcfl-beta": {"strategy": "ifca", "num-clusters": 4, "awcfl-beta": 0.3},
    "mcfl": {"strategy": "ifca", "num-clusters": 4, "mcfl": True},
}
# What a run computes: accuracies, the clustering found, its agreement with the
# truth, and the traffic. Floats are kept to 9 digits (the JSON round trip).
FIELDS = ("personalized_accuracy", "per_client_accuracy", "cluster_accuracy", "ari", "nmi",
          "num_clusters_found", "num_cluster_models", "assignment_history", "bytes_sent",
          "bytes_received")
OPTIONAL = {"assignment_history"}  # Flower's FedAvg and FedProx keep no clusters


def pinned(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's fields that behaviour fixes, floats rounded to 9 digits."""
    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return round(value, 9)
        if isinstance(value, list):
            return [rounded(item) for item in value]
        if isinstance(value, dict):
            return {key: rounded(item) for key, item in value.items()}
        return value

    missing = [field for field in FIELDS if field not in summary and field not in OPTIONAL]
    assert not missing, f"summary.json lacks {missing}"
    return {field: rounded(summary.get(field)) for field in FIELDS}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_golden_summary_of_a_short_seeded_run(federation: Federation, option: str) -> None:
    got = pinned(federation({**COMMON, **OPTIONS[option]}, num_clients=8))
    recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if RECORD:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps({**recorded, option: got}, indent=1, sort_keys=True))
        return
    assert option in recorded, f"no golden summary for {option}: record with FLC_RECORD_GOLDEN=1"
    assert got == recorded[option]
