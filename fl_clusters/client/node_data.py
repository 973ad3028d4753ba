"""The built-in ClientApp's data and learners: one of each per node and process.

A simulation actor serves many nodes in turn, one message at a time, so each
node's partition and learner are built on its first message and kept; nodes of
one architecture share one model, into which each call loads the weights it is
sent. They are kept for one run: an actor that serves the runs of a sweep in turn
(:func:`fl_clusters.ray_pool.actors_kept_between_runs`) drops a run's nodes when
the next run's first message arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

import torch
from flwr.app import Context
from torch.utils.data import TensorDataset

from fl_clusters.client.queries import TEST_GROUPS
from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import ClientData, load_client_data, load_dataset
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


# Unbounded on purpose: one entry per node this process hosts. A Ray actor serves
# every node of a 100-300 client federation in turn, and a bounded cache that the
# federation outgrows re-partitions evicted nodes on every message.
@cache
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
    """This node's partition, loaded once per process and run."""
    _forget_other_runs(context)
    settings = parse_run_config({**context.run_config, **(overrides or {})})
    return _client_data(*_data_key(settings, context))


# Every learner call loads the weights it is sent into the model first, and a
# process runs one message at a time, so nodes of one architecture share a model.
@lru_cache(maxsize=8)
def _shared_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, device: str
) -> torch.nn.Module:
    return build_model(name, input_shape, num_classes).to(device)  # type: ignore[arg-type]


@cache
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
    """This node's learner, built once per process and run, reused for every message.

    Its data stay on the device between messages and nodes of one architecture
    share one model, into which each call loads the weights it is sent. Building a
    learner also sets this process's torch threads to the ``torch-threads`` key.
    """
    _forget_other_runs(context)
    settings = parse_run_config({**context.run_config, **(overrides or {})})
    return _cached_learner(
        _data_key(settings, context),
        settings["model"],
        settings["device"],
        settings["torch-threads"],
    )




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
