"""README's plug-in snippet, applied as printed to Flower's quickstart-pytorch, finds the groups.

The README's "Plug into your own Flower app" section holds two diffs (client,
server). They are applied line for line to Flower's quickstart ClientApp and
ServerApp (benchmarks/plugin_quickstart.py), on the example's offline task (digits,
two client groups whose labels disagree, the quickstart's SGD with momentum),
and the patched apps run a whole federation in process, then save one model
per cluster that the quickstart's ``Net`` loads.
"""

from __future__ import annotations

import csv
import importlib
import json
from pathlib import Path

import pytest
import torch
from sklearn.metrics import adjusted_rand_score

import fl_clusters.strategies
from benchmarks.plugin_quickstart import (
    app_package,
    apply_diff,
    plugin_table_constructors,
    readme_diffs,
    run_app,
    run_server,
    write_app,
)
from benchmarks.quickstart_pytorch import QUICKSTART_CLIENT, QUICKSTART_CONFIG
from fl_clusters.config import parse_run_config
from fl_clusters.strategies.kit.registry import strategy_names
from fl_clusters.strategy_builder import build_strategy

pytestmark = pytest.mark.usefixtures("server_identity")

NODES = 6


def test_plugin_table_lists_every_strategy_with_working_constructor_calls() -> None:
    from flwr.serverapp.strategy import FedAvg, FedMedian, FedProx

    namespace = {**vars(fl_clusters.strategies), "FedAvg": FedAvg, "FedProx": FedProx,
                 "FedMedian": FedMedian}
    documented = [type(eval(call, namespace)) for call in plugin_table_constructors()]
    assert len(documented) == len(set(documented)), documented
    # Every strategy the run config can name, as fl-clusters' own app builds it
    # (Flower's FedAvg, FedProx and FedMedian inside their FlowerBaseline wrapper).
    built = [build_strategy({**parse_run_config({"strategy": name}), "min-available-nodes": 2})
             for name in strategy_names()]
    offered = {type(getattr(strategy, "flower", strategy)) for strategy in built}
    assert set(documented) == offered


def test_readme_has_a_client_and_a_server_diff() -> None:
    diffs = readme_diffs()
    assert len(diffs) == 2, diffs
    assert "+@clustered.train" in diffs[0] and "+@clustered.evaluate" in diffs[0]
    assert "+    strategy = IFCA(" in diffs[1]


def test_apply_diff_fails_on_a_line_the_quickstart_lacks() -> None:
    with pytest.raises(ValueError, match="matches no line"):
        apply_diff(QUICKSTART_CLIENT, " app = ClientApp(mods=[])\n+clustered = None\n")


def test_readme_snippet_turns_quickstart_into_a_clustered_run(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    # The quickstart saves its final model to the working directory: tmp_path.
    outcome = run_app(write_app(tmp_path, readme_diffs()), NODES, QUICKSTART_CONFIG)
    # The README's saving lines write one file per cluster that the app's own Net
    # loads as it is (strict: no packed "cluster-<j>/" names; run_app loads each).
    assert [path.name for path in outcome.models] == ["final_model_0.pt", "final_model_1.pt"]
    # Each node's model: the lowest training loss, as the wrapper chooses.
    chosen, accuracy = outcome.chosen, outcome.accuracy
    assert adjusted_rand_score(outcome.groups, chosen) == 1.0, (outcome.groups, chosen)
    # One model for both groups cannot pass 0.5 on both (their labels disagree).
    assert min(accuracy) >= 0.8, accuracy
    # The README's last line writes the library's results folder: each partition's
    # cluster is the model that node chose.
    with (tmp_path / "results" / "assignments.csv").open() as rows:
        written = {int(row["partition_id"]): int(row["assigned_cluster"])
                   for row in csv.DictReader(rows)}
    assert written == dict(enumerate(chosen)), (written, chosen)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["strategy"] == "ifca" and len(summary["assignment_history"]) == 6


def test_a_train_that_raises_stops_the_run_with_the_users_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_app(tmp_path, readme_diffs())
    monkeypatch.chdir(tmp_path)

    def failing_train(*args: object) -> float:
        raise RuntimeError("CUDA out of memory (the user's train)")

    with app_package(folder):
        client_app = importlib.import_module("pytorchexample.client_app")
        server_app = importlib.import_module("pytorchexample.server_app")
        monkeypatch.setattr(client_app, "train_fn", failing_train)
        # The strategy's failure policy (max_failed_rounds=3) ends the run with the
        # clients' own reason, instead of returning models nobody trained.
        with pytest.raises(RuntimeError, match=r"3 training rounds in a row without one "
                           r"valid reply.*CUDA out of memory \(the user's train\)"):
            run_server(server_app.app, client_app.app, NODES, QUICKSTART_CONFIG)
    assert not list(tmp_path.glob("final_model*.pt"))


def test_forgetting_clustered_evaluate_fails_when_the_app_loads(tmp_path: Path) -> None:
    client, server = readme_diffs()
    without = "\n".join(line for line in client.splitlines() if line != "+@clustered.evaluate")
    folder = write_app(tmp_path, [without, server])
    with app_package(folder), pytest.raises(ValueError) as error:
        importlib.import_module("pytorchexample.client_app")
    message = str(error.value)
    assert "handler 'evaluate' is not wrapped by ClusteredClient" in message
    assert "Put @clustered.evaluate directly under @app.evaluate()" in message


def test_cluster_assignments_name_each_nodes_partition_round_by_round() -> None:
    strategy = fl_clusters.strategies.IFCA(num_clusters=2)
    strategy.assignment_history = {1: {70: 1, 50: 0, 9: 0}, 2: {70: 0, 50: 1, 9: 0}}
    strategy.nodes.partitions.update({70: 0, 50: 1})
    rows = strategy.cluster_assignments()
    # Round, then partition; a node whose config has no partition-id comes last.
    assert [tuple(row) for row in rows] == [
        (1, 70, 0, 1), (1, 50, 1, 0), (1, 9, None, 0),
        (2, 70, 0, 0), (2, 50, 1, 1), (2, 9, None, 0),
    ]
    assert rows[0]._asdict() == {"round": 1, "node_id": 70, "partition_id": 0, "cluster": 1}


def test_plugin_results_refuse_a_strategy_that_keeps_no_clusters(tmp_path: Path) -> None:
    from flwr.serverapp.strategy import FedAvg, Result

    from fl_clusters.results import write_plugin_results

    with pytest.raises(TypeError, match=r"needs an fl-clusters strategy .* got FedAvg"):
        write_plugin_results(tmp_path, None, FedAvg(), Result(), 3)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())
