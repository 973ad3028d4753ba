"""The fl-clusters ClientApp: local SGD, proximal updates, loss-based cluster choice.

The handlers are written against :class:`~fl_clusters.learner.TorchLearner`, so they
serve our own data and models (``app`` below) and any Flower user's model and data
alike: call :func:`register_handlers` on your own ``ClientApp`` with a function that
builds a learner from the ``Context``. docs/protocol.md describes the messages.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from functools import cache, lru_cache
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.apps import pass_ray_messages_inline
from fl_clusters.clustering import (
    best_fit_counts,
    e_step,
    fit_mixture_weights,
    mixture_probabilities,
    nearest_feature,
)
from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import ClientData, load_client_data, load_dataset
from fl_clusters.learner import TorchLearner, resolve_device
from fl_clusters.models import build_model
from fl_clusters.placement import PLACEMENT, placement_report, record_training

LearnerFactory = Callable[[Context], TorchLearner]
MetadataFactory = Callable[[Context], Mapping[str, Any]]

LOCAL_MODEL = "local-model"  # key of the node's persistent model in context.state
MIXTURE_WEIGHTS = "mixture-weights"  # key of the node's FedEM pi in context.state
# Key of the training losses of the models this node scored last, in context.state:
# the node, not one simulation actor, keeps them, whichever actor runs its next message.
KNOWN_LOSSES = "known-train-losses"
# Optional metadata entry: the group (e.g. source distribution) of every test sample.
# The report turns it into per-group correct counts instead of forwarding it.
TEST_GROUPS = "test-groups"


def _config(message: Message) -> ConfigRecord:
    return message.content.config_records.get(p.CONFIG, ConfigRecord())


def _candidate_models(message: Message, own: ArrayRecord | None = None) -> list[ArrayRecord]:
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
    if bool(_config(message).get(p.CFG_PERSISTENT, False)):
        raise ValueError(
            "this node keeps no model of its own (its state was lost, e.g. it restarted) "
            f"and the message carries no '{p.ARRAYS}'; the server sends a start model "
            "with the node's next task"
        )
    raise ValueError(
        f"message {message.metadata.message_type!r} carries neither '{p.ARRAYS}' nor "
        f"'{p.CLUSTERS}'; a fl-clusters server always sends one of them"
    )


def training_losses(
    learner: TorchLearner, models: list[ArrayRecord], context: Context
) -> list[float]:
    """Mean training loss of each model; models this node scored last are not scored again.

    Round t's evaluation and round t+1's training offer the same models, so the
    losses of the last scored models are kept in ``context.state`` by digest.
    """
    kept = context.state.config_records.get(KNOWN_LOSSES, ConfigRecord())
    digests = cast(list[str], kept.get("digests", []))
    known = {
        bytes.fromhex(d): float(loss)
        for d, loss in zip(digests, cast(list[float], kept.get("losses", [])), strict=True)
    }
    losses = learner.mean_losses(models, "train", known)
    context.state[KNOWN_LOSSES] = ConfigRecord(
        {"digests": [d.hex() for d in known], "losses": list(known.values())}
    )
    return losses


def _choose_cluster(
    learner: TorchLearner, models: list[ArrayRecord], config: ConfigRecord, context: Context
) -> tuple[int, list[float]]:
    """Pick the model to use: the server's assignment, else the lowest training loss.

    The choice reads the training split only: choosing by test loss would leak
    the test data into the model choice (ALGORITHMS.md, pitfalls).
    """
    assigned = int(config.get(p.CFG_ASSIGNED, -1))
    if len(models) == 1:
        return 0, []
    losses = training_losses(learner, models, context)
    if 0 <= assigned < len(models):
        return assigned, losses
    return int(np.argmin(losses)), losses


def _mcfl_choice(
    learner: TorchLearner, num_models: int, config: ConfigRecord, split: str
) -> int | None:
    """MCFL: the cluster whose feature is nearest to the mean of ``split``'s inputs.

    ``None`` when the server sent no cluster features. Only the inputs of the
    split are read, never its labels: the paper's choice at inference time, where
    a client knows what its data look like but not their labels.
    """
    if p.CFG_MCFL_FEATURES not in config:
        return None
    clusters = np.asarray(config.get(p.CFG_MCFL_CLUSTERS, []), dtype=np.int64)
    features = np.asarray(config[p.CFG_MCFL_FEATURES], dtype=np.float64)
    query = learner.feature_mean(split, learner.num_examples(split))
    if (
        clusters.size == 0
        or features.size != clusters.size * query.size
        or clusters.min() < 0
        or clusters.max() >= num_models
    ):
        raise ValueError(
            f"'{p.CFG_MCFL_FEATURES}' must hold one feature of {query.size} values for each "
            f"of the {clusters.size} clusters in '{p.CFG_MCFL_CLUSTERS}' (ids below "
            f"{num_models}); got {features.size} values"
        )
    nearest = nearest_feature(query[None, :], features.reshape(clusters.size, query.size))
    return int(clusters[nearest[0]])


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


def _identity(
    message: Message, context: Context, group: int | None = None
) -> Message:
    """Start-up handshake: the key the server orders and samples nodes by.

    ``group`` (the node's ground-truth group, when the app knows it) rides along
    for the ServerApp's progress lines; no strategy reads it.
    """
    metrics = MetricRecord({p.M_NODE_KEY: node_key(context)})
    if group is not None:
        metrics[p.M_TRUE_GROUP] = int(group)
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def _kept_state(message: Message, context: Context) -> Message:
    """Checkpoint: every record this node keeps between rounds (``context.state``)."""
    return Message(RecordDict(dict(context.state.items())), reply_to=message)


def _restore_state(message: Message, context: Context) -> Message:
    """Resume: take back the records a checkpoint kept, replacing what is kept now.

    A resumed run is a new Flower run, so ``context.state`` starts empty.
    """
    for name in list(context.state.keys()):
        del context.state[name]
    for name, record in message.content.items():
        context.state[name] = record
    return Message(RecordDict(), reply_to=message)


def _local_model(context: Context) -> ArrayRecord | None:
    return context.state.array_records.get(LOCAL_MODEL)


def proximal_centers(
    message: Message, config: ConfigRecord, chosen: ArrayRecord
) -> list[tuple[ArrayRecord, float]]:
    """The (centre, weight) pairs of this message's proximal term.

    FedSoft sends every cluster model as a centre with weight ``mu * u_k``;
    FedProx (``proximal-mu`` > 0 without centres) pulls towards the chosen model.
    """
    mu = float(config.get(p.CFG_PROX_MU, 0.0))
    if p.CENTERS in message.content.array_records:
        weights = [float(w) for w in config.get(p.CFG_CENTER_WEIGHTS, [])]  # type: ignore[union-attr]
        center_models = p.unpack_clusters(message.content.array_records[p.CENTERS])
        if len(weights) != len(center_models):
            raise ValueError(
                f"'{p.CFG_CENTER_WEIGHTS}' has {len(weights)} values for "
                f"{len(center_models)} centres; send one weight per centre"
            )
        return [(c, mu * w) for c, w in zip(center_models, weights, strict=True)]
    return [(chosen, mu)] if mu > 0 else []


def _train(learner: TorchLearner, message: Message, context: Context) -> Message:
    config = _config(message)
    persistent = bool(config.get(p.CFG_PERSISTENT, False))
    models = _candidate_models(message, _local_model(context) if persistent else None)
    cluster, losses = _choose_cluster(learner, models, config, context)
    start = models[cluster]
    if persistent:
        # Local-only training and FedSoft keep one model per node across rounds.
        start = _local_model(context) or start
    centers = proximal_centers(message, config, models[cluster])
    num_examples = learner.num_examples("train")
    metrics = MetricRecord({p.M_NUM_EXAMPLES: num_examples})
    if config.get(p.CFG_RETURN, "model") == "gradient":
        arrays, loss = learner.gradient(start)
    else:
        batch_size = int(config.get(p.CFG_BATCH, 32))
        epochs = int(config.get(p.CFG_EPOCHS, 1))
        steps = int(config.get(p.CFG_STEPS, 0))
        arrays, loss = learner.train(
            start,
            lr=float(config.get(p.CFG_LR, 0.1)),
            batch_size=batch_size,
            epochs=epochs,
            steps=steps,
            proximal_centers=centers,
            seed=int(config.get(p.CFG_ROUND, 0)) * 100_003 + node_key(context) % 100_003,
        )
        metrics[p.M_STEPS_DONE] = learner.num_steps(batch_size, epochs, steps)
        if persistent:
            context.state[LOCAL_MODEL] = arrays
    metrics[p.M_TRAIN_LOSS] = loss
    if len(models) > 1:
        metrics[p.M_CLUSTER] = cluster
        metrics[p.M_CLUSTER_LOSSES] = losses
    return Message(RecordDict({p.ARRAYS: arrays, p.METRICS: metrics}), reply_to=message)


def _evaluate(learner: TorchLearner, message: Message, context: Context) -> Message:
    config = _config(message)
    models = _candidate_models(message)
    split = str(config.get(p.CFG_SPLIT, "test"))
    cluster = _mcfl_choice(learner, len(models), config, split)
    if cluster is None:
        cluster, _ = _choose_cluster(learner, models, config, context)
    arrays = models[cluster]
    if bool(config.get(p.CFG_PERSISTENT, False)):
        arrays = _local_model(context) or arrays
    loss, accuracy = learner.evaluate(arrays, split)
    metrics = MetricRecord(
        {
            p.M_NUM_EXAMPLES: learner.num_examples(split),
            p.M_LOSS: loss,
            p.M_ACCURACY: accuracy,
        }
    )
    if len(models) > 1:
        metrics[p.M_CLUSTER] = cluster
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def is_mixture(message: Message) -> bool:
    """Whether ``message`` is a FedEM task: its clusters are this node's mixture components."""
    return bool(_config(message).get(p.CFG_MIXTURE, False))


def _stored_mixture_weights(context: Context, num_components: int) -> np.ndarray | None:
    record = context.state.config_records.get(MIXTURE_WEIGHTS)
    if record is None:
        return None
    pi = np.asarray(record["pi"], dtype=np.float64)
    if pi.shape != (num_components,):
        raise ValueError(
            f"this node keeps FedEM mixture weights for {pi.size} components but the server "
            f"sent {num_components}; one run must keep one number of components"
        )
    return pi


def mixture_weights_for(
    learner: TorchLearner, models: list[ArrayRecord], context: Context
) -> np.ndarray:
    """The node's FedEM weights pi: kept from its last training round, else fitted.

    A node that never trained fits pi to the fixed components by EM on its
    TRAINING split; the test split never decides pi.
    """
    pi = _stored_mixture_weights(context, len(models))
    if pi is not None:
        return pi
    losses, _, _ = learner.component_scores(models, "train")
    return fit_mixture_weights(losses)


def mixture_scores(
    learner: TorchLearner, models: list[ArrayRecord], pi: np.ndarray, split: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample loss (-log p(y|x)) and correctness of the mixture ``sum_m pi_m p_m``."""
    _, probs, labels = learner.component_scores(models, split)
    mixed = mixture_probabilities(probs, pi)
    # The floor keeps one confidently wrong sample from making the mean loss infinite.
    likelihood = np.maximum(mixed[np.arange(len(labels)), labels], 1e-12)
    return -np.log(likelihood), mixed.argmax(axis=1) == labels


def _fedem_components(message: Message) -> list[ArrayRecord]:
    models = _candidate_models(message)
    if len(models) < 2:
        raise ValueError(
            f"a FedEM message ('{p.CFG_MIXTURE}'=true) must carry at least 2 packed "
            f"components under '{p.CLUSTERS}', got {len(models)}"
        )
    return models


def fedem_train(learner: TorchLearner, message: Message, context: Context) -> Message:
    """FedEM's local step: E-step on the training split, then every component's M-step.

    The responsibilities ``q(m, i)`` and the new ``pi = mean_i q`` come from the
    components the server sent and the node's previous pi (uniform at first);
    component m is then trained with the same lr, epochs/steps and batches as
    any other local task, each sample's loss weighted by ``q(m, i)``. pi is kept
    in ``context.state`` and reported; the reply packs the M trained components.
    """
    config = _config(message)
    models = _fedem_components(message)
    pi = _stored_mixture_weights(context, len(models))
    if pi is None:
        pi = np.full(len(models), 1.0 / len(models))
    losses, _, _ = learner.component_scores(models, "train")
    q, pi = e_step(losses, pi)
    trained, total_loss = [], 0.0
    for model, weights in zip(models, q, strict=True):
        arrays, loss = learner.train(
            model,
            lr=float(config.get(p.CFG_LR, 0.1)),
            batch_size=int(config.get(p.CFG_BATCH, 32)),
            epochs=int(config.get(p.CFG_EPOCHS, 1)),
            steps=int(config.get(p.CFG_STEPS, 0)),
            seed=int(config.get(p.CFG_ROUND, 0)) * 100_003 + node_key(context) % 100_003,
            sample_weights=weights,
        )
        trained.append(arrays)
        total_loss += loss  # the q-weighted losses of the components add up (sum_m q = 1)
    context.state[MIXTURE_WEIGHTS] = ConfigRecord({"pi": pi.tolist()})
    metrics = MetricRecord(
        {
            p.M_NUM_EXAMPLES: learner.num_examples("train"),
            p.M_TRAIN_LOSS: total_loss,
            p.M_MIXTURE_WEIGHTS: pi.tolist(),
        }
    )
    return Message(
        RecordDict({p.ARRAYS: p.pack_clusters(trained), p.METRICS: metrics}), reply_to=message
    )


def fedem_evaluate(learner: TorchLearner, message: Message, context: Context) -> Message:
    """Score the node's mixture ``sum_m pi_m p_m(y | x)`` on the requested split."""
    models = _fedem_components(message)
    split = str(_config(message).get(p.CFG_SPLIT, "test"))
    losses, correct = mixture_scores(
        learner, models, mixture_weights_for(learner, models, context), split
    )
    metrics = MetricRecord(
        {
            p.M_NUM_EXAMPLES: len(correct),
            p.M_LOSS: float(losses.mean()),
            p.M_ACCURACY: float(correct.mean()),
        }
    )
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def _report(
    learner: TorchLearner, message: Message, context: Context, metadata: Mapping[str, Any]
) -> Message:
    """Final report: every cluster model scored on this node's held-out test split."""
    metadata = dict(metadata)
    groups = metadata.pop(TEST_GROUPS, None)
    models = _candidate_models(message)
    if learner.num_examples("test") == 0:
        raise ValueError("split 'test' of this client is empty")
    # One test pass per model serves the loss, the accuracy and the group counts.
    test_scores = [learner.per_sample_scores(m, "test") for m in models]
    config = _config(message)
    metrics = MetricRecord(
        {
            "test-accuracy": [float(correct.mean()) for _, correct in test_scores],
            "test-loss": [float(losses.mean(dtype=np.float64)) for losses, _ in test_scores],
            "num-test": learner.num_examples("test"),
            p.M_NUM_EXAMPLES: learner.num_examples("train"),
            "test-feature-mean": learner.feature_mean(
                "test", learner.num_examples("test")
            ).tolist(),
            "train-feature-mean": learner.feature_mean(
                "train", int(config.get(p.CFG_NUM_SAMPLES, 32))
            ).tolist(),
        }
    )
    if int(config.get(p.CFG_ASSIGNED, -1)) < 0:  # type: ignore[arg-type]
        # Only a node that chooses its cluster itself needs the training losses of
        # every model (a pass over its training split per model, the report's
        # largest cost with many clusters); the server names the others' cluster.
        metrics["train-loss"] = training_losses(learner, models, context)
    local = _local_model(context)
    if local is not None:
        metrics["local-accuracy"] = learner.evaluate(local, "test")[1]
    if _stored_mixture_weights(context, len(models)) is not None or bool(
        config.get(p.CFG_MIXTURE, False)
    ):
        pi = mixture_weights_for(learner, models, context)
        mixture_losses, mixture_correct = mixture_scores(learner, models, pi, "test")
        metrics["mixture-accuracy"] = float(mixture_correct.mean())
        metrics["mixture-loss"] = float(mixture_losses.mean())
        metrics[p.M_MIXTURE_WEIGHTS] = pi.tolist()
    if groups is not None:
        correct, counts = _group_scores([c for _, c in test_scores], groups)
        metrics["group-correct"] = correct
        metrics["group-counts"] = counts
    for key, value in metadata.items():
        metrics[key] = value
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def _group_scores(correct: list[np.ndarray], groups: Any) -> tuple[list[int], list[int]]:
    """Correct test predictions of every model per group (row-major, model by group).

    ``correct`` holds each model's per-sample correctness on the test split.
    Returns the flattened ``(num models, num groups)`` correct counts and the number
    of test samples of each group.
    """
    labels = np.asarray(groups)
    num_test = len(correct[0])
    if labels.shape != (num_test,) or not np.issubdtype(labels.dtype, np.integer) or (
        labels.size and labels.min() < 0
    ):
        raise ValueError(
            f"metadata '{TEST_GROUPS}' must hold one non-negative integer group per test "
            f"sample ({num_test}), got shape {labels.shape} of {labels.dtype}"
        )
    num_groups = int(labels.max()) + 1 if labels.size else 0
    per_group = [np.bincount(labels, weights=c, minlength=num_groups) for c in correct]
    counts = np.bincount(labels, minlength=num_groups)
    return np.concatenate(per_group).astype(int).tolist(), counts.astype(int).tolist()


def _sample_assignment(learner: TorchLearner, message: Message) -> Message:
    """FedSoft: how many training samples each cluster model fits best."""
    models = _candidate_models(message)
    losses = np.stack([learner.per_sample_losses(m, "train") for m in models])
    metrics = MetricRecord(
        {p.M_COUNTS: best_fit_counts(losses).tolist(), p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def _cluster_losses(learner: TorchLearner, message: Message) -> Message:
    """IFCA restarts: mean training loss of every cluster model of every candidate.

    The message carries the initial model and one seed per candidate; the node
    draws each candidate's cluster models itself (as the server does) and replies
    with the losses row-major, one row of ``num-clusters`` values per seed.
    """
    config = _config(message)
    if p.ARRAYS not in message.content.array_records:
        raise ValueError(
            f"query.cluster_losses needs the initial model under '{p.ARRAYS}' and "
            f"'{p.CFG_RESTART_SEEDS}' in its config (docs/protocol.md)"
        )
    model = message.content.array_records[p.ARRAYS]
    losses = []
    for seed in config.get(p.CFG_RESTART_SEEDS, []):  # type: ignore[union-attr]
        packed = p.draw_clusters(model, int(config[p.CFG_NUM_CLUSTERS]),  # type: ignore[arg-type]
                                 int(config.get(p.CFG_HEAD_LAYERS, 0)), int(seed))  # type: ignore[arg-type]
        losses += [float(learner.per_sample_losses(m, "train").mean())
                   for m in p.unpack_clusters(packed)]
    metrics = MetricRecord(
        {p.M_CLUSTER_LOSSES: losses, p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def _features(learner: TorchLearner, message: Message, context: Context) -> Message:
    """MCFL: the mean of n sampled training inputs."""
    n = int(_config(message).get(p.CFG_NUM_SAMPLES, 32))
    mean = learner.feature_mean("train", n, seed=node_key(context) % 2**31)
    metrics = MetricRecord(
        {p.M_FEATURE_MEAN: mean.tolist(), p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return Message(RecordDict({p.METRICS: metrics}), reply_to=message)


def register_handlers(
    app: ClientApp, learner_fn: LearnerFactory, metadata_fn: MetadataFactory | None = None
) -> ClientApp:
    """Add every fl-clusters message handler to a ClientApp.

    Parameters
    ----------
    app : ClientApp
        A ClientApp with no ``train``/``evaluate``/``query`` handlers of the
        actions registered here (Flower refuses duplicates).
    learner_fn : Callable[[Context], TorchLearner]
        Builds this node's learner (model + local data) from its context.
    metadata_fn : Callable[[Context], Mapping[str, Any]] | None
        Extra values for the final report, such as the ground-truth cluster
        used for metrics. Strategies never read them. An optional
        ``"test-groups"`` entry (one integer group per test sample, e.g. its
        source distribution) is not forwarded: the report returns every cluster
        model's correct counts per group (``group-correct``, ``group-counts``).
    """

    pass_ray_messages_inline()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        learner = learner_fn(context)
        trained = (fedem_train if is_mixture(message) else _train)(learner, message, context)
        if not trained.has_error():
            record_training(context, learner.device)
        return trained

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        if is_mixture(message):
            return fedem_evaluate(learner_fn(context), message, context)
        return _evaluate(learner_fn(context), message, context)

    @app.query("report")
    def report(message: Message, context: Context) -> Message:
        metadata = metadata_fn(context) if metadata_fn else {}
        reply = _report(learner_fn(context), message, context, metadata)
        reply.content[PLACEMENT] = placement_report(context)
        return reply

    @app.query("sample_assignment")
    def sample_assignment(message: Message, context: Context) -> Message:
        return _sample_assignment(learner_fn(context), message)

    @app.query("cluster_losses")
    def cluster_losses(message: Message, context: Context) -> Message:
        return _cluster_losses(learner_fn(context), message)

    @app.query("features")
    def features(message: Message, context: Context) -> Message:
        return _features(learner_fn(context), message, context)

    @app.query("identity")
    def identity(message: Message, context: Context) -> Message:
        # Building the learner loads the node's data, so that a data set no node
        # can load stops the run at the handshake, before round 1.
        try:
            learner_fn(context)
        except (FileNotFoundError, ValueError) as err:
            reply = _identity(message, context)
            reply.content[p.STARTUP_PROBLEM] = ConfigRecord({"message": str(err)})
            return reply
        metadata = metadata_fn(context) if metadata_fn else {}
        return _identity(message, context, metadata.get("true-cluster"))

    app.query("state")(_kept_state)
    app.query("restore")(_restore_state)
    return app


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


def client_data_for(context: Context, overrides: Mapping[str, Any] | None = None) -> ClientData:
    """This node's partition, loaded once per process."""
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
    """This node's learner, built once per process and reused for every message.

    Its data stay on the device between messages and nodes of one architecture
    share one model, into which each call loads the weights it is sent. Building a
    learner also sets this process's torch threads to the ``torch-threads`` key.
    """
    settings = parse_run_config({**context.run_config, **(overrides or {})})
    return _cached_learner(
        _data_key(settings, context),
        settings["model"],
        settings["device"],
        settings["torch-threads"],
    )


def build_client_app(
    overrides: Mapping[str, Any] | None = None, mods: list[Mod] | None = None
) -> ClientApp:
    """The ClientApp on fl-clusters' own data and models.

    Parameters
    ----------
    overrides : Mapping[str, Any] | None
        Run-config values that win over ``context.run_config`` (``run_simulation``
        passes no run config, so tests and scripts set keys here).
    mods : list[Mod] | None
        Flower client mods wrapped around every handler (e.g. Flower's
        ``message_size_mod``, or a fault injector in tests).
    """

    def learner_fn(context: Context) -> TorchLearner:
        return learner_for(context, overrides)

    def metadata_fn(context: Context) -> dict[str, Any]:
        data = client_data_for(context, overrides)
        partition_id, _ = node_partition(context)
        return {
            "true-cluster": data.true_cluster,
            "true-mixture": data.mixture.astype(float).tolist(),
            TEST_GROUPS: data.test_sources.tolist(),
            "noisy": int(data.noisy),
            "partition-id": partition_id,
        }

    return register_handlers(ClientApp(mods=mods), learner_fn, metadata_fn)


app = build_client_app()
