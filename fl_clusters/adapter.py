"""Serve the clustered protocol with a Flower app's OWN training code.

:class:`ClusteredClient` wraps the ``@app.train`` / ``@app.evaluate`` handlers a
Flower app already has (written the FedAvg way: one model under ``"arrays"``). On a
clustered message it picks the cluster model the node should use, hands the user's
handler a FedAvg-shaped message (that model under ``"arrays"``, the server's config
untouched), calls it, and adds what the protocol needs to the reply. It also
registers the queries clustered strategies send (report, cluster_losses,
sample_assignment, features, and the queries a strategy declares itself,
``query.strategy``), scored with the user's model and data loaders.
FedEM's tasks are the exception: its M-step weighs every training sample, which a
FedAvg-style handler cannot do, so fl-clusters' own learner trains them, as many steps
as the handler takes; ACFL's
trial evaluations are scored here too, on the user's validation loader, since the
user's evaluate handler reads its test data whatever the server asks.
docs/plugin.md shows the change against Flower's quickstart-pytorch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import wraps
from logging import WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import DEFAULT_ACTION
from flwr.common.logger import log
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from fl_clusters import protocol as p
from fl_clusters.client.blocks import per_client
from fl_clusters.client.choice import choose_for_evaluation, choose_for_training
from fl_clusters.client.fedem import fedem_evaluate, fedem_train, is_mixture
from fl_clusters.client.loader_learner import GRADIENT_REFUSED, LoaderLearner
from fl_clusters.client.queries import ClientNode, no_metadata, register_queries
from fl_clusters.client.replies import evaluate_reply
from fl_clusters.client.task import LOCAL_MODEL, batch_seed, is_persistent, task_config
from fl_clusters.client.user_training import (
    StepRecorder,
    UserTraining,
    record_user_training,
    recorded_user_training,
)
from fl_clusters.learner import centers_on, with_proximal_terms
from fl_clusters.placement import record_training
from fl_clusters.ray_env import pass_ray_messages_inline

Handler = Callable[[Message, Context], Message]
# (train, test) or (train, validation, test): ACFL's trials score the validation one.
Loaders = tuple[Iterable[Any], Iterable[Any]] | tuple[Iterable[Any], Iterable[Any], Iterable[Any]]
# Attribute naming the handler category ("train"/"evaluate") a wrapper serves.
WRAPPED_AS = "_clustered_handler"
# Metric names of Flower's quickstart-pytorch, mapped to the protocol's.
DEFAULT_METRIC_NAMES: dict[str, str] = {
    "train_loss": p.M_TRAIN_LOSS,
    "eval_loss": p.M_LOSS,
    "eval_acc": p.M_ACCURACY,
}


class ClusteredClient:
    """Make a FedAvg-style Flower ClientApp speak fl-clusters' protocol.

    Create it right after ``app = ClientApp()`` and wrap both default handlers
    (``@app.train()`` above ``@clustered.train``, ``@app.evaluate()`` above
    ``@clustered.evaluate``); the constructor registers the queries on ``app``.
    From then on ``app`` refuses a default train or evaluate handler that is not
    wrapped (``ValueError`` when the app is loaded): clustered strategies send it
    several models under ``"clusters"``, which a FedAvg-style handler cannot read.
    The user's handlers keep their code, optimizer and ``context.run_config``;
    the message they get carries one model under ``"arrays"`` and the server's
    config record unchanged. FedEM's tasks (config ``"mixture"``=true) do not
    reach them: fl-clusters trains the M components on the train loader's
    samples, each weighted by its responsibility, for as many steps as the train
    handler last took on the node (with its ``torch.optim.SGD`` when it uses one,
    :mod:`~fl_clusters.client.user_training`), and evaluation scores the node's
    mixture on the test loader. ACFL's trial evaluations (split
    ``validation``) do not reach the evaluate handler either: they are scored
    with ``model_fn``'s network on the validation loader.

    Parameters
    ----------
    app : ClientApp
        The user's ClientApp; receives the query handlers.
    model_fn : Callable[[], nn.Module]
        Builds the user's network (its state dict matches the server's arrays).
    loaders_fn : Callable[[Context], tuple]
        This node's ``(train, test)`` or ``(train, validation, test)`` loaders.
        Cluster choice by loss reads the TRAIN loader only; the final report
        scores every cluster model on the test one; ACFL's trials score models on
        the validation one, which ACFL needs (its data must not be trained on).
    batch_keys : tuple[str, str] (default: ("img", "label"))
        Dict keys of inputs and labels when batches are dicts.
    loss_fn : Callable | None
        Per-sample loss ``loss_fn(logits, labels)`` with ``reduction="none"``,
        used for the cluster choice; cross-entropy by default.
    metric_names : Mapping[str, str] | None
        Reply metric names to copy to protocol names (default: quickstart-pytorch's
        ``train_loss``/``eval_loss``/``eval_acc`` to ``train-loss``/``loss``/``accuracy``).
    metadata_fn : Callable[[Context], Mapping[str, Any]] | None
        Extra values for the final report (e.g. a ground-truth group).
    device : torch.device | None
        Where the cluster choice runs (CPU by default).
    """

    def __init__(
        self,
        app: ClientApp,
        model_fn: Callable[[], nn.Module],
        loaders_fn: Callable[[Context], Loaders],
        *,
        batch_keys: tuple[str, str] = ("img", "label"),
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        metric_names: Mapping[str, str] | None = None,
        metadata_fn: Callable[[Context], Mapping[str, Any]] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.model_fn = model_fn
        self.loaders_fn = loaders_fn
        self.batch_keys = batch_keys
        self.loss_fn = loss_fn
        self.metric_names = dict(DEFAULT_METRIC_NAMES if metric_names is None else metric_names)
        self.device = device
        self._warned_plain_m_step = False
        # FedProx/FedSoft centres of the message being handled, for regularizer().
        self._centers: list[tuple[dict[str, torch.Tensor], float]] = []
        self._guard_registration(app)
        register_queries(
            app, ClientNode(self.learner, metadata_fn or no_metadata, load_at_handshake=False)
        )
        pass_ray_messages_inline()

    def learner(self, context: Context) -> LoaderLearner:
        """A scorer on this node's loaders; checks their number and batch format first."""
        loaders = self.loaders_fn(context)
        if not isinstance(loaders, tuple | list) or len(loaders) not in (2, 3):
            got = f"{len(loaders)} loaders" if isinstance(loaders, tuple | list) else (
                type(loaders).__name__)
            raise ValueError(
                f"loaders_fn must return (train, test) or (train, validation, test) loaders; "
                f"got {got}"
            )
        train_loader, *validation, test_loader = loaders
        learner = LoaderLearner(
            self.model_fn(), train_loader, test_loader, self.batch_keys, self.device,
            self.loss_fn, validation[0] if validation else None,
        )
        learner.check_format()
        return learner

    def regularizer(self, net: nn.Module) -> torch.Tensor:
        """The proximal term the server asked for, to add to the training loss.

        ``sum_k weight_k / 2 * ||w - centre_k||^2`` over the centres of the current
        train message: FedProx's ``proximal-mu`` around the received model, or
        FedSoft's centres. Zero when the server sent none, so adding it always is safe.
        """
        zero = next(net.parameters()).new_zeros(())
        return with_proximal_terms(zero, dict(net.named_parameters()), self._centers)

    def train(self, handler: Handler) -> Handler:
        """Wrap a FedAvg-style ``@app.train`` handler."""

        @wraps(handler)
        def wrapped(message: Message, context: Context) -> Message:
            learner = self.learner(context)
            config = task_config(message)
            if config.get(p.CFG_RETURN, "model") == "gradient":
                raise ValueError(GRADIENT_REFUSED)
            if is_mixture(message):
                # FedEM: the M-step weighs each sample by its responsibility, which
                # the app's handler cannot; fl-clusters trains the components with
                # the steps and batch size of the app's own training as last seen on
                # this node, and its optimizer when it is SGD (user_training).
                user_training = recorded_user_training(context)
                self._warn_plain_m_step(user_training)
                return fedem_train(learner.in_memory(), message, context, user_training,
                                   learner.train_batch_size())
            choice = choose_for_training(learner, message, context)
            self._centers = centers_on(choice.centers, self.device or torch.device("cpu"))
            # The handler runs its own loop whatever local-steps asked; counting its
            # optimizer steps tells the server what it did. The hook sees every
            # optimizer of the process: one handler runs at a time per node.
            # FedEM's M-step trains as the handler did (record_user_training).
            recorder = StepRecorder()
            counter = register_optimizer_step_post_hook(recorder)
            try:
                reply = self._call(handler, message, choice.arrays, context)
            finally:
                counter.remove()
                self._centers = []
            record_user_training(context, recorder)
            metrics = self._reply_metrics(reply)
            if recorder.steps and p.M_STEPS_DONE not in metrics:
                metrics[p.M_STEPS_DONE] = recorder.steps
            batches = learner.train_batches()
            if recorder.steps and batches and p.M_EPOCHS_DONE not in metrics:
                metrics[p.M_EPOCHS_DONE] = recorder.steps / batches
            choice.add_metrics(metrics)
            if is_persistent(config) and p.ARRAYS in reply.content.array_records:
                context.state[LOCAL_MODEL] = reply.content.array_records[p.ARRAYS]
            record_training(context, learner.device)
            return reply

        # A block of logical clients reaches the handler client by client.
        served = wraps(handler)(per_client(wrapped))
        setattr(served, WRAPPED_AS, "train")
        return served

    def evaluate(self, handler: Handler) -> Handler:
        """Wrap a FedAvg-style ``@app.evaluate`` handler."""

        @wraps(handler)
        def wrapped(message: Message, context: Context) -> Message:
            learner = self.learner(context)
            split = str(task_config(message).get(p.CFG_SPLIT, "test"))
            if split != "test":
                # The user's handler evaluates on its own test data whatever the
                # server asks, and ACFL's trials decide the clusters: they are
                # scored here, with the user's model, on the loader of that split.
                return evaluate_reply(learner, message, context)
            if is_mixture(message):
                # FedEM's prediction is the node's mixture of every component.
                return fedem_evaluate(learner, message, context)
            choice = choose_for_evaluation(learner, message, context, "test")
            reply = self._call(handler, message, choice.arrays, context)
            choice.add_metrics(self._reply_metrics(reply))
            return reply

        # A block of logical clients reaches the handler client by client.
        served = wraps(handler)(per_client(wrapped))
        setattr(served, WRAPPED_AS, "evaluate")
        return served

    def _warn_plain_m_step(self, user_training: UserTraining | None) -> None:
        """Say once why FedEM's M-step trains with plain SGD at the server's lr, if it does."""
        if self._warned_plain_m_step:
            return
        if user_training is None:
            self._warned_plain_m_step = True
            log(WARNING, "FedEM: your train handler has not trained on this node (FedEM's "
                "init='random' never calls it), so its M-step trains the components with "
                "plain SGD at the server's lr, local-epochs/local-steps and batch-size "
                "(docs/plugin.md, FedEM)")
        elif user_training.optimizer_fn() is None:
            self._warned_plain_m_step = True
            log(WARNING, "FedEM: your train handler steps %s, whose steps do not scale with "
                "the loss, so they would ignore FedEM's per-sample responsibilities; its "
                "M-step takes your handler's %d steps with plain SGD at the server's lr: "
                "send FedEM an SGD-sized lr in train_config (docs/plugin.md, FedEM)",
                user_training.optimizer, user_training.steps)

    @staticmethod
    def _guard_registration(app: ClientApp) -> None:
        """Make ``app`` refuse default train/evaluate handlers this object does not wrap.

        Every train and evaluate message of a clustered strategy reaches the
        default handlers, most with several models under ``"clusters"``; an
        unwrapped FedAvg-style handler fails on each (``KeyError: 'arrays'``),
        round after round, while the run goes on. Failing at registration, when
        the app is loaded, names the fix before any round runs.
        """
        registered = [
            name for name in (f"train.{DEFAULT_ACTION}", f"evaluate.{DEFAULT_ACTION}")
            # Flower offers no public view of the registered handlers.
            if name in app._registered_funcs
        ]
        if registered:
            raise ValueError(
                f"the app already has {' and '.join(registered)} handlers, which ClusteredClient "
                "cannot wrap any more: create it right after `app = ClientApp()`, before "
                "@app.train() / @app.evaluate(), and put @clustered.train / "
                "@clustered.evaluate under them"
            )
        for category in ("train", "evaluate"):
            register = getattr(app, category)

            def checked(
                action: str = DEFAULT_ACTION,
                *,
                mods: list[Any] | None = None,
                _register: Callable[..., Callable[[Handler], Handler]] = register,
                _category: str = category,
            ) -> Callable[[Handler], Handler]:
                decorator = _register(action, mods=mods)
                if action != DEFAULT_ACTION:
                    # Named actions are the app's own; strategies never send them.
                    return decorator

                def check(handler: Handler) -> Handler:
                    wrapped_as = getattr(handler, WRAPPED_AS, None)
                    if wrapped_as != _category:
                        name = getattr(handler, "__name__", repr(handler))
                        got = (f"is wrapped with @clustered.{wrapped_as}" if wrapped_as
                               else "is not wrapped by ClusteredClient")
                        raise ValueError(
                            f"@app.{_category}() handler {name!r} {got}: clustered strategies "
                            f"send it several models under '{p.CLUSTERS}', which a FedAvg-style "
                            "handler cannot read (KeyError: 'arrays' on every message). Put "
                            f"@clustered.{_category} directly under @app.{_category}()"
                        )
                    return decorator(handler)

                return check

            setattr(app, category, checked)

    @staticmethod
    def _call(handler: Handler, message: Message, arrays: ArrayRecord, context: Context) -> Message:
        """Call ``handler`` on a FedAvg-shaped copy of ``message``'s content.

        The content is swapped in place, so the handler's ``reply_to=message``
        answers the original message; it is restored afterwards. The handler runs
        with torch's random generator seeded from the round and the node's key
        (the built-in learner's batch seed), and the generator's state is restored
        after: a user's ``DataLoader(shuffle=True)`` or dropout draws from it, and
        which Ray actor ran the node's last task would otherwise decide the draws,
        so the same seed would not give the same run.
        """
        original = message.content
        content = RecordDict({p.ARRAYS: arrays})
        for key, record in original.config_records.items():
            content[key] = record
        message.content = content
        seed = batch_seed(task_config(message), context)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                return handler(message, context)
        finally:
            message.content = original

    def _reply_metrics(self, reply: Message) -> MetricRecord:
        """The reply's ``"metrics"`` record with the protocol's names added."""
        if reply.has_error():
            return MetricRecord()
        records = reply.content.metric_records
        if p.METRICS not in records:
            raise ValueError(
                f"the app's handler replied without a MetricRecord under '{p.METRICS}' "
                f"(has {sorted(records)}); reply with at least '{p.M_NUM_EXAMPLES}'"
            )
        metrics = records[p.METRICS]
        for theirs, ours in self.metric_names.items():
            if theirs in metrics and ours not in metrics:
                metrics[ours] = metrics[theirs]
        if p.M_NUM_EXAMPLES not in metrics:
            raise ValueError(
                f"the app's handler replied without '{p.M_NUM_EXAMPLES}' in its "
                f"'{p.METRICS}' record; strategies weight every reply by it"
            )
        return metrics
