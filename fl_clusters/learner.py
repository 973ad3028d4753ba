"""Local training and evaluation of one client: the torch side of the protocol.

:class:`TorchLearner` is what the fl-clusters client handlers call. It takes any
torch model and torch datasets, so a Flower user can hand over their own network
and data (see ``fl_clusters.client_app.register_handlers``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from fl_clusters.models import arrays_to_model, model_to_arrays
from fl_clusters.optimizers import OptimizerFn, optimizer_step
from fl_clusters.protocol import reported_loss

EVAL_BATCH = 1024


class _Indexed(Dataset):
    """A map-style dataset whose samples carry their index (per-sample weights)."""

    def __init__(self, data: Dataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = self.data[index]
        return x, y, index


def resolve_device(name: str) -> torch.device:
    """Map the ``device`` run-config value to a torch device.

    ``"auto"`` takes CUDA when this process sees a GPU (in a Ray simulation, when
    the client was given a GPU fraction), else the CPU.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("run-config key 'device' is 'cuda' but this node sees no GPU; use 'auto'")
    return torch.device(name)


def centers_on(
    proximal_centers: Iterable[tuple[ArrayRecord, float]], device: torch.device
) -> list[tuple[dict[str, torch.Tensor], float]]:
    """The proximal centres that pull (weight > 0), as tensors on ``device``."""
    return [
        ({name: t.to(device) for name, t in center.to_torch_state_dict().items()}, weight)
        for center, weight in proximal_centers
        if weight > 0
    ]


def with_proximal_terms(
    loss: torch.Tensor,
    params: dict[str, torch.Tensor],
    centers: list[tuple[dict[str, torch.Tensor], float]],
) -> torch.Tensor:
    """``loss`` plus ``weight / 2 * ||w - centre||^2`` for every (centre, weight)."""
    for center, weight in centers:
        loss = loss + weight / 2 * sum(
            ((p - center[name]) ** 2).sum() for name, p in params.items()
        )
    return loss


def arrays_digest(arrays: ArrayRecord) -> bytes:
    """A digest of a model's names, dtypes, shapes and bytes: equal digests, equal models."""
    digest = hashlib.blake2b(digest_size=16)
    for name, array in arrays.items():
        digest.update(f"{name}|{array.dtype}|{tuple(array.shape)}|".encode())
        digest.update(array.data)
    return digest.digest()


class TorchLearner:
    """A client's model, data and optimizer loop.

    Parameters
    ----------
    model : nn.Module
        Network whose state dict matches the arrays the server sends.
    train_set : Dataset
        Local training data; cluster choice and training use only this.
    test_set : Dataset
        Held-out local test data; only evaluation reads it.
    validation_set : Dataset | None
        Held-out validation data for decisions that need one (ACFL's incentive test).
        When ``None``, the last fifth of ``train_set`` is NOT borrowed: callers that
        ask for the validation split get an error.
    device : torch.device
        Where training and evaluation run.
    loss_fn : Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
        Per-sample loss (``reduction="none"``); cross-entropy by default.
    """

    def __init__(
        self,
        model: nn.Module,
        train_set: Dataset,
        test_set: Dataset,
        validation_set: Dataset | None = None,
        device: torch.device | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.device = device or torch.device("cpu")
        self.model = model.to(self.device)
        self.splits: dict[str, Dataset] = {"train": train_set, "test": test_set}
        if validation_set is not None:
            self.splits["validation"] = validation_set
        self.loss_fn = loss_fn or nn.CrossEntropyLoss(reduction="none")
        # In-memory (x, y) splits move to the device once; batches are then index
        # slices of these tensors instead of a DataLoader collating sample by sample.
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
            name: (data.tensors[0].to(self.device), data.tensors[1].to(self.device))
            for name, data in self.splits.items()
            if isinstance(data, TensorDataset) and len(data.tensors) == 2
        }

    def num_examples(self, split: str = "train") -> int:
        """Number of samples in a split."""
        return len(self._split(split))  # type: ignore[arg-type]

    def _split(self, split: str) -> Dataset:
        if split not in self.splits:
            raise ValueError(f"split {split!r} is not available; have {sorted(self.splits)}")
        return self.splits[split]

    def _load(self, arrays: ArrayRecord) -> None:
        arrays_to_model(self.model, arrays)

    def _batches(
        self, split: str, batch_size: int, generator: torch.Generator | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One pass over ``split`` on the device; shuffled when ``generator`` is given.

        Shuffled passes draw from ``generator`` exactly what
        ``DataLoader(shuffle=True, generator=generator)`` draws (a base seed, the
        permutation, then the sampler's trailing permutation), so the fast path
        gives the same batches, epoch after epoch, as the DataLoader path did.
        """
        if split not in self._tensors:
            loader = DataLoader(
                self._split(split), batch_size=batch_size, shuffle=generator is not None,
                generator=generator,
            )
            for x, y in loader:
                yield x.to(self.device), y.to(self.device)
            return
        x_all, y_all = self._tensors[split]
        n = len(y_all)
        if generator is None:
            for start in range(0, n, batch_size):
                yield x_all[start : start + batch_size], y_all[start : start + batch_size]
            return
        for x, y, _ in self._indexed_batches(split, batch_size, generator):
            yield x, y

    def _indexed_batches(
        self, split: str, batch_size: int, generator: torch.Generator
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """A shuffled pass like :meth:`_batches`, each batch with its samples' indices.

        The same draws from ``generator``, hence the same batches, as the
        shuffled :meth:`_batches`; the indices select per-sample weights.
        """
        if split not in self._tensors:
            loader = DataLoader(
                _Indexed(self._split(split)), batch_size=batch_size, shuffle=True,
                generator=generator,
            )
            for x, y, idx in loader:
                yield x.to(self.device), y.to(self.device), idx.to(self.device)
            return
        x_all, y_all = self._tensors[split]
        n = len(y_all)
        torch.empty((), dtype=torch.int64).random_(generator=generator)
        order = torch.randperm(n, generator=generator).to(self.device)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            yield x_all[idx], y_all[idx], idx
        torch.randperm(n, generator=generator)

    def num_steps(self, batch_size: int, epochs: int = 1, steps: int = 0) -> int:
        """Mini-batch steps :meth:`train` takes with these settings.

        Parameters
        ----------
        batch_size : int
            Mini-batch size.
        epochs : int
            Passes over the training split (used when ``steps`` is 0).
        steps : int
            Exact number of steps; 0 = ``epochs`` passes.
        """
        if steps > 0:
            return steps
        return epochs * -(-self.num_examples("train") // batch_size)

    def train(
        self,
        arrays: ArrayRecord,
        *,
        lr: float,
        batch_size: int,
        epochs: int = 1,
        steps: int = 0,
        proximal_centers: Sequence[tuple[ArrayRecord, float]] = (),
        seed: int = 0,
        sample_weights: np.ndarray | None = None,
        optimizer_fn: OptimizerFn | None = None,
    ) -> tuple[ArrayRecord, float]:
        """Run local SGD from ``arrays`` and return the trained arrays and mean loss.

        Parameters
        ----------
        arrays : ArrayRecord
            Starting model.
        lr : float
            SGD step size.
        batch_size : int
            Mini-batch size.
        epochs : int
            Passes over the training split (used when ``steps`` is 0).
        steps : int
            Exact number of mini-batch steps (IFCA's tau); 0 = use ``epochs``.
        proximal_centers : Sequence[tuple[ArrayRecord, float]]
            (centre, weight) pairs, each adding ``weight/2 * ||w - centre||^2``
            (FedProx: the model with mu; FedSoft: every cluster with lambda * u_ks).
        seed : int
            Seed of the mini-batch order.
        sample_weights : np.ndarray | None
            One weight >= 0 per training sample (FedEM's responsibilities): a batch's
            loss is the mean of ``weight * loss``; ``None``: 1 each (same batches).
        optimizer_fn : Callable | None
            Builds the optimizer on the model's parameters (a plug-in user's, for
            FedEM's M-step); ``None``: plain SGD at ``lr``.
        """
        weights = self._sample_weights(sample_weights)
        self._load(arrays)
        step = optimizer_step(list(self.model.parameters()), lr, optimizer_fn)
        centers = centers_on(proximal_centers, self.device)
        generator = torch.Generator().manual_seed(seed)
        self.model.train()
        losses = self._descend(self.num_steps(batch_size, epochs, steps), batch_size,
                               generator, weights, centers, step)
        return model_to_arrays(self.model), float(np.mean(losses)) if losses else 0.0

    def _descend(
        self,
        total_steps: int,
        batch_size: int,
        generator: torch.Generator,
        weights: torch.Tensor | None,
        centers: list[tuple[dict[str, torch.Tensor], float]],
        step: Callable[[], object],
    ) -> list[float]:
        """``total_steps`` optimizer steps over training batches; each step's data loss."""
        params = dict(self.model.named_parameters())
        losses: list[float] = []
        while len(losses) < total_steps:
            for x, y, idx in self._training_batches(batch_size, generator, weights is not None):
                self.model.zero_grad()
                per_sample = self.loss_fn(self.model(x), y)
                loss = (per_sample if weights is None else per_sample * weights[idx]).mean()
                losses.append(float(loss.detach()))
                loss = with_proximal_terms(loss, params, centers)
                loss.backward()
                step()
                if len(losses) >= total_steps:
                    break
        return losses

    def _training_batches(
        self, batch_size: int, generator: torch.Generator, indexed: bool
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """One pass of training batches; with ``indexed`` each batch's sample indices too."""
        if indexed:
            return self._indexed_batches("train", batch_size, generator)
        return ((x, y, None) for x, y in self._batches("train", batch_size, generator))

    def _sample_weights(self, sample_weights: np.ndarray | None) -> torch.Tensor | None:
        """``sample_weights`` checked against the training split, as a device tensor."""
        if sample_weights is None:
            return None
        weights = np.asarray(sample_weights, dtype=np.float32)
        n = self.num_examples("train")
        if weights.shape != (n,) or not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError(
                f"sample_weights must hold one finite non-negative weight per training "
                f"sample ({n}), got shape {weights.shape}"
            )
        return torch.from_numpy(weights).to(self.device)

    def gradient(self, arrays: ArrayRecord) -> tuple[ArrayRecord, float]:
        """Full-batch gradient of the mean training loss at ``arrays`` (IFCA option I)."""
        self._load(arrays)
        self.model.train()
        self.model.zero_grad()
        n = self.num_examples("train")
        total = 0.0
        for x, y in self._batches("train", EVAL_BATCH):
            loss = self.loss_fn(self.model(x), y).sum() / n
            loss.backward()
            total += float(loss.detach())
        params = dict(self.model.named_parameters())
        grads = ArrayRecord()
        for name, value in self.model.state_dict().items():
            # Buffers have no gradient; zeros keep the record's keys equal to the model's.
            grad = params[name].grad if name in params else None
            grads[name] = Array.from_torch_tensor(
                (grad if grad is not None else torch.zeros_like(value)).detach().cpu()
            )
        return grads, total

    @torch.no_grad()
    def per_sample_losses(self, arrays: ArrayRecord, split: str = "train") -> np.ndarray:
        """Loss of every sample of ``split`` under ``arrays``."""
        self._load(arrays)
        self.model.eval()
        out = [
            self.loss_fn(self.model(x), y).cpu() for x, y in self._batches(split, EVAL_BATCH)
        ]
        return torch.cat(out).numpy() if out else np.zeros(0)

    def mean_losses(
        self,
        models: Sequence[ArrayRecord],
        split: str = "train",
        known: dict[bytes, float] | None = None,
    ) -> list[float]:
        """Mean loss of ``split`` under each model, skipping models whose loss is ``known``.

        A node that chooses its cluster by loss scores the same models twice: the
        models aggregated in round t reach it with round t's evaluation and again
        with round t+1's training (the last ones also with the final report).
        ``known`` maps :func:`arrays_digest` to a mean loss of this split; it is
        updated in place to hold exactly this call's models, so a caller that
        keeps it between calls (the ClientApp: in the node's ``context.state``)
        scores each model once. The losses, hence the choice, are unchanged.
        """
        memo = {} if known is None else known
        digests = [arrays_digest(m) for m in models]
        losses = [
            memo[d] if d in memo else reported_loss(self.per_sample_losses(m, split).mean())
            for d, m in zip(digests, models, strict=True)
        ]
        memo.clear()
        memo.update(zip(digests, losses, strict=True))
        return losses

    @torch.no_grad()
    def per_sample_correct(self, arrays: ArrayRecord, split: str = "test") -> np.ndarray:
        """Whether ``arrays`` classifies each sample of ``split`` correctly (bool)."""
        self._load(arrays)
        self.model.eval()
        out = [
            (self.model(x).argmax(dim=1) == y).cpu() for x, y in self._batches(split, EVAL_BATCH)
        ]
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=bool)

    @torch.no_grad()
    def per_sample_scores(
        self, arrays: ArrayRecord, split: str = "test"
    ) -> tuple[np.ndarray, np.ndarray]:
        """Loss and correctness (bool) of every sample of ``split``, in one pass."""
        self._load(arrays)
        self.model.eval()
        losses, correct = [], []
        for x, y in self._batches(split, EVAL_BATCH):
            logits = self.model(x)
            losses.append(self.loss_fn(logits, y).cpu())
            correct.append((logits.argmax(dim=1) == y).cpu())
        if not losses:
            return np.zeros(0), np.zeros(0, dtype=bool)
        return torch.cat(losses).numpy(), torch.cat(correct).numpy()

    @torch.no_grad()
    def component_scores(
        self, models: Sequence[ArrayRecord], split: str = "train"
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-sample loss and class probabilities of every model, in one pass (FedEM).

        Every batch is scored by all models before the next is read, so the rows
        of the M models refer to the same samples even when the split's loader
        shuffles (a user's loader under ``ClusteredClient``).

        Returns
        -------
        tuple[np.ndarray, np.ndarray, np.ndarray]
            Losses (M, n), softmax probabilities (M, n, C) and labels (n,).
        """
        states = [m.to_torch_state_dict() for m in models]
        self.model.eval()
        losses: list[list[torch.Tensor]] = [[] for _ in states]
        probs: list[list[torch.Tensor]] = [[] for _ in states]
        labels: list[torch.Tensor] = []
        for x, y in self._batches(split, EVAL_BATCH):
            for j, state in enumerate(states):
                self.model.load_state_dict(state, strict=True)
                logits = self.model(x)
                losses[j].append(self.loss_fn(logits, y).cpu())
                probs[j].append(torch.softmax(logits, dim=1).cpu())
            labels.append(y.cpu())
        if not labels:
            raise ValueError(f"split {split!r} of this client is empty")
        return (
            torch.stack([torch.cat(rows) for rows in losses]).numpy(),
            torch.stack([torch.cat(rows) for rows in probs]).numpy(),
            torch.cat(labels).numpy(),
        )

    @torch.no_grad()
    def evaluate(self, arrays: ArrayRecord, split: str = "test") -> tuple[float, float]:
        """Mean loss and accuracy of ``arrays`` on ``split``."""
        self._load(arrays)
        self.model.eval()
        loss_sum, correct, count = 0.0, 0, 0
        for x, y in self._batches(split, EVAL_BATCH):
            logits = self.model(x)
            loss_sum += float(self.loss_fn(logits, y).sum())
            correct += int((logits.argmax(dim=1) == y).sum())
            count += len(y)
        if count == 0:
            raise ValueError(f"split {split!r} of this client is empty")
        return loss_sum / count, correct / count

    def feature_mean(self, split: str, num_samples: int, seed: int = 0) -> np.ndarray:
        """Mean of ``num_samples`` randomly drawn flattened inputs of ``split`` (MCFL)."""
        data = self._split(split)
        n = len(data)  # type: ignore[arg-type]
        rng = np.random.default_rng(seed)
        idx = rng.choice(n, size=min(num_samples, n), replace=False)
        if split in self._tensors:
            xs = self._tensors[split][0][torch.from_numpy(idx).to(self.device)].cpu()
        else:
            xs = torch.stack([data[int(i)][0] for i in idx])
        return xs.reshape(len(idx), -1).mean(dim=0).numpy().astype(np.float64)
