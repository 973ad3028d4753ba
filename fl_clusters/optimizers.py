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


def optimizer_step(
    params: list[torch.nn.Parameter], lr: float, optimizer_fn: OptimizerFn | None
) -> Callable[[], object]:
    """The step a training task takes after each backward pass.

    ``optimizer_fn``'s optimizer on ``params``, built once for the task; ``None``:
    plain SGD at ``lr`` (:func:`sgd_step`).
    """
    if optimizer_fn is None:
        return partial(sgd_step, params, lr)
    return optimizer_fn(params).step


def sgd_step(params: Iterable[torch.Tensor], lr: float) -> None:
    """One plain SGD step, ``p -= lr * p.grad``: what ``torch.optim.SGD(lr=lr).step()`` does.

    Written out because constructing ``torch.optim.SGD`` imports ``torch._dynamo``
    (about 1 s, measured), once in every process that trains: every simulation
    actor paid it on its first message, on the critical path of round 1.
    """
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
