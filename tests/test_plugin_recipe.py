"""The user's training recipe through the wrapper: momentum SGD and Adam, strategies' defaults.

examples/quickstart-pytorch-clustered (the quickstart's handlers, dict batches,
6 clients in 2 groups whose labels disagree) runs in process on a loopback grid
with its own train() under SGD with momentum 0.9 and under Adam; IFCA, CFL,
FL+HC, WeCFL and FedEM on their default settings must recover the two groups
within 10 rounds, and ACFL, given a validation split, too.
``pytest -k recipe`` selects these runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.plugin_quickstart import EXAMPLE, app_package, run_server

pytestmark = pytest.mark.usefixtures("server_identity")

NODES = 6
ROUNDS = 10
# The user's recipes: the quickstart's SGD with momentum at its learning rate,
# and Adam at PyTorch's default learning rate.
RECIPES: dict[str, dict[str, Any]] = {
    "sgd-momentum": {"optimizer": "sgd-momentum", "learning-rate": 0.03},
    "adam": {"optimizer": "adam", "learning-rate": 0.001},
}


def run_example(folder: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """One in-process federation of the example; its summary.json."""
    torch.set_num_threads(1)
    config = {"num-server-rounds": ROUNDS, "results-dir": str(folder), **overrides}
    with app_package(EXAMPLE):
        from pytorchexample.client_app import build_client_app
        from pytorchexample.server_app import build_server_app

        run_server(build_server_app(config), build_client_app(config), NODES, {})
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("strategy", ["ifca", "cfl", "flhc", "wecfl", "fedem"])
def test_recipe_recovers_the_groups_on_strategy_defaults(
    strategy: str, recipe: str, tmp_path: Path
) -> None:
    summary = run_example(tmp_path, {"strategy": strategy, **RECIPES[recipe]})
    assert summary["ari"] == 1.0, summary


@pytest.mark.slow
def test_recipe_acfl_takes_its_validation_split_from_the_users_loaders(tmp_path: Path) -> None:
    # Phase 1 (FedAvg over both groups) never levels off here: the global model
    # swings between the groups' labelings, so on its defaults ACFL would cluster
    # only after phase1_rounds=10. Three rounds leave its trials, scored on the
    # held-out 20 %, the rest of the run.
    summary = run_example(tmp_path, {
        "strategy": "acfl", "validation-fraction": 0.2, "acfl-phase1-rounds": 3,
        **RECIPES["sgd-momentum"],
    })
    # A refused or failed trial evaluation leaves one cluster (ARI 0).
    assert summary["num_models"] == 2 and summary["ari"] == 1.0, summary
