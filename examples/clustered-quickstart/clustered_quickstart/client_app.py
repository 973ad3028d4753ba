"""ClientApp: the app's model and data, served by fl-clusters' message handlers.

The whole client-side addition is the ``register_handlers`` call at the bottom:
it adds train/evaluate handlers that speak both Flower's FedAvg protocol (one
model under ``arrays``) and fl-clusters' (k cluster models under ``clusters``,
the client picks the one with the lowest training loss), plus the queries that
clustered strategies and the final report use. The app only says how to build
its learner (model + local data) from the node's context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp

from clustered_quickstart.task import build_model, group_of, load_partition, settings
from fl_clusters.client.node_data import node_partition
from fl_clusters.client_app import register_handlers
from fl_clusters.learner import TorchLearner


def make_learner(context: Context, overrides: Mapping[str, Any] | None = None) -> TorchLearner:
    """This node's model and data, from its node config and the run config.

    Raises a ``ValueError`` naming the node config key when ``partition-id`` or
    ``num-partitions`` is missing or out of range (``deploy/check_node.py`` calls
    this before a SuperNode starts).
    """
    cfg = settings(context.run_config, overrides)
    partition_id, num_partitions = node_partition(context)
    train_set, test_set = load_partition(
        partition_id, num_partitions, int(cfg["samples-per-client"]), int(cfg["seed"])
    )
    return TorchLearner(build_model(int(cfg["seed"])), train_set, test_set)


def report_metadata(context: Context) -> dict[str, int]:
    """Ground truth for the final report only (the server scores the clustering)."""
    partition_id, _ = node_partition(context)
    return {"group": group_of(partition_id), "partition-id": partition_id}


def build_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """The ClientApp; ``overrides`` win over the run config (for ``run_simulation``)."""
    client_app = ClientApp()
    # The client-side addition: fl-clusters' handlers on this app's learner.
    register_handlers(
        client_app, lambda context: make_learner(context, overrides), report_metadata
    )
    return client_app


app = build_client_app()
