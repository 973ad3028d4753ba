"""Train and evaluate replies computed by fl-clusters' own learner.

The built-in ClientApp answers every train and evaluate task with these; a
:class:`~fl_clusters.adapter.ClusteredClient` answers ACFL's trial evaluations
with :func:`evaluate_reply` too. FedEM's tasks go to :mod:`fl_clusters.client.fedem`.
"""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord

from fl_clusters import protocol as p
from fl_clusters.client.choice import choose_for_evaluation, choose_for_training
from fl_clusters.client.task import LOCAL_MODEL, is_persistent, reply, sgd_settings, task_config
from fl_clusters.learner import TorchLearner


def train_reply(learner: TorchLearner, message: Message, context: Context) -> Message:
    """Train the chosen model (or return its gradient) and reply with it.

    A persistent task keeps the trained model in ``context.state`` for the node's
    next round.
    """
    config = task_config(message)
    choice = choose_for_training(learner, message, context)
    metrics = MetricRecord({p.M_NUM_EXAMPLES: learner.num_examples("train")})
    if config.get(p.CFG_RETURN, "model") == "gradient":
        arrays, loss = learner.gradient(choice.arrays)
    else:
        settings = sgd_settings(config, context)
        arrays, loss = learner.train(choice.arrays, proximal_centers=choice.centers, **settings)
        steps = learner.num_steps(settings["batch_size"], settings["epochs"], settings["steps"])
        metrics[p.M_STEPS_DONE] = steps
        per_epoch = learner.num_steps(settings["batch_size"])
        if per_epoch > 0:
            metrics[p.M_EPOCHS_DONE] = steps / per_epoch
        if is_persistent(config):
            context.state[LOCAL_MODEL] = arrays
    metrics[p.M_TRAIN_LOSS] = loss
    choice.add_metrics(metrics)
    return reply(message, metrics, arrays)


def evaluate_reply(learner: TorchLearner, message: Message, context: Context) -> Message:
    """Loss and accuracy of the chosen model on the split the server names."""
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
    return reply(message, metrics)
