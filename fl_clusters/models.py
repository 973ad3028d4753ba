"""Networks trained by the clients, and conversion between torch and Flower records."""

from __future__ import annotations

import weakref

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn


class MLP(nn.Module):
    """One hidden layer of ReLU units, the network of the IFCA paper's MNIST runs.

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        Shape (C, H, W) of one input.
    num_classes : int
        Output width.
    hidden : int
        Width of the hidden layer (IFCA: 200).
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, hidden: int = 200):
        super().__init__()
        channels, height, width = input_shape
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(channels * height * width, hidden))
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits."""
        return self.head(torch.relu(self.body(x)))


class CNN(nn.Module):
    """Two convolutions and two fully connected layers (IFCA's CIFAR network).

    Parameters
    ----------
    input_shape : tuple[int, int, int]
        Shape (C, H, W) of one input; H and W of at least 8.
    num_classes : int
        Output width.
    """

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        channels, height, width = input_shape
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (height // 4) * (width // 4), 128),
            nn.ReLU(),
        )
        self.head = nn.Linear(128, num_classes)
        # Channels-last weights make the convolutions' outputs channels-last too, and
        # CPU max pooling is several times faster on those than on NCHW: scoring a
        # Fashion-MNIST client's data (IFCA's choice) takes about half the time
        # (benchmarks/model_layout_speed.py). The weights' values, their arrays and the
        # inputs are unchanged; outputs agree with NCHW to float rounding.
        self.to(memory_format=torch.channels_last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits."""
        return self.head(self.body(x))


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int | None = None
) -> nn.Module:
    """Create a network by name.

    Parameters
    ----------
    name : str
        ``"mlp"`` or ``"cnn"``.
    input_shape : tuple[int, int, int]
        Shape (C, H, W) of one input.
    num_classes : int
        Output width.
    seed : int | None
        Seed of the initial weights; ``None`` leaves torch's global generator alone.
    """
    if seed is not None:
        torch.manual_seed(seed)
    if name == "mlp":
        return MLP(input_shape, num_classes)
    if name == "cnn":
        if min(input_shape[1:]) < 8:
            raise ValueError(f"model 'cnn' needs inputs of at least 8x8, got {input_shape}")
        return CNN(input_shape, num_classes)
    raise ValueError(f"model {name!r} is unknown; allowed: mlp, cnn")


def model_to_arrays(model: nn.Module) -> ArrayRecord:
    """Copy a model's state dict into an ArrayRecord (keys are the parameter names)."""
    return ArrayRecord(model.state_dict())


# Array object id -> (a weak reference to it, its decoded values). A pool node serving a
# block of logical clients loads the block's one copy of the round's model into every
# client's learner: decoding it once saves a copy of the model's bytes per client.
_decoded: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def decoded(array: Array) -> np.ndarray:
    """``array.numpy()``, decoded once per Array object (never modify the result)."""
    kept = _decoded.get(id(array))
    if kept is not None and kept[0]() is array:
        return kept[1]
    values = array.numpy()
    key = id(array)
    # The entry goes when the Array does, so a new object reusing the id is decoded anew.
    _decoded[key] = (weakref.ref(array, lambda _: _decoded.pop(key, None)), values)
    return values


def arrays_to_model(model: nn.Module, arrays: ArrayRecord) -> nn.Module:
    """Load an ArrayRecord into ``model`` in place, strictly (names and shapes must match)."""
    state = {name: torch.from_numpy(decoded(array)) for name, array in arrays.items()}
    model.load_state_dict(state, strict=True)
    return model
