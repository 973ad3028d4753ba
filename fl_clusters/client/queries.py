"""The queries a server sends besides train and evaluate, in one table.

:data:`QUERIES` maps every query message type a server may send
(:data:`fl_clusters.protocol.QUERY_TYPES`) to its handler; :func:`register_queries`
adds them all to a ClientApp. Both the
built-in ClientApp and :class:`~fl_clusters.adapter.ClusteredClient` register from
it, each describing its node with a :class:`ClientNode`. One of them,
``query.strategy``, answers the queries strategies declare themselves
(:mod:`fl_clusters.strategies.kit.client_queries`) by the name the message carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fl_clusters import protocol as p
from fl_clusters.client.backdoor import backdoor_success
from fl_clusters.client.blocks import serve_block
from fl_clusters.client.choice import training_losses
from fl_clusters.client.fedem import mixture_scores, mixture_weights_for, stored_mixture_weights
from fl_clusters.client.task import candidate_models, local_model, node_key, reply, task_config
from fl_clusters.clustering import best_fit_counts
from fl_clusters.drawing import draw_clusters
from fl_clusters.errors import FederationProblem
from fl_clusters.learner import TorchLearner
from fl_clusters.placement import PLACEMENT, placement_report

# Optional metadata entry: the group (e.g. source distribution) of every test sample.
# The report turns it into per-group correct counts instead of forwarding it.
TEST_GROUPS = "test-groups"
# Optional metadata entry of a simulation with a backdoor attack: its target class.
# The report turns it into every model's backdoor success (fl_clusters.attacks).
BACKDOOR_TARGET = "backdoor-target"


def no_metadata(context: Context) -> Mapping[str, Any]:
    """No extra report values."""
    return {}


@dataclass(frozen=True)
class ClientNode:
    """What the query handlers need from a client path.

    Parameters
    ----------
    learner : Callable[[Context], TorchLearner]
        Builds this node's learner (model + local data) from its context.
    metadata : Callable[[Context], Mapping[str, Any]]
        Extra values for the final report, such as the ground-truth cluster used
        for metrics; strategies never read them. A ``"true-cluster"`` entry also
        rides on the handshake, for the server's progress lines.
    load_at_handshake : bool
        Whether the handshake checks that the node can load its data, so that data
        no node can load stop the run before round 1 (the problem rides on the reply).
    check : Callable[[Context], int | None] | None
        How the handshake checks it without keeping anything for the node: raises
        what building the learner would raise and returns the node's ground-truth
        group (None when unknown). None: the handshake builds the learner and
        reads the group from ``metadata``.
    """

    learner: Callable[[Context], TorchLearner]
    metadata: Callable[[Context], Mapping[str, Any]] = no_metadata
    load_at_handshake: bool = True
    check: Callable[[Context], int | None] | None = None


def report_reply(
    learner: TorchLearner, message: Message, context: Context, metadata: Mapping[str, Any]
) -> Message:
    """Final report: every cluster model scored on this node's held-out test split.

    ``metadata`` is forwarded, except its optional ``"test-groups"`` entry (one
    integer group per test sample), which becomes every model's correct counts
    per group (``group-correct``, ``group-counts``).
    """
    metadata = dict(metadata)
    groups = metadata.pop(TEST_GROUPS, None)
    backdoor_target = metadata.pop(BACKDOOR_TARGET, None)
    models = candidate_models(message)
    if learner.num_examples("test") == 0:
        raise ValueError("split 'test' of this client is empty")
    # One test pass per model serves the loss, the accuracy and the group counts.
    test_scores = [learner.per_sample_scores(m, "test") for m in models]
    config = task_config(message)
    metrics = MetricRecord(
        {
            "test-accuracy": [float(correct.mean()) for _, correct in test_scores],
            "test-loss": [p.reported_loss(losses.mean(dtype=np.float64))
                          for losses, _ in test_scores],
            "num-test": learner.num_examples("test"),
            p.M_NUM_EXAMPLES: learner.num_examples("train"),
            "test-feature-mean": learner.feature_mean(
                "test", learner.num_examples("test")
            ).tolist(),
            "train-feature-mean": learner.feature_mean(
                "train", int(config.get(p.CFG_NUM_SAMPLES, 32))  # type: ignore[arg-type]
            ).tolist(),
        }
    )
    if int(config.get(p.CFG_ASSIGNED, -1)) < 0:  # type: ignore[arg-type]
        # Only a node that chooses its cluster itself needs the training losses of
        # every model (a pass over its training split per model, the report's
        # largest cost with many clusters); the server names the others' cluster.
        metrics["train-loss"] = training_losses(learner, models, context)
    local = local_model(context)
    if local is not None:
        metrics["local-accuracy"] = learner.evaluate(local, "test")[1]
    if stored_mixture_weights(context, len(models)) is not None or bool(
        config.get(p.CFG_MIXTURE, False)
    ):
        add_mixture_metrics(metrics, learner, models, context)
    if backdoor_target is not None:
        add_backdoor_metrics(metrics, learner, models, local, int(backdoor_target))
    if groups is not None:
        correct, counts = group_scores([c for _, c in test_scores], groups)
        metrics["group-correct"] = correct
        metrics["group-counts"] = counts
    for key, value in metadata.items():
        metrics[key] = value
    return reply(message, metrics)


def add_backdoor_metrics(
    metrics: MetricRecord, learner: TorchLearner, models: list[ArrayRecord],
    local: ArrayRecord | None, target: int,
) -> None:
    """A backdoor run's report: every model's (and the node's own model's) backdoor
    success on the node's test inputs, and how many inputs it was measured on."""
    scores = [backdoor_success(learner, m, target) for m in models]
    if scores[0] is None:  # every test input is of the target class: nothing to measure
        return
    metrics[p.M_BACKDOOR_SUCCESS] = [s[0] for s in scores if s is not None]
    metrics["backdoor-inputs"] = scores[0][1]
    if local is not None:
        metrics["local-backdoor-success"] = backdoor_success(learner, local, target)[0]  # type: ignore[index]


def add_mixture_metrics(
    metrics: MetricRecord, learner: TorchLearner, models: list[ArrayRecord], context: Context
) -> None:
    """FedEM's report: the node's mixture of every model, scored on its test split."""
    pi = mixture_weights_for(learner, models, context)
    mixture_losses, mixture_correct = mixture_scores(learner, models, pi, "test")
    metrics["mixture-accuracy"] = float(mixture_correct.mean())
    metrics["mixture-loss"] = float(mixture_losses.mean())
    metrics[p.M_MIXTURE_WEIGHTS] = pi.tolist()


def group_scores(correct: list[np.ndarray], groups: Any) -> tuple[list[int], list[int]]:
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


def sample_assignment_reply(learner: TorchLearner, message: Message) -> Message:
    """FedSoft: how many training samples each cluster model fits best."""
    models = candidate_models(message)
    losses = np.stack([learner.per_sample_losses(m, "train") for m in models])
    metrics = MetricRecord(
        {p.M_COUNTS: best_fit_counts(losses).tolist(), p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return reply(message, metrics)


def cluster_losses_reply(learner: TorchLearner, message: Message) -> Message:
    """IFCA restarts: mean training loss of every cluster model of every candidate.

    The message carries the initial model and one seed per candidate; the node
    draws each candidate's cluster models itself (as the server does) and replies
    with the losses row-major, one row of ``num-clusters`` values per seed.
    """
    config = task_config(message)
    if p.ARRAYS not in message.content.array_records:
        raise ValueError(
            f"query.cluster_losses needs the initial model under '{p.ARRAYS}' and "
            f"'{p.CFG_RESTART_SEEDS}' in its config (docs/protocol.md)"
        )
    model = message.content.array_records[p.ARRAYS]
    losses = []
    for seed in config.get(p.CFG_RESTART_SEEDS, []):  # type: ignore[union-attr]
        packed = draw_clusters(model, int(config[p.CFG_NUM_CLUSTERS]),  # type: ignore[arg-type]
                                 int(config.get(p.CFG_HEAD_LAYERS, 0)), int(seed))  # type: ignore[arg-type]
        losses += [float(learner.per_sample_losses(m, "train").mean())
                   for m in p.unpack_clusters(packed)]
    metrics = MetricRecord(
        {p.M_CLUSTER_LOSSES: losses, p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return reply(message, metrics)


def features_reply(learner: TorchLearner, message: Message, context: Context) -> Message:
    """MCFL: the mean of n sampled training inputs."""
    n = int(task_config(message).get(p.CFG_NUM_SAMPLES, 32))  # type: ignore[arg-type]
    mean = learner.feature_mean("train", n, seed=node_key(context) % 2**31)
    metrics = MetricRecord(
        {p.M_FEATURE_MEAN: mean.tolist(), p.M_NUM_EXAMPLES: learner.num_examples()}
    )
    return reply(message, metrics)


def identity_reply(message: Message, context: Context, group: int | None = None) -> Message:
    """Start-up handshake: the key the server orders and samples nodes by.

    ``group`` (the node's ground-truth group, when the app knows it) rides along
    for the ServerApp's progress lines; no strategy reads it.
    """
    metrics = MetricRecord({p.M_NODE_KEY: node_key(context)})
    if group is not None:
        metrics[p.M_TRUE_GROUP] = int(group)
    if "partition-id" in context.node_config:
        metrics[p.M_PARTITION_ID] = int(context.node_config["partition-id"])
    return reply(message, metrics)


def _report(node: ClientNode, message: Message, context: Context) -> Message:
    answer = report_reply(node.learner(context), message, context, node.metadata(context))
    answer.content[PLACEMENT] = placement_report(context)
    return answer


def _sample_assignment(node: ClientNode, message: Message, context: Context) -> Message:
    return sample_assignment_reply(node.learner(context), message)


def _cluster_losses(node: ClientNode, message: Message, context: Context) -> Message:
    return cluster_losses_reply(node.learner(context), message)


def _features(node: ClientNode, message: Message, context: Context) -> Message:
    return features_reply(node.learner(context), message, context)


def _identity(node: ClientNode, message: Message, context: Context) -> Message:
    if not node.load_at_handshake:
        return identity_reply(message, context, node.metadata(context).get("true-cluster"))
    try:
        if node.check is not None:
            group = node.check(context)
        else:
            node.learner(context)
            group = node.metadata(context).get("true-cluster")
    except (FileNotFoundError, ValueError) as err:
        answer = identity_reply(message, context)
        answer.content[p.STARTUP_PROBLEM] = ConfigRecord(
            {"message": str(err), p.EVERY_NODE: isinstance(err, FederationProblem)}
        )
        return answer
    return identity_reply(message, context, group)


def _kept_state(node: ClientNode, message: Message, context: Context) -> Message:
    """Checkpoint: every record this node keeps between rounds (``context.state``)."""
    return Message(RecordDict(dict(context.state.items())), reply_to=message)


def _restore_state(node: ClientNode, message: Message, context: Context) -> Message:
    """Resume: take back the records a checkpoint kept, replacing what is kept now.

    A resumed run is a new Flower run, so ``context.state`` starts empty.
    """
    for name in list(context.state.keys()):
        del context.state[name]
    for name, record in message.content.items():
        context.state[name] = record
    return Message(RecordDict(), reply_to=message)


def _strategy_query(node: ClientNode, message: Message, context: Context) -> Message:
    """A strategy's own query: the function its class declares under the name asked.

    The registered strategies are imported on the first such query, not when the
    app loads. A name no strategy known here declares, or none at all, gets an
    error reply naming the fix; the function's own errors become Flower's error
    reply, as any handler's do.
    """
    from fl_clusters.strategies.kit.client_queries import query_handlers
    from fl_clusters.strategies.kit.registry import ENTRY_POINT_GROUP, strategy_classes

    name = task_config(message).get(p.CFG_QUERY)
    problem = p.query_name_problem(name)
    if problem is not None:
        return _error_reply(message, f"{p.QUERY_STRATEGY} needs the query's name under "
                            f"'{p.CFG_QUERY}' in its '{p.CONFIG}' record: {problem}")
    handler = query_handlers(strategy_classes().values()).get(name)  # type: ignore[arg-type]
    if handler is None:
        return _error_reply(message, (
            f"no strategy installed on this node declares the client query {name!r}: "
            "install the package that declares it on this SuperNode (a strategy of "
            f"another package registers through entry-point group {ENTRY_POINT_GROUP!r}), "
            "or import its module in the ClientApp's module"))
    records = handler(node.learner(context), message.content)
    if not isinstance(records, RecordDict):
        return _error_reply(message, f"the client query {name!r} returned a "
                            f"{type(records).__name__}, not the reply's RecordDict")
    return Message(records, reply_to=message)


def _error_reply(message: Message, reason: str) -> Message:
    """An error reply to ``message``: the server logs ``reason`` and leaves the node out."""
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                   reply_to=message)


QueryHandler = Callable[[ClientNode, Message, Context], Message]

# The one table of queries: message type -> handler.
QUERIES: Mapping[str, QueryHandler] = {
    p.QUERY_REPORT: _report,
    p.QUERY_SAMPLE_ASSIGNMENT: _sample_assignment,
    p.QUERY_CLUSTER_LOSSES: _cluster_losses,
    p.QUERY_FEATURES: _features,
    p.QUERY_IDENTITY: _identity,
    p.QUERY_STATE: _kept_state,
    p.QUERY_RESTORE: _restore_state,
    p.QUERY_STRATEGY: _strategy_query,
}


def register_queries(app: ClientApp, node: ClientNode) -> None:
    """Add the handler of every query type a server may send to ``app``, answering for ``node``.

    A type of :data:`~fl_clusters.protocol.QUERY_TYPES` without a handler in
    :data:`QUERIES` fails here, when the app is built.
    """
    for message_type in p.QUERY_TYPES:
        # serve_block: a block of logical clients is answered client by client.
        app.query(p.action_of(message_type), mods=[serve_block])(
            partial(QUERIES[message_type], node))
