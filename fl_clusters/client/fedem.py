"""FedEM on the node: every cluster model is a mixture component of each node's model.

A FedEM task (config ``"mixture"``=true) carries the M components; the node keeps its
mixture weights pi in ``context.state``, fits them by EM on its training split and
trains every component on samples weighted by their responsibilities. Both client
paths hand these tasks to :func:`fedem_train` and :func:`fedem_evaluate`: a
FedAvg-style train handler cannot weigh each sample.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from fl_clusters import protocol as p
from fl_clusters.client.task import candidate_models, reply, sgd_settings, task_config
from fl_clusters.client.user_training import UserTraining
from fl_clusters.clustering import (
    fit_mixture_weights,
    full_step_scales,
    mixture_probabilities,
    node_e_step,
)
from fl_clusters.learner import TorchLearner

MIXTURE_WEIGHTS = "mixture-weights"  # key of the node's FedEM pi in context.state


def is_mixture(message: Message) -> bool:
    """Whether ``message`` is a FedEM task: its clusters are this node's mixture components."""
    return bool(task_config(message).get(p.CFG_MIXTURE, False))


def stored_mixture_weights(context: Context, num_components: int) -> np.ndarray | None:
    """The pi this node kept from its last FedEM training round, if any."""
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
    pi = stored_mixture_weights(context, len(models))
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


def fedem_components(message: Message) -> list[ArrayRecord]:
    """The mixture components a FedEM message carries (at least two)."""
    models = candidate_models(message)
    if len(models) < 2:
        raise ValueError(
            f"a FedEM message ('{p.CFG_MIXTURE}'=true) must carry at least 2 packed "
            f"components under '{p.CLUSTERS}', got {len(models)}"
        )
    return models


def fedem_train(
    learner: TorchLearner, message: Message, context: Context,
    user_training: UserTraining | None = None, batch_size: int | None = None,
) -> Message:
    """FedEM's local step: E-step on the training split, then every component's M-step.

    The responsibilities ``q(m, i)`` and the new ``pi = mean_i q`` come from the
    components the server sent and the node's previous pi (uniform at first), or
    with config ``"mixture-refit"`` from pi refitted to those components
    (:func:`~fl_clusters.clustering.node_e_step`); component m is then trained
    with the same lr, epochs/steps and batches as any other local task, each
    sample's loss weighted by ``q(m, i)``, divided by ``max(pi_m, 1/M)`` with
    config ``"mixture-full-steps"``
    (:func:`~fl_clusters.clustering.full_step_scales`). pi is kept in
    ``context.state`` and reported; the reply packs the M trained components.

    With ``user_training`` (a plug-in user's handler as it last trained on this
    node) every component takes that handler's number of steps instead, in batches
    of ``batch_size`` (its loader's) when given, with its optimizer when that is
    ``torch.optim.SGD`` (else plain SGD at the server's ``lr``; see
    :mod:`~fl_clusters.client.user_training`).
    """
    config = task_config(message)
    models = fedem_components(message)
    losses, _, _ = learner.component_scores(models, "train")
    q, pi = node_e_step(losses, stored_mixture_weights(context, len(models)),
                        refit=bool(config.get(p.CFG_MIXTURE_REFIT, False)))
    scales = (full_step_scales(pi) if config.get(p.CFG_MIXTURE_FULL_STEPS, False)
              else np.ones(len(models)))
    settings = sgd_settings(config, context)
    if user_training is not None:
        settings.update(steps=user_training.steps, optimizer_fn=user_training.optimizer_fn())
        if batch_size is not None:
            settings["batch_size"] = batch_size
    trained, total_loss = [], 0.0
    for model, weights, scale in zip(models, q, scales, strict=True):
        arrays, loss = learner.train(model, sample_weights=weights / scale, **settings)
        trained.append(arrays)
        # Back on the q-weighted scale, the components' losses add up (sum_m q = 1).
        total_loss += loss * scale
    context.state[MIXTURE_WEIGHTS] = ConfigRecord({"pi": pi.tolist()})
    metrics = MetricRecord(
        {
            p.M_NUM_EXAMPLES: learner.num_examples("train"),
            p.M_TRAIN_LOSS: total_loss,
            p.M_MIXTURE_WEIGHTS: pi.tolist(),
        }
    )
    return reply(message, metrics, p.pack_clusters(trained))


def fedem_evaluate(learner: TorchLearner, message: Message, context: Context) -> Message:
    """Score the node's mixture ``sum_m pi_m p_m(y | x)`` on the requested split."""
    models = fedem_components(message)
    split = str(task_config(message).get(p.CFG_SPLIT, "test"))
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
    return reply(message, metrics)


