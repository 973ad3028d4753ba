"""The results folder's files are standard JSON."""

from __future__ import annotations

import json

from fl_clusters.results import strict_json


def test_undefined_metrics_become_null_not_nan() -> None:
    summary = {"inter_cluster_accuracy": float("nan"), "cluster_accuracy": [0.9, float("inf")]}
    text = strict_json(summary)
    assert "NaN" not in text and "Infinity" not in text
    # The strict parser rejects the non-standard tokens Python's json would write.
    parsed = json.loads(text, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    assert parsed == {"inter_cluster_accuracy": None, "cluster_accuracy": [0.9, None]}
