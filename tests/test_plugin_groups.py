"""Each strategy, plugged into Flower's quickstart with the documented lines, finds the groups.

The README's client and server diffs are applied to the quickstart's own
ClientApp and ServerApp (tests/plugin_quickstart.py) with the server's strategy
line swapped for the constructor call docs/plugin.md's table gives each strategy
(ACFL: its section's, with a phase 1 shorter than the run); ACFL's client also
takes docs/plugin.md's validation recipe. Each app then runs
6 nodes in two groups whose labels conflict (the example's offline digits), with
the quickstart's own train() (SGD, momentum 0.9) on the strategy's defaults, and
every partition's best model (lowest training loss, as the wrapper chooses) must
be its group's and score far above what one shared model can; a strategy that
cannot tell two groups of 3 nodes apart on its defaults (FLDC: DBSCAN's MinPts
4) must say so at its start instead. ``pytest -k plugin_groups`` selects these.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from tests.plugin_quickstart import (
    QUICKSTART_CLIENT,
    QUICKSTART_CONFIG,
    ROOT,
    app_package,
    run_server,
)
from tests.test_plugin_readme import (
    apply_diff,
    plugin_table_constructors,
    readme_diffs,
    write_app,
)

pytestmark = pytest.mark.usefixtures("server_identity")

NODES = 6
ROUNDS = 10
README_STRATEGY = "IFCA(num_clusters=2, fraction_evaluate=fraction_evaluate)"
README_LOADERS = '''+def loaders(context):  # this node's (train, test) loaders
+    node = context.node_config
+    return load_data(node["partition-id"], node["num-partitions"],
+                     context.run_config["batch-size"])'''
TRAIN_HANDLER = " def train(msg: Message, context: Context):"
QUICKSTART_TRAIN_DATA = "    trainloader, _ = load_data(partition_id, num_partitions, batch_size)"
# One model serves both groups at most half the time on average (their labels
# disagree on every digit): FedAvg here fits one group (0.93-0.97) and fails the
# other (0.00-0.02), a mean of 0.48.
FEDAVG_MEAN = 0.48
# Strategies that cannot find two groups of 3 nodes on their defaults: the
# warning their start-up logs instead.
CANNOT = {"FLDC": "a group of fewer than 4 nodes cannot form its own DBSCAN cluster"}


def documented_call(strategy: str) -> str:
    """docs/plugin.md's constructor call for ``strategy``, with the quickstart's argument.

    ACFL's is its section's (a phase 1 that ends within the run), the others' the table's.
    """
    if strategy == "ACFL":
        text = (ROOT / "docs" / "plugin.md").read_text()
        found = re.search(r"^strategy = (ACFL\(.*\))$", text, flags=re.M)
        assert found is not None, "docs/plugin.md shows no `strategy = ACFL(...)` line"
        return found.group(1)
    call = next(c for c in plugin_table_constructors() if c.startswith(f"{strategy}("))
    arguments = call[len(strategy) + 1:-1]
    return f"{strategy}({arguments + ', ' if arguments else ''}fraction_evaluate=fraction_evaluate)"


def acfl_client(client: str) -> str:
    """The README's client diff with docs/plugin.md's ACFL validation recipe in it."""
    text = (ROOT / "docs" / "plugin.md").read_text()
    section = text[text.index("### ACFL: a validation loader"):]
    recipe = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert recipe is not None, "docs/plugin.md's ACFL section has no python block"
    assert README_LOADERS in client, "the README's loaders changed: update this test"
    plus = "\n".join(f"+{line}" for line in recipe.group(1).rstrip("\n").splitlines())
    # The train handler trains on the recipe's train loader, as the docs say.
    assert TRAIN_HANDLER in client, "the README's train handler changed: update this test"
    handler = (f"{TRAIN_HANDLER}\n ...\n-{QUICKSTART_TRAIN_DATA}\n"
               "+    trainloader, _, _ = loaders(context)")
    return client.replace(README_LOADERS, plus).replace(TRAIN_HANDLER, handler)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy", ["IFCA", "CFL", "ACFL", "FedSoft", "FLDC", "FLHC", "WeCFL", "FedEM"]
)
def test_plugged_strategy_finds_the_groups_in_the_quickstart(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.set_num_threads(1)
    caplog.set_level(logging.WARNING)
    client, server = readme_diffs()
    assert README_STRATEGY in server, "the README's strategy line changed: update this test"
    server = server.replace(README_STRATEGY, documented_call(strategy)).replace(
        "import IFCA, cluster_models", f"import {strategy}, cluster_models")
    if strategy == "ACFL":
        client = acfl_client(client)
    folder = write_app(tmp_path, [client, server])
    monkeypatch.chdir(tmp_path)
    config = {**QUICKSTART_CONFIG, "num-server-rounds": ROUNDS, "validation-fraction": 0.2}
    with app_package(folder):
        client_app = importlib.import_module("pytorchexample.client_app")
        server_app = importlib.import_module("pytorchexample.server_app")
        task = importlib.import_module("pytorchexample.task")
        run_server(server_app.app, client_app.app, NODES, config)
        nets = []
        for path in sorted(tmp_path.glob("final_model_*.pt")):
            nets.append(task.Net())
            nets[-1].load_state_dict(torch.load(path))
        chosen, accuracy = [], []
        for partition in range(NODES):
            train, test = task.load_data(partition, NODES, 64)
            losses = [task.test(net, train, torch.device("cpu"))[0] for net in nets]
            chosen.append(int(np.argmin(losses)))
            accuracy.append(task.test(nets[chosen[-1]], test, torch.device("cpu"))[1])
        groups = [task.group_of(partition) for partition in range(NODES)]
    if strategy in CANNOT:
        assert CANNOT[strategy] in caplog.text
        return
    assert adjusted_rand_score(groups, chosen) == 1.0, (groups, chosen, accuracy)
    # Every partition is served (FedAvg leaves one group near 0) and the mean is far
    # above FedAvg's.
    assert min(accuracy) >= 0.5 and np.mean(accuracy) >= FEDAVG_MEAN + 0.15, accuracy


def test_fedsoft_handler_diff_applies_to_the_quickstart() -> None:
    text = (ROOT / "docs" / "plugin.md").read_text()
    section = text[text.index("### FedProx / FedSoft proximal term"):]
    task_diff, handler_diff = re.findall(r"```diff\n(.*?)```", section, flags=re.S)[:2]
    assert "+def train(net, trainloader, epochs, lr, device, regularizer=" in task_diff
    client = apply_diff(apply_diff(QUICKSTART_CLIENT, readme_diffs()[0]), handler_diff)
    # The regularizer goes in as the last argument of the quickstart's own call.
    assert "        device,\n        regularizer=clustered.regularizer,\n    )" in client
    compile(client, "client_app.py", "exec")
