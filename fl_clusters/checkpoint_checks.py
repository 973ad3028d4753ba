"""What a checkpoint's content must be before a run resumes from it.

The state tree (:mod:`fl_clusters.state_tree`) only says which values a file
holds; nothing in it says they are what a run wrote. :func:`check_fields` checks
each field's type and that its round is a round; :func:`check_cluster_models`
that the cluster models are finite. A resumed run builds its strategy from the
checkpoint's run config, as the run did, and :func:`restore_state` sets back the
attributes the checkpoint kept, each checked against the strategy just built: an
attribute it has keeps the type it has (a list stays a list, a generator a
generator), none may replace a method or property of its class, and the state
must hold every attribute the strategy keeps, which another strategy's state does
not. A checkpoint that fails is refused whole, before the federation starts,
instead of failing rounds later.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.checkpoint_archive import STATE
from fl_clusters.state_tree import DamagedCheckpoint, qualified_name
from fl_clusters.strategies.kit.interface import ServerStrategy

# What inspect.getattr_static answers for a name no class on the strategy's MRO has.
_MISSING = object()
# The type of each field of a checkpoint's state, as Checkpoint.write writes it.
FIELD_TYPES: dict[str, type] = {
    "server_round": int, "settings": dict, "strategy": dict, "arrays": ArrayRecord,
    "train_metrics": dict, "evaluate_metrics": dict, "client_states": dict,
    "start_nodes": list, "nodes_seen": set, "sent": dict, "received": dict, "unanswered": int,
}
# The types of a run config's values (Flower's UserConfigValue).
SETTING_TYPES = (bool, int, float, str)
# Fields that map rounds or keys to records and counts: their key and value types.
RECORD_FIELDS: dict[str, tuple[type, type]] = {
    "train_metrics": (int, MetricRecord), "evaluate_metrics": (int, MetricRecord),
    "client_states": (int, RecordDict), "sent": (int, int), "received": (int, int),
}


def restore_state(strategy: ServerStrategy, state: Mapping[str, Any]) -> None:
    """Set ``state``'s attributes on ``strategy``, freshly built from the run config.

    Raises
    ------
    DamagedCheckpoint
        If ``state`` lacks an attribute the strategy keeps, or an attribute in it
        replaces a method or property, or is of another type than the strategy's.
    """
    name_of_class = qualified_name(type(strategy))
    missing = sorted(set(strategy.checkpoint_state()) - set(state))
    if missing:
        raise DamagedCheckpoint(
            f"is refused: its state lacks the attributes {missing} of a {name_of_class}; "
            "it is another strategy's state or was edited"
        )
    for name, value in state.items():
        problem = _attribute_problem(strategy, name, value)
        if problem is not None:
            raise DamagedCheckpoint(
                f"is refused: its strategy attribute {name!r} {problem} of a "
                f"{name_of_class}; it was edited or written by another fl-clusters"
            )
    vars(strategy).update(state)


def check_fields(fields: Mapping[str, Any]) -> None:
    """Check each field is of the type a checkpoint writes, and its round a round.

    Raises
    ------
    DamagedCheckpoint
        Naming the first field that is not.
    """
    for name, kind in FIELD_TYPES.items():
        if type(fields[name]) is not kind:
            raise DamagedCheckpoint(f"is malformed: its field {name} is of type "
                                    f"{type(fields[name]).__name__}, not {kind.__name__}")
    for name, (key, value) in RECORD_FIELDS.items():
        if not all(type(k) is key and type(v) is value for k, v in fields[name].items()):
            raise DamagedCheckpoint(f"is malformed: its field {name} does not map "
                                    f"{key.__name__} to {value.__name__}")
    if not all(type(key) is str and type(value) in SETTING_TYPES
               for key, value in fields["settings"].items()):
        raise DamagedCheckpoint("is malformed: its field settings is not a run config (names "
                                "to numbers, strings and booleans)")
    strategy = fields["strategy"]
    if (set(strategy) != {"class", "state"} or type(strategy["class"]) is not str
            or type(strategy["state"]) is not dict):
        raise DamagedCheckpoint(f"is malformed: its {STATE} does not hold a strategy's "
                                "class and state")
    for name in ("server_round", "unanswered"):
        if fields[name] < 0:
            raise DamagedCheckpoint(f"is malformed: its {name} is {fields[name]}, and a "
                                    "count of rounds or messages is 0 or more")


def check_cluster_models(fields: Mapping[str, Any]) -> None:
    """Check every cluster model the checkpoint holds is finite (no NaN, no infinity).

    Cluster models are the packed records (:func:`~fl_clusters.protocol.pack_clusters`)
    Flower's loop passes on and the strategy keeps.

    Raises
    ------
    DamagedCheckpoint
        Naming the first array that is not finite.
    """
    state = fields["strategy"]["state"]
    records = {"arrays": fields["arrays"], **{
        f"strategy attribute {name}": value for name, value in state.items()
        if type(value) is ArrayRecord
    }}
    for where, record in records.items():
        if not p.is_packed(record):
            continue
        for name, array in record.items():
            if not np.isfinite(array.numpy()).all():
                raise DamagedCheckpoint(
                    f"is refused: its cluster model array {name!r} (in {where}) holds NaN "
                    "or infinity; the models had diverged: resume from an earlier checkpoint "
                    "or run again"
                )


def _attribute_problem(strategy: ServerStrategy, name: str, value: Any) -> str | None:
    """Why ``value`` cannot become ``strategy``'s attribute ``name``, or ``None``."""
    own = vars(strategy)
    if name in own:
        return _type_problem(own[name], value)
    if type(name) is not str or not name.isidentifier() or name.startswith("__"):
        return "is not the name of an attribute"
    found = inspect.getattr_static(type(strategy), name, _MISSING)
    if found is _MISSING:
        # An attribute the strategy never reads is inert, unless its class reads
        # it through (FlowerBaseline reads Flower's settings from Flower's strategy).
        return "would hide the setting of the same name" if hasattr(strategy, name) else None
    if callable(found) or hasattr(type(found), "__get__"):
        return "would replace the method or property of the same name"
    # A class default the strategy sets on itself later (final_round).
    return _type_problem(found, value)


def _type_problem(fresh: Any, value: Any) -> str | None:
    """Why ``value`` cannot replace ``fresh``, an attribute's value as built, or ``None``."""
    if fresh is None or _kind(fresh) == _kind(value):
        return None
    return (f"is of type {type(value).__qualname__}, where the strategy holds one of type "
            f"{type(fresh).__qualname__}")


def _kind(value: Any) -> Any:
    """What may replace ``value``: any real number a number (numpy's too), else its class."""
    if isinstance(value, bool | np.bool_):
        return bool
    if isinstance(value, Real):
        return Real
    return type(value)
