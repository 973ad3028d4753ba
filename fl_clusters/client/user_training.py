"""How a Flower user's own train handler trains, recorded so that FedEM's M-step can match it.

FedEM's M-step cannot go through the user's handler (it weighs every sample by its
responsibility), so fl-clusters trains the components itself. Trained with the
built-in learner's defaults (plain SGD, the server's ``lr``, one epoch) they get a
small fraction of the local work the user's own ``train()`` does in a round (a
quickstart's SGD with momentum 0.9 for 5 epochs: about 50 times less) and stay near
chance for a whole run. So :class:`~fl_clusters.adapter.ClusteredClient` records, each
time the user's handler trains on a node, which ``torch.optim`` optimizer it stepped,
with what hyperparameters, and how many steps; the M-step trains each component
with that optimizer for that many steps (:func:`recorded_user_training`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Context

USER_TRAINING = "user-training"  # key of the record in context.state
_OPTIMIZER, _STEPS, _HYPER = "optimizer", "steps", "hyper/"

OptimizerFn = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class UserTraining:
    """The user's last local training on this node: its optimizer class, hyperparameters
    (those of its first parameter group) and number of optimizer steps."""

    optimizer: str
    hyperparameters: dict[str, Any]
    steps: int

    def optimizer_fn(self) -> OptimizerFn:
        """Builds a fresh optimizer of the user's class and hyperparameters on some parameters."""
        cls = getattr(torch.optim, self.optimizer)
        return lambda params: cls(params, **self.hyperparameters)


class StepRecorder:
    """An optimizer step hook (``register_optimizer_step_post_hook``) that counts the steps
    and keeps the optimizer that stepped last."""

    def __init__(self) -> None:
        self.steps = 0
        self.optimizer: torch.optim.Optimizer | None = None

    def __call__(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.steps += 1
        self.optimizer = optimizer


def _hyperparameters(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The constructor arguments of ``optimizer`` that a ConfigRecord can keep, with the
    values its first parameter group holds now (a scheduler's lr included).

    ``None`` (torch's "choose for me", e.g. ``foreach``) and tensors are left to the
    constructor's defaults; tuples (Adam's ``betas``) are kept as lists.
    """
    group = optimizer.param_groups[0]
    kept: dict[str, Any] = {}
    for name in optimizer.defaults:
        value = group.get(name)
        if isinstance(value, bool | int | float):
            kept[name] = value
        elif isinstance(value, tuple | list) and all(isinstance(v, int | float) for v in value):
            kept[name] = [float(v) for v in value]
    return kept


def record_user_training(context: Context, recorder: StepRecorder) -> None:
    """Keep in ``context.state`` how the user's handler just trained.

    Only a ``torch.optim`` optimizer can be rebuilt by its name; after a handler that
    stepped no optimizer or another one, the node keeps no record, and FedEM's M-step
    falls back to plain SGD (:func:`recorded_user_training`).
    """
    optimizer = recorder.optimizer
    name = type(optimizer).__name__
    if optimizer is None or getattr(torch.optim, name, None) is not type(optimizer):
        context.state.config_records.pop(USER_TRAINING, None)
        return
    hyper = {f"{_HYPER}{key}": value for key, value in _hyperparameters(optimizer).items()}
    context.state[USER_TRAINING] = ConfigRecord(
        {_OPTIMIZER: name, _STEPS: recorder.steps, **hyper})


def recorded_user_training(context: Context) -> UserTraining | None:
    """How the user's handler last trained on this node, or ``None`` when it never has
    (FedEM with ``init="random"`` never calls it)."""
    record = context.state.config_records.get(USER_TRAINING)
    if record is None:
        return None
    hyper = {key[len(_HYPER):]: tuple(value) if isinstance(value, list) else value
             for key, value in record.items() if key.startswith(_HYPER)}
    return UserTraining(str(record[_OPTIMIZER]), hyper, int(record[_STEPS]))  # type: ignore[arg-type]
