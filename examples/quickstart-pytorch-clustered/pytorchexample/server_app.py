"""pytorchexample: the quickstart's ServerApp with a clustered strategy in FedAvg's place.

Run-config key ``strategy`` names any strategy of
``fl_clusters.strategies.kit.registry.strategy_names()`` (``fedavg``, ``ifca``, ``cfl``...);
fl-clusters run-config keys the app does not use itself (``num-clusters``,
``cfl-eps1``...) go to the strategy. In your own app, the strategy line is all
that changes: ``strategy = IFCA(num_clusters=2, fraction_evaluate=...)``.
After training every node scores the final model(s) on its test split; with
``results-dir`` set, summary.json and the models are written there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy
from sklearn.metrics import adjusted_rand_score

from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.strategies.kit.results import cluster_models
from fl_clusters.strategy_builder import build_strategy
from pytorchexample.task import Net, load_centralized_dataset, run_config, test

# The app's own keys; fl-clusters has keys of the same name for its own ClientApp.
APP_KEYS = {"num-server-rounds", "fraction-evaluate", "local-epochs", "learning-rate",
            "optimizer", "batch-size", "validation-fraction", "results-dir"}


def make_strategy(cfg: Mapping[str, Any]) -> Strategy:
    """The strategy run-config key ``strategy`` names, with its fl-clusters keys."""
    names = set(config_keys()) - APP_KEYS
    strategy_keys = {k: v for k, v in cfg.items() if k in names}
    settings = parse_run_config({"strategy": cfg["strategy"], **strategy_keys})
    strategy = build_strategy(settings)
    strategy.fraction_evaluate = cfg["fraction-evaluate"]  # type: ignore[attr-defined]
    return strategy


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate one model on central data (clustered strategies call it per cluster)."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)
    test_loss, test_acc = test(model, load_centralized_dataset(), device)
    return MetricRecord({"accuracy": test_acc, "loss": test_loss})


def final_report(grid: Grid, result: Result) -> list[dict[str, Any]]:
    """Every node's test accuracy with the model it picks (lowest training loss).

    Under FedEM the accuracy is the node's mixture's; its cluster stays the model
    with the lowest training loss.
    """
    messages = [
        Message(
            RecordDict({"clusters": result.arrays, "config": ConfigRecord()}),
            dst_node_id=node,
            message_type="query.report",
        )
        for node in sorted(grid.get_node_ids())
    ]
    rows = []
    for reply in grid.send_and_receive(messages):
        if reply.has_error():
            raise RuntimeError(f"node {reply.metadata.src_node_id}: {reply.error.reason}")
        metrics = reply.content.metric_records["metrics"]
        chosen = int(np.argmin(metrics["train-loss"]))
        # FedEM: a node predicts with its mixture of every model, not with one.
        accuracy = metrics.get("mixture-accuracy", metrics["test-accuracy"][chosen])  # type: ignore[index]
        rows.append(
            {"group": int(metrics["group"]), "cluster": chosen, "accuracy": float(accuracy)}  # type: ignore[arg-type]
        )
    return sorted(rows, key=lambda row: (row["group"], row["cluster"]))


def save(folder: Path, cfg: Mapping[str, Any], result: Result, rows: list[dict]) -> None:
    """Write summary.json and one state dict per cluster model."""
    folder.mkdir(parents=True, exist_ok=True)
    for j, model in enumerate(cluster_models(result)):
        torch.save(model.to_torch_state_dict(), folder / f"final_model_{j}.pt")
    last = max(result.evaluate_metrics_serverapp, default=None)
    summary = {
        "strategy": cfg["strategy"],
        "num_models": len(cluster_models(result)),
        "ari": adjusted_rand_score([r["group"] for r in rows], [r["cluster"] for r in rows]),
        "per_client_accuracy": [r["accuracy"] for r in rows],
        "groups": [r["group"] for r in rows],
        "clusters": [r["cluster"] for r in rows],
        "central": dict(result.evaluate_metrics_serverapp[last]) if last is not None else {},
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"{cfg['strategy']}: {summary}", flush=True)


def build_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """The ServerApp; ``overrides`` win over the run config (for ``run_simulation``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        """Main entry point for the ServerApp."""
        cfg = run_config(context, overrides)
        strategy = make_strategy(cfg)
        # One initial model for every run of the app: the same config, the same run.
        torch.manual_seed(0)
        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(Net().state_dict()),
            # The app's handlers read their run config; fl-clusters' own learner,
            # which trains FedEM's components, reads these keys.
            train_config=ConfigRecord(
                {
                    "lr": cfg["learning-rate"],
                    "local-epochs": cfg["local-epochs"],
                    "batch-size": cfg["batch-size"],
                }
            ),
            num_rounds=cfg["num-server-rounds"],
            evaluate_fn=global_evaluate,
        )
        save(Path(cfg["results-dir"] or "."), cfg, result, final_report(grid, result))

    return app


app = build_server_app()
