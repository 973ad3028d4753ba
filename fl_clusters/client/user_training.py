"""How a Flower user's own train handler trains, recorded so that FedEM's M-step can match it.

FedEM's M-step cannot go through the user's handler (it weighs every sample by its
responsibility), so fl-clusters trains the components itself. Trained with the
built-in learner's defaults (plain SGD, the server's ``lr``, one epoch) they get
about 1/100 of the local progress a quickstart's own ``train()`` makes in a round
(SGD with momentum 0.9, 5 epochs) and stay near chance for a whole run. So
:class:`~fl_clusters.adapter.ClusteredClient` records, each time the user's handler
trains on a node, how many optimizer steps it took and which optimizer, and the
M-step takes as many steps (:func:`recorded_user_training`).

Only ``torch.optim.SGD`` is rebuilt with the user's hyperparameters (momentum, ...):
its steps are linear in the gradient, so a sample's responsibility scales its pull.
Adaptive optimizers (Adam, ...) normalize the gradient's scale away: a node whose
samples a component explains with responsibilities near 0 would still take
full-size steps on it and pull it towards its own group. Under them the M-step
uses plain SGD at the server's ``lr``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Context

from fl_clusters.optimizers import OptimizerFn

USER_TRAINING = "user-training"  # key of the record in context.state
_OPTIMIZER, _STEPS, _HYPER = "optimizer", "steps", "hyper/"
SGD = "SGD"  # the one optimizer the M-step rebuilds (the module docstring says why)


@dataclass(frozen=True)
class UserTraining:
    """The user's last local training on this node: the class name of the optimizer it
    stepped, that optimizer's hyperparameters (of its first parameter group; kept for
    ``torch.optim.SGD`` only) and its number of optimizer steps."""

    optimizer: str
    hyperparameters: dict[str, Any]
    steps: int

    def optimizer_fn(self) -> OptimizerFn | None:
        """Builds a fresh ``torch.optim.SGD`` with the user's hyperparameters on some
        parameters; ``None`` when the user's optimizer is another one."""
        if self.optimizer != SGD:
            return None
        return lambda params: torch.optim.SGD(params, **self.hyperparameters)


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
    """Keep in ``context.state`` how the user's handler just trained (no record when it
    stepped no optimizer)."""
    optimizer = recorder.optimizer
    if optimizer is None:
        context.state.config_records.pop(USER_TRAINING, None)
        return
    is_sgd = type(optimizer) is torch.optim.SGD
    hyper = _hyperparameters(optimizer) if is_sgd else {}
    context.state[USER_TRAINING] = ConfigRecord({
        _OPTIMIZER: SGD if is_sgd else type(optimizer).__qualname__, _STEPS: recorder.steps,
        **{f"{_HYPER}{key}": value for key, value in hyper.items()},
    })


def recorded_user_training(context: Context) -> UserTraining | None:
    """How the user's handler last trained on this node, or ``None`` when it never has
    (FedEM with ``init="random"`` never calls it) or stepped no optimizer."""
    record = context.state.config_records.get(USER_TRAINING)
    if record is None:
        return None
    hyper = {key[len(_HYPER):]: tuple(value) if isinstance(value, list) else value
             for key, value in record.items() if key.startswith(_HYPER)}
    return UserTraining(str(record[_OPTIMIZER]), hyper, int(record[_STEPS]))  # type: ignore[arg-type]
