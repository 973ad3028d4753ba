"""pytorchexample: the quickstart's ClientApp, served to clustered strategies.

The handlers are the quickstart's: the app's own model, data loaders, ``train``
(SGD with momentum) and ``test``. The fl-clusters lines are marked; they wrap the
handlers so that a clustered message reaches them as a plain FedAvg one (the
cluster model this node fits best under ``"arrays"``, the server's config as
sent) and their reply tells the server which cluster the node trained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_clusters import ClusteredClient  # fl-clusters
from pytorchexample.task import Net, group_of, load_data, load_validation, run_config
from pytorchexample.task import test as test_fn
from pytorchexample.task import train as train_fn


def train_on_local_data(
    msg: Message, context: Context, cfg: Mapping[str, Any],
    regularizer: Callable[[torch.nn.Module], Any],
) -> Message:
    """The quickstart's train handler: train the received model on this node's data.

    ``regularizer(net)`` joins the loss (FedProx's and FedSoft's proximal term).
    """
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    trainloader, _ = load_data(
        partition_id, num_partitions, cfg["batch-size"], cfg["validation-fraction"]
    )

    train_loss = train_fn(
        model, trainloader, cfg["local-epochs"], msg.content["config"]["lr"], device,
        cfg["optimizer"], regularizer=regularizer,
    )

    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)


def evaluate_on_local_data(msg: Message, context: Context, cfg: Mapping[str, Any]) -> Message:
    """The quickstart's evaluate handler: score the received model on this node's data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model.to(device)

    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, valloader = load_data(partition_id, num_partitions, cfg["batch-size"])

    eval_loss, eval_acc = test_fn(model, valloader, device)

    metrics = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(valloader.dataset),
    }
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def build_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """The ClientApp; ``overrides`` win over the run config (for ``run_simulation``)."""
    app = ClientApp()

    def loaders(context: Context):  # fl-clusters: this node's loaders
        cfg = run_config(context, overrides)
        node = context.node_config
        args = (node["partition-id"], node["num-partitions"], cfg["batch-size"],
                cfg["validation-fraction"])
        train, test = load_data(*args)
        if cfg["validation-fraction"] == 0:
            return train, test
        # ACFL scores its trials on data that train() holds out.
        return train, load_validation(*args), test

    def report(context: Context) -> dict[str, int]:  # fl-clusters: ground truth, report only
        return {"group": group_of(context.node_config["partition-id"])}

    clustered = ClusteredClient(app, Net, loaders, metadata_fn=report)  # fl-clusters

    @app.train()
    @clustered.train  # fl-clusters
    def train(msg: Message, context: Context) -> Message:
        """Train the model on local data."""
        return train_on_local_data(
            msg, context, run_config(context, overrides),
            regularizer=clustered.regularizer,  # fl-clusters: FedProx/FedSoft proximal term
        )

    @app.evaluate()
    @clustered.evaluate  # fl-clusters
    def evaluate(msg: Message, context: Context) -> Message:
        """Evaluate the model on local data."""
        return evaluate_on_local_data(msg, context, run_config(context, overrides))

    return app


app = build_client_app()
