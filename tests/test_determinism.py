"""Same run config and seed, same result: two simulations with fresh random node ids."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import Federation

COMPARED = ("ari", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "num_clusters_found")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [
    {"strategy": "ifca", "num-clusters": 4},
    {"strategy": "cfl"},
    # FedSoft and FLDC draw among their own known nodes: ordered by key, not by id.
    {"strategy": "fedsoft", "num-clusters": 2},
    {"strategy": "fldc"},
    # Flower's FedAvg, unchanged: the ServerApp lists nodes and replies in key order
    # and seeds Python's random, which FedAvg samples with.
    {"strategy": "fedavg"},
])
def test_two_runs_with_the_same_seed_give_identical_results(
    federation: Federation, strategy: dict[str, Any]
) -> None:
    # fraction-train 0.5: sampling draws positions among the ordered nodes, so the
    # drawn partitions repeat only if the order does (node ids differ per run).
    settings = {**strategy, "num-rounds": 4, "seed": 3, "fraction-train": 0.5}
    first, second = federation(settings, num_clients=8), federation(settings, num_clients=8)
    for field in COMPARED:
        assert first[field] == second[field], field
    models = [np.load(run["_folder"] / "models.npz") for run in (first, second)]
    assert sorted(models[0].files) == sorted(models[1].files)
    for key in models[0].files:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)
