"""Train and evaluate replies computed by fl-clusters' own learner.

The built-in ClientApp answers every train and evaluate task with these; a
:class:`~fl_clusters.adapter.ClusteredClient` answers ACFL's trial evaluations
with :func:`evaluate_reply` too. FedEM's tasks go to :mod:`fl_clusters.client.fedem`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import Context, Message, MetricRecord

from fl_clusters import protocol as p
from fl_clusters.client.backdoor import backdoor_success
from fl_clusters.client.choice import choose_for_evaluation, choose_for_training
from fl_clusters.client.task import LOCAL_MODEL, is_persistent, reply, sgd_settings, task_config
from fl_clusters.learner import TorchLearner

if TYPE_CHECKING:
    from fl_clusters.attacks import Attack


def train_reply(
    learner: TorchLearner, message: Message, context: Context, attack: Attack | None = None
) -> Message:
    """Train the chosen model (or return its gradient) and reply with it.

    A persistent task keeps the trained model in ``context.state`` for the node's
    next round. An attacker (``attack``, simulations only) chooses its cluster as
    an honest node would, on its own data, then trains on the data its attack
    alters and replies with the model its attack crafts.
    """
    config = task_config(message)
    choice = choose_for_training(learner, message, context)
    trainer = learner if attack is None else attack.trainer(learner)
    metrics = MetricRecord({p.M_NUM_EXAMPLES: learner.num_examples("train")})
    gradient = config.get(p.CFG_RETURN, "model") == "gradient"
    if gradient:
        arrays, loss = trainer.gradient(choice.arrays)
    else:
        settings = sgd_settings(config, context)
        arrays, loss = trainer.train(choice.arrays, proximal_centers=choice.centers, **settings)
        steps = learner.num_steps(settings["batch_size"], settings["epochs"], settings["steps"])
        metrics[p.M_STEPS_DONE] = steps
        per_epoch = learner.num_steps(settings["batch_size"])
        if per_epoch > 0:
            metrics[p.M_EPOCHS_DONE] = steps / per_epoch
        if is_persistent(config):
            context.state[LOCAL_MODEL] = arrays
    if attack is not None:
        # The node keeps its own trained model; only the reply is crafted.
        arrays = attack.poison(None if gradient else choice.arrays, arrays, config)
    metrics[p.M_TRAIN_LOSS] = loss
    choice.add_metrics(metrics)
    return reply(message, metrics, arrays)


def evaluate_reply(
    learner: TorchLearner, message: Message, context: Context,
    backdoor_target: int | None = None,
) -> Message:
    """Loss and accuracy of the chosen model on the split the server names.

    With ``backdoor_target`` (a simulation whose attack is a backdoor) an
    evaluation of the test split also scores the backdoor's success on the node's
    test inputs (:func:`fl_clusters.client.backdoor.backdoor_success`).
    """
    split = str(task_config(message).get(p.CFG_SPLIT, "test"))
    choice = choose_for_evaluation(learner, message, context, split)
    loss, accuracy = learner.evaluate(choice.arrays, split)
    metrics = MetricRecord(
        {
            p.M_NUM_EXAMPLES: learner.num_examples(split),
            p.M_LOSS: loss,
            p.M_ACCURACY: accuracy,
        }
    )
    choice.add_metrics(metrics)
    if backdoor_target is not None and split == "test":
        scored = backdoor_success(learner, choice.arrays, backdoor_target)
        if scored is not None:
            metrics[p.M_BACKDOOR_SUCCESS] = scored[0]
    return reply(message, metrics)
