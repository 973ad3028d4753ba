"""Serve the clustered protocol with a Flower app's OWN training code.

:class:`ClusteredClient` wraps the ``@app.train`` / ``@app.evaluate`` handlers a
Flower app already has (written the FedAvg way: one model under ``"arrays"``). On a
clustered message it picks the cluster model the node should use, hands the user's
handler a FedAvg-shaped message (that model under ``"arrays"``, the server's config
untouched), calls it, and adds what the protocol needs to the reply. It also
registers the queries clustered strategies send (report, cluster_losses,
sample_assignment, features), scored with the user's model and data loaders.
FedEM's tasks are the exception: its M-step weighs every training sample, which a
FedAvg-style handler cannot do, so fl-clusters' own learner trains them.
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
from torch import nn
from torch.utils.data import TensorDataset

from fl_clusters import protocol as p
from fl_clusters.apps import pass_ray_messages_inline
from fl_clusters.client_app import (
    LOCAL_MODEL,
    _candidate_models,
    _choose_cluster,
    _cluster_losses,
    _config,
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

Handler = Callable[[Message, Context], Message]
Loaders = tuple[Iterable[Any], Iterable[Any]]
# Metric names of Flower's quickstart-pytorch, mapped to the protocol's.
DEFAULT_METRIC_NAMES: dict[str, str] = {
    "train_loss": p.M_TRAIN_LOSS,
    "eval_loss": p.M_LOSS,
    "eval_acc": p.M_ACCURACY,
}

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
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader: Iterable[Any],
        test_loader: Iterable[Any],
        batch_keys: tuple[str, str] = ("img", "label"),
        device: torch.device | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__(model, [], [], device=device, loss_fn=loss_fn)  # type: ignore[arg-type]
        self.loaders = {"train": train_loader, "test": test_loader}
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
            raise ValueError(
                f"split {split!r} is not available with ClusteredClient; have train/test"
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

    Wrap the app's handlers (``@app.train()`` above ``@clustered.train``) and the
    queries are registered on ``app`` by the constructor. The user's handlers keep
    their code, optimizer and ``context.run_config``; the message they get carries
    one model under ``"arrays"`` and the server's config record unchanged. FedEM's
    tasks (config ``"mixture"``=true) do not reach them: fl-clusters' SGD trains
    the M components on the train loader's samples, each weighted by its
    responsibility, and evaluation scores the node's mixture on the test loader.

    Parameters
    ----------
    app : ClientApp
        The user's ClientApp; receives the query handlers.
    model_fn : Callable[[], nn.Module]
        Builds the user's network (its state dict matches the server's arrays).
    loaders_fn : Callable[[Context], tuple[Iterable, Iterable]]
        This node's (train, test) loaders. Cluster choice by loss reads the TRAIN
        loader only; the final report scores every cluster model on the test one.
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
        self._register_queries(app, metadata_fn)
        pass_ray_messages_inline()

    def learner(self, context: Context) -> LoaderLearner:
        """A scorer on this node's loaders; checks the batch format first."""
        train_loader, test_loader = self.loaders_fn(context)
        learner = LoaderLearner(
            self.model_fn(), train_loader, test_loader, self.batch_keys, self.device, self.loss_fn
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
            try:
                reply = self._call(handler, message, start, context)
            finally:
                self._centers = []
            metrics = self._reply_metrics(reply)
            if len(models) > 1:
                metrics[p.M_CLUSTER] = cluster
                metrics[p.M_CLUSTER_LOSSES] = losses
            if persistent and p.ARRAYS in reply.content.array_records:
                context.state[LOCAL_MODEL] = reply.content.array_records[p.ARRAYS]
            return reply

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
                # server asks; scoring ACFL's trials there would leak the test split.
                raise ValueError(
                    f"the server asked for an evaluation on split {split!r} (ACFL's trials); "
                    "ClusteredClient evaluates with the app's test data only: run ACFL "
                    "with fl-clusters' own ClientApp (register_handlers)"
                )
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

        return wrapped

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
            return _report(self.learner(context), message, context, metadata)

        @app.query("sample_assignment")
        def sample_assignment(message: Message, context: Context) -> Message:
            return _sample_assignment(self.learner(context), message)

        @app.query("cluster_losses")
        def cluster_losses(message: Message, context: Context) -> Message:
            return _cluster_losses(self.learner(context), message)

        @app.query("features")
        def features(message: Message, context: Context) -> Message:
            return _features(self.learner(context), message, context)

        app.query("identity")(_identity)
        app.query("state")(_kept_state)
        app.query("restore")(_restore_state)
