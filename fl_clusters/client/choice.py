"""Which model a node trains or evaluates, whoever's code then trains it.

The loss-based cluster choice (IFCA and every strategy that lets a node pick),
MCFL's choice by input features, and the proximal centres of FedProx and FedSoft.
Both client paths call :func:`choose_for_training` and :func:`choose_for_evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from fl_clusters import protocol as p
from fl_clusters.client.task import (
    candidate_models,
    is_persistent,
    local_model,
    task_config,
)
from fl_clusters.clustering import nearest_feature
from fl_clusters.learner import TorchLearner

# Key of the training losses of the models this node scored last, in context.state:
# the node, not one simulation actor, keeps them, whichever actor runs its next message.
KNOWN_LOSSES = "known-train-losses"


@dataclass(frozen=True)
class ModelChoice:
    """The model a task runs on and how it was chosen.

    Parameters
    ----------
    models : list[ArrayRecord]
        The candidates the message offered.
    cluster : int
        Index of the chosen candidate.
    arrays : ArrayRecord
        The model to use: the chosen candidate, or the node's own kept model.
    losses : list[float] | None
        Training loss of every candidate, when the choice scored them for a
        training task (empty for a single candidate).
    centers : list[tuple[ArrayRecord, float]]
        (centre, weight) pairs of the proximal term.
    """

    models: list[ArrayRecord]
    cluster: int
    arrays: ArrayRecord
    losses: list[float] | None = None
    centers: tuple[tuple[ArrayRecord, float], ...] = ()

    def add_metrics(self, metrics: MetricRecord) -> None:
        """Tell the server which cluster was chosen (only when there was a choice)."""
        if len(self.models) > 1:
            metrics[p.M_CLUSTER] = self.cluster
            if self.losses is not None:
                metrics[p.M_CLUSTER_LOSSES] = self.losses


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


def choose_cluster(
    learner: TorchLearner, models: list[ArrayRecord], config: ConfigRecord, context: Context
) -> tuple[int, list[float]]:
    """Pick the model to use: the server's assignment, else the lowest training loss.

    The choice reads the training split only: choosing by test loss would leak
    the test data into the model choice, and the test accuracy reported would
    then overstate what the node can expect on new data.
    """
    assigned = int(config.get(p.CFG_ASSIGNED, -1))  # type: ignore[arg-type]
    if len(models) == 1:
        return 0, []
    losses = training_losses(learner, models, context)
    if 0 <= assigned < len(models):
        return assigned, losses
    return int(np.argmin(losses)), losses


def mcfl_choice(
    learner: TorchLearner, num_models: int, config: ConfigRecord, split: str
) -> int | None:
    """MCFL: the cluster whose feature is nearest to the mean of ``split``'s inputs.

    ``None`` when the server sent no cluster features. Only the inputs of the
    split are read, never its labels: the paper's choice at inference time, where
    a client knows what its data look like but not their labels. The mean is over
    ``num-samples`` sampled inputs when the config names it, else over all.
    """
    if p.CFG_MCFL_FEATURES not in config:
        return None
    clusters = np.asarray(config.get(p.CFG_MCFL_CLUSTERS, []), dtype=np.int64)
    features = np.asarray(config[p.CFG_MCFL_FEATURES], dtype=np.float64)
    query = learner.feature_mean(
        split, int(config.get(p.CFG_NUM_SAMPLES, learner.num_examples(split))))  # type: ignore[arg-type]
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


def proximal_centers(
    message: Message, config: ConfigRecord, chosen: ArrayRecord
) -> list[tuple[ArrayRecord, float]]:
    """The (centre, weight) pairs of this message's proximal term.

    FedSoft sends every cluster model as a centre with weight ``mu * u_k``;
    FedProx (``proximal-mu`` > 0 without centres) pulls towards the chosen model.
    """
    mu = float(config.get(p.CFG_PROX_MU, 0.0))  # type: ignore[arg-type]
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


def choose_for_training(learner: TorchLearner, message: Message, context: Context) -> ModelChoice:
    """The start model of a training task, by :func:`choose_cluster`, and its centres.

    A persistent task (local-only training, FedSoft) starts from the node's own
    kept model when it has one; the choice still names the cluster it fits best.
    """
    config = task_config(message)
    own = local_model(context) if is_persistent(config) else None
    models = candidate_models(message, own)
    cluster, losses = choose_cluster(learner, models, config, context)
    return ModelChoice(
        models,
        cluster,
        own or models[cluster],
        losses,
        tuple(proximal_centers(message, config, models[cluster])),
    )


def choose_for_evaluation(
    learner: TorchLearner, message: Message, context: Context, split: str
) -> ModelChoice:
    """The model an evaluation scores: MCFL's choice when features came, else by loss."""
    config = task_config(message)
    models = candidate_models(message)
    cluster = mcfl_choice(learner, len(models), config, split)
    if cluster is None:
        cluster, _ = choose_cluster(learner, models, config, context)
    arrays = models[cluster]
    if is_persistent(config):
        arrays = local_model(context) or arrays
    return ModelChoice(models, cluster, arrays)
