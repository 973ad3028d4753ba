"""Serve the clustered protocol with a Flower app's OWN training code.

:class:`ClusteredClient` wraps the ``@app.train`` / ``@app.evaluate`` handlers a
Flower app already has (written the FedAvg way: one model under ``"arrays"``). On a
clustered message it picks the cluster model the node should use, hands the user's
handler a FedAvg-shaped message (that model under ``"arrays"``, the server's config
untouched), calls it, and adds what the protocol needs to the reply. It also
registers the queries clustered strategies send (report, cluster_losses,
sample_assignment, features), scored with the user's model and data loaders.
FedEM's tasks are the exception: its M-step weighs every training sample, which a
FedAvg-style handler cannot do, so fl-clusters' own learner trains them; ACFL's
trial evaluations are scored here too, on the user's validation loader, since the
user's evaluate handler reads its test data whatever the server asks.
docs/plugin.md shows the change against Flower's quickstart-pytorch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import wraps
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.client_app import DEFAULT_ACTION
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.apps import pass_ray_messages_inline
from fl_clusters.client_app import (
    LOCAL_MODEL,
    _candidate_models,
    _choose_cluster,
    _cluster_losses,
    _config,
    _evaluate,
    _features,
    _identity,
    _kept_state,
    _mcfl_choice,
    _report,
    _restore_state,
    _sample_assignment,
    fedem_evaluate,
    fedem_train,
    is_mixture,
    proximal_centers,
)
from fl_clusters.learner import TorchLearner
from fl_clusters.placement import PLACEMENT, placement_report, record_training

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

NO_VALIDATION = (
    "the server asked for an evaluation on split 'validation' (ACFL's trials), and this "
    "node's loaders_fn returned (train, test) only; return (train, validation, test) with "
    "a validation loader your train() never trains on (ClusteredClient never scores a "
    "choice on the test split)"
)

GRADIENT_REFUSED = (
    "the server asked for a gradient ('return'='gradient': IFCA with mode='gradient', "
    "run-config ifca-mode=gradient); ClusteredClient returns the models the app's own "
    "train handler trains: use IFCA's default mode='model'"
)


def batch_xy(batch: Any, keys: tuple[str, str] = ("img", "label")) -> tuple[Any, Any]:
    """Split one batch into (inputs, labels).

    Parameters
    ----------
    batch : Any
        An ``(x, y)`` tuple/list (torch ``TensorDataset``) or a dict holding
        ``keys`` (flwr-datasets / Hugging Face).
    keys : tuple[str, str]
        Dict keys of the inputs and the labels.

    Raises
    ------
    ValueError
        For any other batch, saying what is expected and what came.
    """
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    if isinstance(batch, Mapping) and keys[0] in batch and keys[1] in batch:
        return batch[keys[0]], batch[keys[1]]
    got = (
        f"dict with keys {sorted(batch)}" if isinstance(batch, Mapping)
        else f"{type(batch).__name__} of length {len(batch)}"
        if isinstance(batch, tuple | list) else type(batch).__name__
    )
    raise ValueError(
        f"batches must be (x, y) tuples or dicts with keys '{keys[0]}'/'{keys[1]}'; got {got}. "
        "Pass ClusteredClient(..., batch_keys=(inputs key, labels key)) for other dict keys"
    )


class LoaderLearner(TorchLearner):
    """The scoring side of :class:`TorchLearner` on the user's data loaders.

    Cluster choice and the strategies' queries only score models (losses,
    accuracy, input means); training stays in the user's own handler, so
    :meth:`train` and :meth:`gradient` are refused.

    Parameters
    ----------
    model : nn.Module
        The user's network.
    train_loader, test_loader : Iterable
        The user's loaders (any batch format :func:`batch_xy` accepts).
    batch_keys : tuple[str, str]
        Dict keys of inputs and labels.
    device : torch.device | None
        Where scoring runs.
    loss_fn : Callable | None
        Per-sample loss (``reduction="none"``); cross-entropy by default.
    validation_loader : Iterable | None
        Held-out data for ACFL's trials; without it the ``validation`` split is refused.
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader: Iterable[Any],
        test_loader: Iterable[Any],
        batch_keys: tuple[str, str] = ("img", "label"),
        device: torch.device | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        validation_loader: Iterable[Any] | None = None,
    ) -> None:
        super().__init__(model, [], [], device=device, loss_fn=loss_fn)  # type: ignore[arg-type]
        self.loaders = {"train": train_loader, "test": test_loader}
        if validation_loader is not None:
            self.loaders["validation"] = validation_loader
        self.batch_keys = batch_keys

    def _batches(
        self, split: str, batch_size: int = 0, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over the user's loader for ``split``, on the device.

        The loader decides the batches: ``batch_size`` and ``generator`` (the
        built-in learner's batching, used by the inherited scoring methods) are
        ignored, since only whole passes are scored here, never trained on.
        """
        del batch_size, generator
        if split not in self.loaders:
            if split == "validation":
                raise ValueError(NO_VALIDATION)
            raise ValueError(
                f"split {split!r} is not available with ClusteredClient; this node's "
                f"loaders_fn gives {'/'.join(self.loaders)}"
            )
        for batch in self.loaders[split]:
            x, y = batch_xy(batch, self.batch_keys)
            yield x.to(self.device), y.to(self.device)

    def check_format(self) -> None:
        """Read the first training batch; raise the format error before any work."""
        first = next(iter(self.loaders["train"]), None)
        if first is None:
            raise ValueError("the training loader of this node yields no batch")
        batch_xy(first, self.batch_keys)

    def num_examples(self, split: str = "train") -> int:
        """Number of samples in a split (counted through its loader)."""
        return sum(len(y) for _, y in self._batches(split))

    def in_memory(self) -> TorchLearner:
        """A learner that can train, on the training samples read once into memory.

        FedEM's M-step weighs each training sample by its responsibility, so the
        samples must keep one order between the E-step and training; a loader
        that shuffles changes it every pass. The test split is left empty.
        """
        pairs = [(x.cpu(), y.cpu()) for x, y in self._batches("train")]
        x = torch.cat([x for x, _ in pairs])
        y = torch.cat([y for _, y in pairs])
        return TorchLearner(
            self.model, TensorDataset(x, y), TensorDataset(x[:0], y[:0]),
            device=self.device, loss_fn=self.loss_fn,
        )

    def train(self, *args: Any, **kwargs: Any) -> tuple[ArrayRecord, float]:
        """Refused: the user's own handler trains."""
        raise RuntimeError("ClusteredClient trains with the app's own @app.train handler")

    def gradient(self, arrays: ArrayRecord) -> tuple[ArrayRecord, float]:
        """Refused: IFCA's gradient option needs the built-in learner."""
        raise ValueError(GRADIENT_REFUSED)

    @torch.no_grad()
    def per_sample_losses(self, arrays: ArrayRecord, split: str = "train") -> np.ndarray:
        """Loss of every sample of ``split`` under ``arrays``."""
        self._load(arrays)
        self.model.eval()
        out = [self.loss_fn(self.model(x), y).cpu() for x, y in self._batches(split)]
        return torch.cat(out).numpy() if out else np.zeros(0)

    @torch.no_grad()
    def per_sample_correct(self, arrays: ArrayRecord, split: str = "test") -> np.ndarray:
        """Whether ``arrays`` classifies each sample of ``split`` correctly."""
        self._load(arrays)
        self.model.eval()
        out = [(self.model(x).argmax(dim=1) == y).cpu() for x, y in self._batches(split)]
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=bool)

    def evaluate(self, arrays: ArrayRecord, split: str = "test") -> tuple[float, float]:
        """Mean loss and accuracy of ``arrays`` on ``split``."""
        losses = self.per_sample_losses(arrays, split)
        if losses.size == 0:
            raise ValueError(f"split {split!r} of this client is empty")
        return float(losses.mean()), float(self.per_sample_correct(arrays, split).mean())

    def feature_mean(self, split: str, num_samples: int, seed: int = 0) -> np.ndarray:
        """Mean of ``num_samples`` randomly drawn flattened inputs of ``split`` (MCFL)."""
        inputs = torch.cat([x.reshape(len(x), -1).cpu() for x, _ in self._batches(split)])
        idx = np.random.default_rng(seed).choice(
            len(inputs), size=min(num_samples, len(inputs)), replace=False
        )
        return inputs[idx].mean(dim=0).numpy().astype(np.float64)


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
    reach them: fl-clusters' SGD trains the M components on the train loader's
    samples, each weighted by its responsibility, and evaluation scores the
    node's mixture on the test loader. ACFL's trial evaluations (split
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
        # FedProx/FedSoft centres of the message being handled, for regularizer().
        self._centers: list[tuple[dict[str, torch.Tensor], float]] = []
        self._guard_registration(app)
        self._register_queries(app, metadata_fn)
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
        return zero + sum(
            weight / 2 * sum(((w - center[name]) ** 2).sum() for name, w in net.named_parameters())
            for center, weight in self._centers
        )

    def train(self, handler: Handler) -> Handler:
        """Wrap a FedAvg-style ``@app.train`` handler."""

        @wraps(handler)
        def wrapped(message: Message, context: Context) -> Message:
            learner = self.learner(context)
            config = _config(message)
            if config.get(p.CFG_RETURN, "model") == "gradient":
                raise ValueError(GRADIENT_REFUSED)
            if is_mixture(message):
                # FedEM: the M-step weighs each sample by its responsibility, which
                # the app's handler cannot; fl-clusters' SGD trains the components
                # with the server's lr, local-epochs/local-steps and batch-size.
                return fedem_train(learner.in_memory(), message, context)
            persistent = bool(config.get(p.CFG_PERSISTENT, False))
            own = context.state.array_records.get(LOCAL_MODEL) if persistent else None
            models = _candidate_models(message, own)
            cluster, losses = _choose_cluster(learner, models, config, context)
            start = models[cluster]
            if persistent:
                start = own or start
            self._centers = self._proximal_centers(message, config, models[cluster])
            # The handler runs its own loop whatever local-steps asked; counting its
            # optimizer steps tells the server what it did. The hook sees every
            # optimizer of the process: one handler runs at a time per node.
            steps_done = [0]
            counter = register_optimizer_step_post_hook(
                lambda *_: steps_done.__setitem__(0, steps_done[0] + 1)
            )
            try:
                reply = self._call(handler, message, start, context)
            finally:
                counter.remove()
                self._centers = []
            metrics = self._reply_metrics(reply)
            if steps_done[0] and p.M_STEPS_DONE not in metrics:
                metrics[p.M_STEPS_DONE] = steps_done[0]
            if len(models) > 1:
                metrics[p.M_CLUSTER] = cluster
                metrics[p.M_CLUSTER_LOSSES] = losses
            if persistent and p.ARRAYS in reply.content.array_records:
                context.state[LOCAL_MODEL] = reply.content.array_records[p.ARRAYS]
            record_training(context, learner.device)
            return reply

        setattr(wrapped, WRAPPED_AS, "train")
        return wrapped

    def evaluate(self, handler: Handler) -> Handler:
        """Wrap a FedAvg-style ``@app.evaluate`` handler."""

        @wraps(handler)
        def wrapped(message: Message, context: Context) -> Message:
            learner = self.learner(context)
            config = _config(message)
            split = str(config.get(p.CFG_SPLIT, "test"))
            if split != "test":
                # The user's handler evaluates on its own test data whatever the
                # server asks, and ACFL's trials decide the clusters: they are
                # scored here, with the user's model, on the loader of that split.
                return _evaluate(learner, message, context)
            if is_mixture(message):
                # FedEM's prediction is the node's mixture of every component.
                return fedem_evaluate(learner, message, context)
            models = _candidate_models(message)
            cluster = _mcfl_choice(learner, len(models), config, "test")
            if cluster is None:
                cluster, _ = _choose_cluster(learner, models, config, context)
            arrays = models[cluster]
            if bool(config.get(p.CFG_PERSISTENT, False)):
                arrays = context.state.array_records.get(LOCAL_MODEL) or arrays
            reply = self._call(handler, message, arrays, context)
            metrics = self._reply_metrics(reply)
            if len(models) > 1:
                metrics[p.M_CLUSTER] = cluster
            return reply

        setattr(wrapped, WRAPPED_AS, "evaluate")
        return wrapped

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

    def _proximal_centers(
        self, message: Message, config: ConfigRecord, chosen: ArrayRecord
    ) -> list[tuple[dict[str, torch.Tensor], float]]:
        pairs = proximal_centers(message, config, chosen)
        device = self.device or torch.device("cpu")
        return [
            ({k: v.to(device) for k, v in c.to_torch_state_dict().items()}, w)
            for c, w in pairs
            if w > 0
        ]

    @staticmethod
    def _call(handler: Handler, message: Message, arrays: ArrayRecord, context: Context) -> Message:
        """Call ``handler`` on a FedAvg-shaped copy of ``message``'s content.

        The content is swapped in place, so the handler's ``reply_to=message``
        answers the original message; it is restored afterwards.
        """
        original = message.content
        content = RecordDict({p.ARRAYS: arrays})
        for key, record in original.config_records.items():
            content[key] = record
        message.content = content
        try:
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

    def _register_queries(
        self, app: ClientApp, metadata_fn: Callable[[Context], Mapping[str, Any]] | None
    ) -> None:
        @app.query("report")
        def report(message: Message, context: Context) -> Message:
            metadata = metadata_fn(context) if metadata_fn else {}
            reply = _report(self.learner(context), message, context, metadata)
            reply.content[PLACEMENT] = placement_report(context)
            return reply

        @app.query("sample_assignment")
        def sample_assignment(message: Message, context: Context) -> Message:
            return _sample_assignment(self.learner(context), message)

        @app.query("cluster_losses")
        def cluster_losses(message: Message, context: Context) -> Message:
            return _cluster_losses(self.learner(context), message)

        @app.query("features")
        def features(message: Message, context: Context) -> Message:
            return _features(self.learner(context), message, context)

        @app.query("identity")
        def identity(message: Message, context: Context) -> Message:
            metadata = metadata_fn(context) if metadata_fn else {}
            return _identity(message, context, metadata.get("true-cluster"))

        app.query("state")(_kept_state)
        app.query("restore")(_restore_state)
