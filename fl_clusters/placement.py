"""Where a client trained: its Ray node and device, kept in the node's own state.

In a Ray simulation any ClientApp actor, on any node of the Ray cluster, may run a
client's next message, so placement is a property of each training task. The
node's ``context.state`` (which Flower carries from message to message, whichever
actor runs it) counts the tasks per (Ray node, device) and keeps the last one;
the final report hands both to the ServerApp (``assignments.csv``, ``summary.json``).
Outside Ray (a SuperNode of a deployment) the Ray node is ``"none"``.
"""

from __future__ import annotations

import os

import torch
from flwr.app import ConfigRecord, Context

# context.state key of the counts, and the report's record of them.
PLACEMENT = "placement"
LAST = "last"
SEPARATOR = "|"
# No Ray node (a deployment's SuperNode), or no training yet. Flower's records
# cannot size an empty string, so "unknown" is a word.
NOWHERE = "none"


def ray_node_id() -> str:
    """This process's Ray node id, or ``"none"`` outside a Ray worker."""
    try:
        import ray
    except ImportError:
        return NOWHERE
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else NOWHERE


def device_name(device: torch.device) -> str:
    """``cpu``, or ``cuda:<physical GPU index>`` for a CUDA device.

    Ray hands each actor its GPUs through ``CUDA_VISIBLE_DEVICES``, so torch's
    ``cuda:0`` in two actors can be two different GPUs; the physical index says
    which.
    """
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    return f"cuda:{visible[index] if index < len(visible) else index}"


def record_training(context: Context, device: torch.device) -> None:
    """Count one training task of this node on this Ray node and device."""
    where = ray_node_id() + SEPARATOR + device_name(device)
    counts = context.state.config_records.get(PLACEMENT) or ConfigRecord()
    counts[where] = int(counts.get(where, 0)) + 1  # type: ignore[arg-type]
    counts[LAST] = where
    context.state[PLACEMENT] = counts


def placement_report(context: Context) -> ConfigRecord:
    """The node's placement for the final report.

    ``ray-node`` and ``device`` of its last training task (``"none"`` when it
    never trained), and ``tasks``: its training tasks per place (``places``, each
    ``"<ray node>|<device>"``), both absent when it never trained.
    """
    counts = context.state.config_records.get(PLACEMENT) or ConfigRecord()
    last = str(counts.get(LAST, NOWHERE + SEPARATOR + NOWHERE))
    node, device = last.split(SEPARATOR, 1)
    report = ConfigRecord({"ray-node": node, "device": device})
    places = [key for key in counts if key != LAST]
    # Flower cannot size an empty list in a record: a node that never trained has none.
    if places:
        report["places"] = places
        report["tasks"] = [int(counts[key]) for key in places]  # type: ignore[arg-type]
    return report
