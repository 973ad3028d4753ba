"""The optimizers a training task builds, by the name the run config gives.

The built-in learner trains with plain SGD unless the run-config key
``optimizer`` names another recipe; a plug-in app's own optimizer reaches the
learner the same way, as an :data:`OptimizerFn` (FedEM's M-step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch

# Builds an optimizer on a model's parameters (a plug-in user's, or optimizer_for's).
OptimizerFn = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def optimizer_for(name: str, lr: float) -> OptimizerFn | None:
    """The optimizer a training task builds on its model's parameters, by name.

    ``"sgd"`` gives ``None``: :meth:`~fl_clusters.learner.TorchLearner.train`'s own
    plain SGD step. ``"sgd-momentum"`` (momentum 0.9) and ``"adam"`` are the recipes
    of Flower's quickstarts; like a user's ``train()`` they start fresh each task.
    """
    if name == "sgd":
        return None
    if name == "sgd-momentum":
        return partial(torch.optim.SGD, lr=lr, momentum=0.9)
    if name == "adam":
        return partial(torch.optim.Adam, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; use 'sgd', 'sgd-momentum' or 'adam'")
