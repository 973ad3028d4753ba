"""IFCA end to end through real Flower simulations on 4-rotation digits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fl_clusters.client_app import build_client_app, client_data_for, register_handlers
from fl_clusters.config import parse_run_config
from fl_clusters.learner import TorchLearner
from fl_clusters.server_app import initial_arrays, train_config
from fl_clusters.strategies import IFCA, cluster_models

ROTATION = {"cluster-structure": "rotation", "num-clusters": 4, "num-rounds": 12}


def test_ifca_recovers_rotations_and_beats_fedavg(federation) -> None:
    ifca = federation({**ROTATION, "strategy": "ifca"})
    fedavg = federation({**ROTATION, "strategy": "fedavg"})
    assert ifca["ari"] >= 0.95, ifca
    assert ifca["num_clusters_found"] == 4
    assert ifca["personalized_accuracy"] >= fedavg["personalized_accuracy"] + 0.1, (
        ifca["personalized_accuracy"],
        fedavg["personalized_accuracy"],
    )
    assert ifca["bytes_sent"] > 3.5 * fedavg["bytes_sent"]  # k models go out, not one
    folder = ifca["_folder"]
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == ROTATION["num-rounds"]
    assert all(r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in rounds)
    assert all(0 < r["seconds"] < ifca["wall_time_s"] for r in rounds)
    models = np.load(folder / "models.npz")
    assert sum(key.startswith("cluster-3/") for key in models.files) > 0


def test_ifca_gradient_averaging_and_weight_sharing(federation) -> None:
    shared = federation(
        {**ROTATION, "strategy": "ifca", "ifca-head-layers": 1, "num-rounds": 12}
    )
    assert shared["ari"] >= 0.9, shared
    models = np.load(shared["_folder"] / "models.npz")
    assert any(key.startswith("shared/") for key in models.files)
    assert not any(key.startswith("cluster-0/body") for key in models.files)
    gradient = federation(
        {**ROTATION, "strategy": "ifca", "ifca-mode": "gradient", "lr": 0.5, "num-rounds": 15}
    )
    assert gradient["ari"] >= 0.9, gradient


class _Faulty(TorchLearner):
    """Partition 3 raises in training; partition 5 returns NaN weights."""

    partition = -1

    def train(self, arrays: ArrayRecord, **kwargs) -> tuple[ArrayRecord, float]:
        if self.partition == 3:
            raise RuntimeError("simulated client crash")
        trained, loss = super().train(arrays, **kwargs)
        if self.partition == 5:
            trained = ArrayRecord(
                {k: Array(np.full(v.shape, np.nan, dtype=np.float32)) for k, v in trained.items()}
            )
        return trained, loss


def test_crashing_and_nan_clients_do_not_stop_the_run(federation) -> None:
    overrides = {**ROTATION, "strategy": "ifca", "num-rounds": 3}

    def learner_fn(context: Context) -> TorchLearner:
        import torch
        from torch.utils.data import TensorDataset

        from fl_clusters.models import build_model

        data = client_data_for(context, overrides)
        learner = _Faulty(
            build_model("mlp", (1, 8, 8), 10),
            TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
            TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        )
        learner.partition = int(context.node_config["partition-id"])
        return learner

    app = register_handlers(ClientApp(), learner_fn)
    summary = federation(overrides, num_clients=8, client_app=app)
    # Both faulty nodes are rejected every round; the run still finishes.
    assert summary["rejected_replies"] == 2 * 3
    assert summary["num_clients"] == 8


def test_ifca_runs_from_a_users_own_server_app(tmp_path) -> None:
    """The one-line swap: IFCA(...) where a ServerApp had FedAvg(...)."""
    overrides = {"num-rounds": 2, "min-nodes": 8}
    out = tmp_path / "clusters.json"
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        settings = parse_run_config(overrides)
        strategy = IFCA(num_clusters=4, min_available_nodes=8)
        result = strategy.start(
            grid=grid,
            initial_arrays=initial_arrays(settings),
            num_rounds=2,
            train_config=train_config(settings),
        )
        models = cluster_models(result)
        out.write_text(json.dumps([sorted(m.keys()) for m in models]))

    run_simulation(app, build_client_app(overrides), num_supernodes=8)
    models = json.loads(out.read_text())
    assert len(models) == 4
    assert models[0] == ["body.1.bias", "body.1.weight", "head.bias", "head.weight"]


@pytest.mark.parametrize("bad", [{"strategy": "nope"}, {"num-clusters": -1}])
def test_bad_run_config_stops_before_any_round(bad: dict) -> None:
    with pytest.raises(ValueError, match="allowed"):
        parse_run_config(bad)
