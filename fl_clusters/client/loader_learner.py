"""Scoring a Flower user's model on the user's own data loaders.

:class:`LoaderLearner` is the learner a :class:`~fl_clusters.adapter.ClusteredClient`
hands the client core: the cluster choice and the queries only score models, so it
reads the user's loaders as they are and trains nothing (the user's handler does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.utils.data import TensorDataset

from fl_clusters.learner import TorchLearner

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

    def train_batch_size(self) -> int | None:
        """The batch size of the user's train loader (``None`` for a loader without one)."""
        size = getattr(self.loaders["train"], "batch_size", None)
        return size if isinstance(size, int) and size > 0 else None

    def train_batches(self) -> int | None:
        """Batches in one pass of the user's train loader (``None`` when it has no length).

        A train handler's optimizer steps over this are the epochs it trained.
        """
        try:
            batches = len(self.loaders["train"])  # type: ignore[arg-type]
        except TypeError:
            return None
        return batches if batches > 0 else None

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


