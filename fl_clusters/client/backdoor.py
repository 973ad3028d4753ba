"""The backdoor's trigger, and how often it fools a model on a node's test inputs.

A backdoor attacker (:mod:`fl_clusters.attacks`) stamps the trigger on a share of
its training inputs and labels them its target class; every node of such a
simulation scores the same trigger on its own held-out test inputs, in its
evaluation replies and its final report (``backdoor-success``).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ArrayRecord
from torch.utils.data import TensorDataset

from fl_clusters.learner import TorchLearner

TRIGGER_PIXELS = 3  # the trigger is the bottom-right TRIGGER_PIXELS x TRIGGER_PIXELS patch
# Nodes whose triggered test inputs a process keeps: node_data.NODES_KEPT, the nodes
# whose learners it keeps (imported from there, this module would tie the two).
KEPT = 32


def stamp_trigger(x: torch.Tensor, value: float) -> torch.Tensor:
    """``x`` (N, ..., H, W) with the bottom-right trigger patch of each input set to ``value``."""
    if x.dim() < 3:
        raise ValueError(f"the backdoor's trigger needs image inputs (N, ..., H, W); got "
                         f"shape {tuple(x.shape)}")
    stamped = x.clone()
    stamped[..., -TRIGGER_PIXELS:, -TRIGGER_PIXELS:] = value
    return stamped


def split_tensors(learner: TorchLearner, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = learner.splits.get(split)
    if not isinstance(data, TensorDataset) or len(data.tensors) != 2:
        raise ValueError(f"the attacks read the {split} split as a TensorDataset of "
                         "(inputs, labels), as fl-clusters' own ClientApp holds it")
    return data.tensors[0], data.tensors[1]


def trigger_value(learner: TorchLearner) -> float:
    """The trigger's pixel value: the largest value of the node's training inputs."""
    return float(split_tensors(learner, "train")[0].max())



@lru_cache(maxsize=KEPT)
def _triggered_test(learner: TorchLearner, target: int) -> TorchLearner | None:
    """A learner whose test split is the node's non-target test inputs, stamped,
    labelled ``target``: its accuracy is the backdoor's success. ``None``: no such input."""
    x, y = split_tensors(learner, "test")
    keep = y != target
    if not bool(keep.any()):
        return None
    stamped = stamp_trigger(x[keep], trigger_value(learner))
    triggered = TensorDataset(stamped, torch.full_like(y[keep], target))
    return TorchLearner(learner.model, TensorDataset(stamped[:0], y[:0]), triggered,
                        device=learner.device, loss_fn=learner.loss_fn)


def backdoor_success(
    learner: TorchLearner, arrays: ArrayRecord, target: int
) -> tuple[float, int] | None:
    """Share of the node's non-target test inputs that ``arrays`` predicts as ``target``
    once triggered, and their number; ``None`` when every test input is of ``target``."""
    probe = _triggered_test(learner, target)
    if probe is None:
        return None
    return probe.evaluate(arrays, "test")[1], probe.num_examples("test")
