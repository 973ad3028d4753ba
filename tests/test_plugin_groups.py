"""Each strategy, plugged into Flower's quickstart with the documented lines, finds the groups.

The README's client and server diffs are applied to the quickstart's own
ClientApp and ServerApp (benchmarks/plugin_quickstart.py) with the server's strategy
line swapped for the constructor call docs/plugin.md's table gives each strategy
(ACFL: its section's, with a phase 1 shorter than the run); ACFL's client also
takes docs/plugin.md's validation recipe. Each app then runs
6 nodes in two groups whose labels conflict (the example's offline digits), with
the quickstart's own train() (SGD, momentum 0.9) on the strategy's defaults, and
every partition's best model (lowest training loss, as the wrapper chooses) must
be its group's and score far above what one shared model can; a strategy that
cannot give each group a model (FLDC: one global model, its DBSCAN clusters only
choose whom to sample) must say so at its start instead. ``pytest -k plugin_groups`` selects these.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from benchmarks.plugin_quickstart import (
    QUICKSTART_CONFIG,
    plugged_diffs,
    proximal_recipe,
    run_app,
    write_app,
)

pytestmark = pytest.mark.usefixtures("server_identity")

NODES = 6
ROUNDS = 10
# One model serves both groups at most half the time on average (their labels
# disagree on every digit): FedAvg here fits one group (0.93-0.97) and fails the
# other (0.00-0.02), a mean of 0.48.
FEDAVG_MEAN = 0.48
# Strategies that cannot give each group its own model: the warning their start-up
# logs instead.
CANNOT = {"FLDC": "FLDC trains one global model for all nodes"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["IFCA", "CFL", "ACFL", "FedSoft", "FLDC", "FLHC", "WeCFL", "FedEM"]
)
def test_plugged_strategy_finds_the_groups_in_the_quickstart(
    strategy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.set_num_threads(1)
    caplog.set_level(logging.WARNING)
    folder = write_app(tmp_path, plugged_diffs(strategy))
    config = {**QUICKSTART_CONFIG, "num-server-rounds": ROUNDS, "validation-fraction": 0.2}
    outcome = run_app(folder, NODES, config)
    if strategy in CANNOT:
        assert CANNOT[strategy] in caplog.text
        return
    groups, chosen, accuracy = outcome.groups, outcome.chosen, outcome.accuracy
    assert adjusted_rand_score(groups, chosen) == 1.0, (groups, chosen, accuracy)
    # Every partition is served (FedAvg leaves one group near 0) and the mean is far
    # above FedAvg's.
    assert min(accuracy) >= 0.5 and np.mean(accuracy) >= FEDAVG_MEAN + 0.15, accuracy


def test_fedsoft_plugs_in_with_the_documented_proximal_recipe(tmp_path: Path) -> None:
    task_diff, _ = proximal_recipe()
    folder = write_app(tmp_path, plugged_diffs("FedSoft"))
    client = (folder / "pytorchexample" / "client_app.py").read_text()
    task = (folder / "pytorchexample" / "task.py").read_text()
    # The regularizer goes in as the last argument of the quickstart's own call; the
    # example's train() has what the recipe's task.py diff adds: the argument, and the
    # term backpropagated, not reported.
    assert "        device,\n        regularizer=clustered.regularizer,\n    )" in client
    added = [line[1:].strip() for line in task_diff.splitlines() if line.startswith("+")]
    assert added[0].startswith("def train(") and "regularizer=lambda net: 0.0" in added[0]
    assert "regularizer: Callable[[nn.Module], Any] = lambda net: 0.0," in task
    assert added[1] in task
    compile(client, "client_app.py", "exec")
    assert len(plugged_diffs("IFCA")) == 2
