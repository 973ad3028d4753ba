"""The built-in ClientApp's data and learners, for the nodes a process served last.

A simulation actor serves many nodes in turn, one message at a time. A node's
partition and learner are built from the federation's plan (computed once per
process) on its message and kept for the :data:`NODES_KEPT` nodes served last;
nodes of one architecture share one model, into which each call loads the weights
it is sent. A learner holds nothing a node keeps between rounds (that lives in
Flower's ``context.state``), so building it again gives the same results. They are
kept for one run: an actor that serves the runs of a sweep in turn
(:func:`fl_clusters.ray_pool.actors_kept_between_runs`) drops a run's nodes when
the next run's first message arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from torch.utils.data import TensorDataset

from fl_clusters.client.queries import TEST_GROUPS
from fl_clusters.config import cached_run_config, partition_settings
from fl_clusters.data import ClientData, load_client_data, load_dataset
from fl_clusters.data.client_data import train_mixture
from fl_clusters.data.partition import cached_plan
from fl_clusters.learner import TorchLearner, resolve_device
from fl_clusters.models import build_model


def node_partition(context: Context) -> tuple[int, int]:
    """Read and check this node's ``partition-id`` and ``num-partitions``."""
    try:
        partition_id = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as err:
        raise ValueError(
            f"node config lacks {err.args[0]!r}; start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\""
        ) from None
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"node config 'partition-id'={partition_id} is outside [0, {num_partitions - 1}] "
            f"for 'num-partitions'={num_partitions}"
        )
    return partition_id, num_partitions


# How many nodes' partitions and learners a process keeps: the ones it served last.
# Building a node's again only indexes and transforms its samples from the plan the
# process keeps (no partitioning), while keeping every node a process ever served
# holds all their data, on the device too: at 10,000 nodes over two actors, every
# client's. 32 keeps every node of the default 20-node federation and of the tests'
# in every process, and bounds the rest.
NODES_KEPT = 32


@lru_cache(maxsize=NODES_KEPT)
def _client_data(
    dataset: str, data_root: str, partition_id: int, num_partitions: int, partition: tuple
) -> ClientData:
    return load_client_data(
        dataset, data_root or None, partition_id, num_partitions, **dict(partition)
    )


def _data_key(settings: Mapping[str, Any], context: Context) -> tuple[Any, ...]:
    partition_id, num_partitions = node_partition(context)
    return (
        settings["dataset"],
        settings["data-root"],
        partition_id,
        num_partitions,
        tuple(sorted(partition_settings(settings).items())),
    )


_run_of_cached_nodes: list[int] = []


def _forget_other_runs(context: Context) -> None:
    """Drop the nodes cached for another run than ``context``'s."""
    if _run_of_cached_nodes != [context.run_id]:
        _client_data.cache_clear()
        _cached_learner.cache_clear()
        _run_of_cached_nodes[:] = [context.run_id]


def client_data_for(context: Context, overrides: Mapping[str, Any] | None = None) -> ClientData:
    """This node's partition, kept while it is among the process's last :data:`NODES_KEPT`."""
    _forget_other_runs(context)
    settings = cached_run_config({**context.run_config, **(overrides or {})})
    return _client_data(*_data_key(settings, context))


# Every learner call loads the weights it is sent into the model first, and a
# process runs one message at a time, so nodes of one architecture share a model.
@lru_cache(maxsize=8)
def _shared_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, device: str
) -> torch.nn.Module:
    return build_model(name, input_shape, num_classes).to(device)  # type: ignore[arg-type]


@lru_cache(maxsize=NODES_KEPT)
def _cached_learner(
    data_key: tuple[Any, ...], model_name: str, device: str, threads: int
) -> TorchLearner:
    # Threads follow the simulation's client resources (one CPU per client by default);
    # more torch threads than the actor's CPUs oversubscribe the cores.
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    data = _client_data(*data_key)
    num_classes = load_dataset(data_key[0], data_key[1] or None).num_classes
    torch_device = resolve_device(device)
    model = _shared_model(model_name, tuple(data.x_train.shape[1:]), num_classes, str(torch_device))
    return TorchLearner(
        model,
        TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)),
        TensorDataset(torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)),
        validation_set=TensorDataset(torch.from_numpy(data.x_val), torch.from_numpy(data.y_val))
        if len(data.y_val)
        else None,
        device=torch_device,
    )


def learner_for(context: Context, overrides: Mapping[str, Any] | None = None) -> TorchLearner:
    """This node's learner, reused while the node is among the process's last :data:`NODES_KEPT`.

    Its data stay on the device between messages and nodes of one architecture
    share one model, into which each call loads the weights it is sent. Building a
    learner also sets this process's torch threads to the ``torch-threads`` key.
    """
    _forget_other_runs(context)
    settings = cached_run_config({**context.run_config, **(overrides or {})})
    return _cached_learner(
        _data_key(settings, context),
        settings["model"],
        settings["device"],
        settings["torch-threads"],
    )


def check_node(context: Context, overrides: Mapping[str, Any] | None = None) -> int:
    """The start-up handshake's check that this node can load its data, keeping nothing for it.

    Checks what building the node's learner checks (the run and node configs, the
    data set, the federation's plan, the device and the model) from the plan and
    the one model per architecture that the process keeps, without copying the
    node's samples.

    Returns
    -------
    int
        The node's ground-truth group: the largest source of its train split.

    Raises
    ------
    FileNotFoundError
        The data set is missing.
    ValueError
        A bad config, device or model, or a plan that cannot be made
        (:class:`~fl_clusters.errors.FederationProblem`, shared by every node).
    """
    _forget_other_runs(context)
    settings = cached_run_config({**context.run_config, **(overrides or {})})
    dataset, data_root, partition_id, num_partitions, partition = _data_key(settings, context)
    data = load_dataset(dataset, data_root or None)
    plan = cached_plan(dataset, data_root or None, False, num_partitions, partition)
    device = str(resolve_device(settings["device"]))
    _shared_model(settings["model"], tuple(data.x.shape[1:]), data.num_classes, device)
    return int(np.argmax(train_mixture(plan, partition_id)))


def node_metadata(context: Context, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the final report adds about this node: its ground truth, for metrics only."""
    data = client_data_for(context, overrides)
    partition_id, _ = node_partition(context)
    return {
        "true-cluster": data.true_cluster,
        "true-mixture": data.mixture.astype(float).tolist(),
        TEST_GROUPS: data.test_sources.tolist(),
        "noisy": int(data.noisy),
        "partition-id": partition_id,
    }
