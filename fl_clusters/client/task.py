"""Reading one task message: its config, the models it offers, the SGD it asks for.

Also what a node keeps between tasks (its own model) and its stable key, and the
one way every handler answers.
"""

from __future__ import annotations

import zlib
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.optimizers import optimizer_for

LOCAL_MODEL = "local-model"  # key of the node's persistent model in context.state


def task_config(message: Message) -> ConfigRecord:
    """The server's config record of ``message`` (empty when it sent none)."""
    return message.content.config_records.get(p.CONFIG, ConfigRecord())


def is_persistent(config: ConfigRecord) -> bool:
    """Whether the task trains (or scores) the node's own kept model (local, FedSoft)."""
    return bool(config.get(p.CFG_PERSISTENT, False))


def local_model(context: Context) -> ArrayRecord | None:
    """The model this node keeps between rounds, if it keeps one."""
    return context.state.array_records.get(LOCAL_MODEL)


def candidate_models(message: Message, own: ArrayRecord | None = None) -> list[ArrayRecord]:
    """The models a message offers; ``own`` (the node's kept model) when it sends none.

    FedSoft sends a node its start model only until the node keeps one of its own.
    """
    content = message.content
    if p.CLUSTERS in content.array_records:
        return p.unpack_clusters(content.array_records[p.CLUSTERS])
    if p.ARRAYS in content.array_records:
        return [content.array_records[p.ARRAYS]]
    if own is not None:
        return [own]
    if is_persistent(task_config(message)):
        raise ValueError(
            "this node keeps no model of its own (its state was lost, e.g. it restarted) "
            f"and the message carries no '{p.ARRAYS}'; the server sends a start model "
            "with the node's next task"
        )
    raise ValueError(
        f"message {message.metadata.message_type!r} carries neither '{p.ARRAYS}' nor "
        f"'{p.CLUSTERS}'; a fl-clusters server always sends one of them"
    )


def node_key(context: Context) -> int:
    """This node's stable key: its ``partition-id``, else a CRC32 of its node config.

    Simulated node ids are random per run; seeding and ordering by this key makes
    the same run config give the same result (nodes with identical node configs
    and no partition-id share a key and fall back on their ids).
    """
    if "partition-id" in context.node_config:
        return int(context.node_config["partition-id"])
    text = ";".join(f"{k}={v}" for k, v in sorted(context.node_config.items()))
    return zlib.crc32(text.encode())


def sgd_settings(config: ConfigRecord, context: Context) -> dict[str, Any]:
    """Keyword arguments of :meth:`~fl_clusters.learner.TorchLearner.train` for this task.

    The batch seed mixes the round with the node's key, so that every node and
    round draws its own batches and a rerun draws the same ones.
    """
    return {
        "lr": float(config.get(p.CFG_LR, 0.1)),
        "batch_size": int(config.get(p.CFG_BATCH, 32)),
        "epochs": int(config.get(p.CFG_EPOCHS, 1)),
        "steps": int(config.get(p.CFG_STEPS, 0)),
        "seed": batch_seed(config, context),
        "optimizer_fn": optimizer_for(str(config.get(p.CFG_OPTIMIZER, "sgd")),
                                      float(config.get(p.CFG_LR, 0.1))),
    }


def batch_seed(config: ConfigRecord, context: Context) -> int:
    """The seed of this node's draws in this round (batches, the user's shuffling)."""
    return int(config.get(p.CFG_ROUND, 0)) * 100_003 + node_key(context) % 100_003


def reply(message: Message, metrics: MetricRecord, arrays: ArrayRecord | None = None) -> Message:
    """The answer to ``message``: its metrics, and the trained model when there is one."""
    records = {} if arrays is None else {p.ARRAYS: arrays}
    return Message(RecordDict({**records, p.METRICS: metrics}), reply_to=message)
