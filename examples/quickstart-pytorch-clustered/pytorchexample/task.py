"""pytorchexample: the app's model, data and training code (nothing from fl-clusters).

Same structure and behaviour as Flower's quickstart-pytorch: a small CNN, a
``train`` loop with SGD and momentum 0.9, a ``test`` loop, dict batches
``{"img", "label"}``. The data are made offline from scikit-learn's digits (8x8
grey images) instead of downloading CIFAR-10, and the clients form
``NUM_GROUPS`` groups (partition ``i`` is in group ``i % NUM_GROUPS``): group ``g``
names every digit ``g * 10 // NUM_GROUPS`` further along (a label permutation;
with two groups, odd partitions name every digit five further along). Any two
groups disagree on every digit, so one global model cannot serve them all and
one model per group can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Context
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

NUM_GROUPS = 2

# The run config of pyproject.toml. `run_simulation` hands apps an empty run
# config, so the code carries the defaults too (a test keeps both equal).
DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 8,
    "fraction-evaluate": 1.0,
    "local-epochs": 5,
    "learning-rate": 0.03,
    "optimizer": "sgd-momentum",
    "batch-size": 16,
    "strategy": "ifca",
    "num-clusters": 2,
    "validation-fraction": 0.0,
    "results-dir": "",
}


def run_config(context: Context, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``context.run_config`` over :data:`DEFAULTS`, ``overrides`` (tests) on top."""
    return {**DEFAULTS, **context.run_config, **(overrides or {})}


class Net(nn.Module):
    """A small CNN (two convolutions, three dense layers) for 1x8x8 images."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class DigitImages(Dataset):
    """Images and labels served as dicts, like a flwr-datasets partition."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images = torch.from_numpy(images)
        self.labels = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"img": self.images[i], "label": self.labels[i]}


def group_of(partition_id: int) -> int:
    """Ground-truth group of a partition (for the final report only)."""
    return partition_id % NUM_GROUPS


@lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    digits = load_digits()
    # Pixels are 0..16; normalize to [-1, 1] as the quickstart's transform does.
    images = (digits.images[:, None] / 8.0 - 1.0).astype(np.float32)
    return images, digits.target.astype(np.int64)


def _split(images: np.ndarray, labels: np.ndarray, group: int) -> DigitImages:
    return DigitImages(images, (labels + group * 10 // NUM_GROUPS) % 10)


def _partition(partition_id: int, num_partitions: int) -> np.ndarray:
    order = np.random.default_rng(42).permutation(len(_digits()[1]))
    return np.array_split(order, num_partitions)[partition_id]


def load_data(
    partition_id: int, num_partitions: int, batch_size: int, validation_fraction: float = 0.0
) -> tuple[DataLoader, DataLoader]:
    """This partition's train and test loaders (80% / 20%, dict batches).

    ``validation_fraction`` of the 80% is held out of the train loader for
    :func:`load_validation` (ACFL's trials need data that training never saw).
    """
    images, labels = _digits()
    part = _partition(partition_id, num_partitions)
    cut = int(0.8 * len(part))
    held = int(validation_fraction * cut)
    group = group_of(partition_id)
    train_set = _split(images[part[held:cut]], labels[part[held:cut]], group)
    test_set = _split(images[part[cut:]], labels[part[cut:]], group)
    return (
        DataLoader(train_set, batch_size=batch_size, shuffle=True),
        DataLoader(test_set, batch_size=batch_size),
    )


def load_validation(
    partition_id: int, num_partitions: int, batch_size: int, validation_fraction: float
) -> DataLoader:
    """The samples ``load_data`` holds out of training at the same ``validation_fraction``."""
    images, labels = _digits()
    part = _partition(partition_id, num_partitions)
    held = part[: int(validation_fraction * int(0.8 * len(part)))]
    if len(held) == 0:
        raise ValueError(
            f"validation-fraction={validation_fraction} holds out no sample of partition "
            f"{partition_id}; ACFL needs a validation split: set it to e.g. 0.2"
        )
    return DataLoader(
        _split(images[held], labels[held], group_of(partition_id)), batch_size=batch_size
    )


def load_centralized_dataset() -> DataLoader:
    """Every digit with its true label (group 0's naming)."""
    images, labels = _digits()
    return DataLoader(_split(images, labels, 0), batch_size=128)


# Local optimizers the run-config key `optimizer` names: the quickstart's SGD with
# momentum 0.9, plain SGD and Adam (each at the run's `learning-rate`).
OPTIMIZERS = {
    "sgd-momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
}


def train(
    net: nn.Module,
    trainloader: DataLoader,
    epochs: int,
    lr: float,
    device: torch.device,
    optimizer_name: str = "sgd-momentum",
    regularizer: Callable[[nn.Module], Any] = lambda net: 0.0,
) -> float:
    """Train the model on the training set; return the mean batch loss.

    ``regularizer(net)`` is added to the loss that is backpropagated, not to the
    one reported: FedProx's and FedSoft's proximal term (docs/plugin.md).
    """
    if optimizer_name not in OPTIMIZERS:
        raise ValueError(
            f"run-config key 'optimizer' is {optimizer_name!r}; allowed: {', '.join(OPTIMIZERS)}"
        )
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = OPTIMIZERS[optimizer_name](net.parameters(), lr)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            (loss + regularizer(net)).backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader, device: torch.device) -> tuple[float, float]:
    """Mean batch loss and accuracy of the model on a test set."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for batch in testloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(dim=1) == labels).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)  # type: ignore[arg-type]
