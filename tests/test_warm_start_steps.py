"""Warm starts report what the clients' training did, not what the server asked.

A user's own ``train()`` under ``ClusteredClient`` runs its own loop: asked for
100 local steps it may take 13. The reply records the steps taken
(``local-steps-done``) and the server logs them.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_clusters import ClusteredClient
from fl_clusters import protocol as p
from fl_clusters.client.replies import train_reply
from fl_clusters.learner import TorchLearner
from fl_clusters.strategies import IFCA, FedEM

pytestmark = pytest.mark.usefixtures("server_identity")


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def samples(n: int, seed: int = 0) -> TensorDataset:
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32))
    return TensorDataset(x, (x[:, 0] > 0).long())


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1},
                   state=RecordDict(), run_config={})


def warm_start_message(steps: int) -> Message:
    """IFCA's warm-start task: one model, ``local-steps`` = ``steps``."""
    config = ConfigRecord({p.CFG_STEPS: steps, p.CFG_LR: 0.1, p.CFG_BATCH: 8})
    content = RecordDict({p.ARRAYS: ArrayRecord(make_net().state_dict()), p.CONFIG: config})
    return Message(content=content, dst_node_id=7, message_type="train")


@pytest.mark.parametrize(("steps", "epochs", "expected"), [(5, 1, 5), (0, 2, 2 * 13)])
def test_builtin_client_reports_the_steps_it_took(steps: int, epochs: int, expected: int) -> None:
    learner = TorchLearner(make_net(), samples(100), samples(10, 1))
    message = warm_start_message(steps)
    message.content.config_records[p.CONFIG][p.CFG_EPOCHS] = epochs
    reply = train_reply(learner, message, context())
    # 100 samples in batches of 8: 13 steps an epoch.
    assert reply.content.metric_records[p.METRICS][p.M_STEPS_DONE] == expected


def test_wrapped_user_train_reports_its_own_steps_not_the_request() -> None:
    app = ClientApp()
    loaders = (DataLoader(samples(104), batch_size=8), DataLoader(samples(16, 1), batch_size=8))
    clustered = ClusteredClient(app, make_net, lambda ctx: loaders)

    @clustered.train
    def train(msg: Message, ctx: Context) -> Message:
        """The user's loop: one epoch of Adam, whatever the server asked."""
        net = make_net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
        for x, y in loaders[0]:
            optimizer.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        metrics = MetricRecord({"train_loss": 0.5, "num-examples": 104})
        content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    reply = train(warm_start_message(100), context())
    assert reply.content.metric_records[p.METRICS][p.M_STEPS_DONE] == 13
    # The count belongs to the handler's call: an optimizer stepped outside it is not counted.
    outside = torch.optim.SGD(make_net().parameters(), lr=0.1)
    outside.step()
    again = train(warm_start_message(100), context())
    assert again.content.metric_records[p.METRICS][p.M_STEPS_DONE] == 13


class NodesGrid:
    """Just enough of a Grid for node sampling."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


def _warm_start_replies(messages: list[Message], steps: dict[int, int | None]) -> list[Message]:
    replies = []
    for msg in messages:
        node = msg.metadata.dst_node_id
        start = msg.content.array_records[p.ARRAYS]
        shift = np.random.default_rng(node).normal(size=1).astype(np.float32)[0]
        arrays = ArrayRecord({k: type(v).from_numpy_ndarray(v.numpy() + shift * (1 + node % 2))
                              for k, v in start.items()})
        metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5})
        if steps[node] is not None:
            metrics[p.M_STEPS_DONE] = steps[node]
        replies.append(Message(RecordDict({p.ARRAYS: arrays, p.METRICS: metrics}),
                               reply_to=msg))
    return replies


@pytest.mark.parametrize("make", [lambda: IFCA(num_clusters=2), lambda: FedEM(num_clusters=2)],
                         ids=["IFCA", "FedEM"])
def test_warm_start_log_says_what_the_clients_did(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    strategy = make()
    model = ArrayRecord(make_net().state_dict())
    grid = NodesGrid([1, 2, 3, 4])
    messages = list(strategy.configure_train(1, model, ConfigRecord(), grid))  # type: ignore[arg-type]
    assert {m.content.config_records[p.CONFIG][p.CFG_STEPS] for m in messages} == {100}
    steps = {1: 13, 2: 13, 3: 26, 4: None}
    with caplog.at_level(logging.INFO, logger="flwr"):
        packed, _ = strategy.aggregate_train(1, _warm_start_replies(messages, steps))
    assert packed is not None
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "clients ran 13-26 local steps (asked 100); 1 of 4 did not report theirs" in text


def test_a_reply_with_a_bad_step_count_is_rejected() -> None:
    metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5, p.M_STEPS_DONE: -3})
    assert "local-steps-done" in str(p.check_metrics(metrics, p.TRAIN_FIELDS))
