"""The run-config key ``optimizer``: the built-in learner trains with a user's recipe."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.client.task import sgd_settings
from fl_clusters.config import parse_run_config
from fl_clusters.learner import TorchLearner
from fl_clusters.models import model_to_arrays
from fl_clusters.optimizers import optimizer_for
from fl_clusters.server_app import train_config


def _learner() -> TorchLearner:
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return TorchLearner(net, TensorDataset(x, y), TensorDataset(x, y))


def test_each_name_builds_its_optimizer() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_for("sgd", 0.1) is None
    momentum = optimizer_for("sgd-momentum", 0.05)(params)  # type: ignore[misc]
    assert isinstance(momentum, torch.optim.SGD)
    assert momentum.defaults["momentum"] == 0.9 and momentum.defaults["lr"] == 0.05
    adam = optimizer_for("adam", 0.001)(params)  # type: ignore[misc]
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["lr"] == 0.001
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'"):
        optimizer_for("rmsprop", 0.1)


def test_the_key_is_validated_and_sent_with_every_training_task() -> None:
    with pytest.raises(ValueError, match="run-config key 'optimizer' must be one of"):
        parse_run_config({"optimizer": "rmsprop"})
    settings = parse_run_config({"optimizer": "adam", "lr": 0.001})
    config = train_config(settings)
    assert config[p.CFG_OPTIMIZER] == "adam"
    # Plain SGD, the protocol's default, is not sent at all.
    assert p.CFG_OPTIMIZER not in train_config(parse_run_config({}))
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 0},
                      state=RecordDict(), run_config={})
    built = sgd_settings(ConfigRecord(dict(config)), context)["optimizer_fn"]
    assert isinstance(built([torch.nn.Parameter(torch.zeros(1))]), torch.optim.Adam)


@pytest.mark.parametrize("name", ["sgd-momentum", "adam"])
def test_another_optimizer_trains_differently_and_learns(name: str) -> None:
    start = model_to_arrays(_learner().model)
    lr = 0.05 if name == "sgd-momentum" else 0.01
    plain, _ = _learner().train(start, lr=lr, batch_size=8, steps=20, seed=0)
    other, loss = _learner().train(start, lr=lr, batch_size=8, steps=20, seed=0,
                                   optimizer_fn=optimizer_for(name, lr))
    assert any((plain[k].numpy() != other[k].numpy()).any() for k in plain)
    loss_before, _ = _learner().evaluate(start, "test")
    loss_after, _ = _learner().evaluate(other, "test")
    assert loss_after < loss_before
    assert loss > 0
