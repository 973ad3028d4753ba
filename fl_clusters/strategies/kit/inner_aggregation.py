"""Flower's own strategies as the rule that averages one cluster's members.

A clustered strategy groups its replies by cluster; inside a cluster it can hand
the members' models to one of Flower's aggregating strategies (robust ones:
FedMedian, FedTrimmedAvg, Krum, MultiKrum, Bulyan; server optimizers: FedAdam,
FedYogi, FedAdagrad, FedAvgM; server-side DP clipping) instead of its own mean.
Flower's classes do the arithmetic; this module only speaks to them as Flower's
round loop would: it gives a strategy the model its members trained from (what
``configure_train`` records), hands it one reply per member carrying the model
and its weight, and reads back what ``aggregate_train`` returns.

The strategy's state between rounds (FedAdam's moments, FedAvgM's momentum, an
adaptive clipping norm) is read out as plain data (:func:`strategy_state`) so that
a checkpoint can keep it, and set back on a fresh copy (:func:`restored`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedTrimmedAvg,
    FedYogi,
    Krum,
    MultiKrum,
    Strategy,
)
from flwr.serverapp.strategy.fedopt import FedOpt

from fl_clusters import protocol as p
from fl_clusters.strategies.kit.replies import num_examples

# The run config's names of the strategies an inner aggregation can be
# (``inner-aggregation``); "mean" is the clustered strategy's own mean.
MEAN = "mean"
INNER_STRATEGIES: dict[str, type[Strategy]] = {
    "fedavg": FedAvg,
    "fedmedian": FedMedian,
    "fedtrimmedavg": FedTrimmedAvg,
    "krum": Krum,
    "multikrum": MultiKrum,
    "bulyan": Bulyan,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
    "fedadagrad": FedAdagrad,
    "fedavgm": FedAvgM,
    "dp-fixed-clipping": DifferentialPrivacyServerSideFixedClipping,
    "dp-adaptive-clipping": DifferentialPrivacyServerSideAdaptiveClipping,
}
DP_WRAPPERS = (DifferentialPrivacyServerSideFixedClipping,
               DifferentialPrivacyServerSideAdaptiveClipping)
# Flower's arguments about sampling and record keys: the clustered strategy samples
# and the replies handed over use Flower's default keys, so none is the user's to set.
# Objects (Bulyan's selection rule, a privacy accountant) are set from Python only.
_OWN_ARGUMENTS = frozenset({
    "fraction_train", "fraction_evaluate", "min_train_nodes", "min_evaluate_nodes",
    "min_available_nodes", "weighted_by_key", "arrayrecord_key", "configrecord_key",
    "train_metrics_aggr_fn", "evaluate_metrics_aggr_fn", "strategy", "num_sampled_clients",
    "selection_rule", "accountant",
})


class InnerAggregationError(ValueError):
    """An inner aggregation that cannot be built or used, with the fix."""


def _option_value(text: str) -> bool | int | float | str:
    """A value of ``inner-options`` as written: a bool, an int, a float, else the text."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)  # type: ignore[no-any-return]
        except ValueError:
            continue
    return text.strip()


def parse_options(text: str) -> dict[str, bool | int | float | str]:
    """``"beta=0.2, num_malicious_nodes=1"`` as keyword arguments.

    Raises
    ------
    InnerAggregationError
        For an item that is not ``name=value`` or a name given twice.
    """
    options: dict[str, bool | int | float | str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, equals, value = item.partition("=")
        name = name.strip()
        if not equals or not name.isidentifier() or not value.strip():
            raise InnerAggregationError(
                f"run-config key 'inner-options' must be 'name=value' items separated by "
                f"commas (e.g. 'beta=0.2'); got the item {item!r}")
        if name in options:
            raise InnerAggregationError(f"run-config key 'inner-options' gives {name!r} twice")
        options[name] = _option_value(value)
    return options


def settable_arguments(cls: type[Strategy]) -> list[str]:
    """The constructor arguments of ``cls`` that ``inner-options`` may set."""
    names = inspect.signature(cls.__init__).parameters
    return [name for name in names if name != "self" and name not in _OWN_ARGUMENTS]


def build_inner(name: str, options: str) -> Strategy | None:
    """The Flower strategy ``inner-aggregation=name`` with ``inner-options`` names.

    ``None`` for ``"mean"`` (the clustered strategy's own mean). A DP wrapper
    wraps Flower's FedAvg.

    Raises
    ------
    InnerAggregationError
        For an unknown name, an option the class does not take (the error lists
        those it takes), or a value Flower refuses.
    """
    if name == MEAN:
        if options.strip():
            raise InnerAggregationError(
                "run-config key 'inner-options' is set but 'inner-aggregation' is 'mean', "
                "which takes no options; name the Flower strategy they are for")
        return None
    cls = INNER_STRATEGIES.get(name)
    if cls is None:
        raise InnerAggregationError(
            f"run-config key 'inner-aggregation' must be 'mean' or one of "
            f"{', '.join(repr(n) for n in INNER_STRATEGIES)}; got {name!r}")
    arguments = parse_options(options)
    allowed = settable_arguments(cls)
    unknown = sorted(set(arguments) - set(allowed))
    if unknown:
        raise InnerAggregationError(
            f"run-config key 'inner-options': {cls.__name__} takes no {', '.join(unknown)}; "
            f"it takes {', '.join(allowed) or 'no options'}")
    if issubclass(cls, DP_WRAPPERS):
        arguments = {"strategy": FedAvg(), "num_sampled_clients": 1, **arguments}
    try:
        return cls(**arguments)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise InnerAggregationError(
            f"run-config keys 'inner-aggregation'={name!r}, 'inner-options'={options!r}: "
            f"Flower's {cls.__name__} refuses them: {error}") from error


def _chain(strategy: Strategy) -> list[Strategy]:
    """``strategy`` and the strategies it wraps (a DP wrapper's ``strategy``)."""
    found = [strategy]
    while isinstance(getattr(found[-1], "strategy", None), Strategy):
        found.append(found[-1].strategy)  # type: ignore[attr-defined]
    return found


def usable_problem(strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot aggregate a cluster's members, or ``None`` when it can.

    Flower's FedAvg family aggregates the replies it is given, and a server-side
    DP wrapper of one; a client-side DP wrapper needs a client mod, and other
    strategies (bagging XGBoost trees) aggregate something else than models.
    """
    chain = _chain(strategy)
    if all(isinstance(s, DP_WRAPPERS) for s in chain[:-1]) and isinstance(chain[-1], FedAvg):
        return None
    return (f"{type(strategy).__name__} cannot aggregate a cluster's members: the inner "
            "aggregation takes Flower's FedAvg or a subclass (FedMedian, FedTrimmedAvg, "
            "Krum, MultiKrum, Bulyan, FedAdam, FedYogi, FedAdagrad, FedAvgM...), or a "
            "server-side DP clipping wrapper of one")


def too_few_members(strategy: Strategy, members: int) -> str | None:
    """Why ``members`` replies are too few for ``strategy``'s rule, or ``None``.

    Krum and MultiKrum need n > 2f + 2 replies for f malicious ones (Blanchard
    et al. 2017); Bulyan needs n >= 4f + 3 (Flower's own check).
    """
    for inner in _chain(strategy):
        malicious = int(getattr(inner, "num_malicious_nodes", 0))
        if isinstance(inner, Bulyan) and members < 4 * malicious + 3:
            return f"Bulyan with f={malicious} needs >= {4 * malicious + 3} members"
        if isinstance(inner, MultiKrum) and members <= 2 * malicious + 2:
            return f"{type(inner).__name__} with f={malicious} needs > {2 * malicious + 2} members"
    return None


def _member_reply(msg: Message, keys: Sequence[str], weight: float) -> Message:
    """One member's model (``keys`` of it) and weight, as Flower's FedAvg reads a reply."""
    arrays = msg.content.array_records[p.ARRAYS]
    content = RecordDict({
        "arrays": ArrayRecord({key: arrays[key] for key in keys}),
        "metrics": MetricRecord({"num-examples": weight}),
    })
    return Message(content=content, dst_node_id=msg.metadata.src_node_id,
                   message_type=MessageType.TRAIN)


def _set_start(strategy: Strategy, start: ArrayRecord, members: int) -> None:
    """What Flower's ``configure_train`` records before a round, for this cluster.

    The model the members trained from (FedOpt keeps it as numpy arrays, FedAvgM
    and the DP wrappers as a record), and a DP wrapper's expected reply count.
    """
    for inner in _chain(strategy):
        if isinstance(inner, FedOpt):
            inner.current_arrays = {key: array.numpy() for key, array in start.items()}
        elif hasattr(inner, "current_arrays"):
            inner.current_arrays = ArrayRecord(  # type: ignore[attr-defined]
                {key: array for key, array in start.items()})
        if isinstance(inner, DP_WRAPPERS):
            inner.num_sampled_clients = members


def aggregate_with(
    strategy: Strategy,
    server_round: int,
    start: ArrayRecord,
    replies: Sequence[Message],
    *,
    weighted: bool,
) -> ArrayRecord | None:
    """``strategy``'s aggregate of the members' models (the keys of ``start``).

    Parameters
    ----------
    strategy : Strategy
        One cluster's Flower strategy (its state moves on).
    server_round : int
        The round, as Flower's loop passes it.
    start : ArrayRecord
        The cluster's model the members trained from (the keys aggregated).
    replies : Sequence[Message]
        The members' valid training replies.
    weighted : bool
        Weigh each member by its examples (else every member weighs 1), for the
        rules that weigh.

    Returns
    -------
    ArrayRecord | None
        The new model in ``start``'s keys and dtypes, or ``None`` when Flower's
        strategy aggregated nothing.
    """
    keys = list(start.keys())
    _set_start(strategy, start, len(replies))
    members = [_member_reply(m, keys, num_examples(m) if weighted else 1.0) for m in replies]
    arrays, _ = strategy.aggregate_train(server_round, members)
    if arrays is None:
        return None
    return p.numpy_to_record(keys, [
        np.asarray(arrays[key].numpy(), dtype=start[key].numpy().dtype) for key in keys])


def _storable(value: Any) -> bool:
    """Whether ``value`` is plain data a checkpoint keeps (no function, no object)."""
    if value is None or isinstance(value, (bool, int, float, str, np.ndarray, ArrayRecord)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_storable(item) for item in value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    return False


def strategy_state(strategy: Strategy) -> dict[str, Any]:
    """Every plain-data attribute of ``strategy`` and of the strategy it wraps.

    ``{"attributes": {...}, "wrapped": <the same for the wrapped one> | None}``;
    functions and objects (metric functions, a privacy accountant) are left to
    the copy :func:`restored` starts from.
    """
    attributes = {name: copy.deepcopy(value) for name, value in vars(strategy).items()
                  if not isinstance(value, Strategy) and _storable(value)}
    wrapped = getattr(strategy, "strategy", None)
    return {"attributes": attributes,
            "wrapped": strategy_state(wrapped) if isinstance(wrapped, Strategy) else None}


def restored(template: Strategy, state: Mapping[str, Any] | None) -> Strategy:
    """A copy of ``template`` with the attributes :func:`strategy_state` read out."""
    strategy = copy.deepcopy(template)
    if state is not None:
        _set_state(strategy, state)
    return strategy


def _set_state(strategy: Strategy, state: Mapping[str, Any]) -> None:
    vars(strategy).update(copy.deepcopy(dict(state["attributes"])))
    wrapped = getattr(strategy, "strategy", None)
    if state.get("wrapped") is not None and isinstance(wrapped, Strategy):
        _set_state(wrapped, state["wrapped"])


def describe(strategy: Strategy | None) -> str:
    """``"FedTrimmedAvg(beta=0.2)"``: the class and its settable arguments' values."""
    if strategy is None:
        return MEAN
    names = [n for n in settable_arguments(type(strategy)) if hasattr(strategy, n)]
    inner = "".join(f", {n}={getattr(strategy, n)!r}" for n in names)[2:]
    wrapped = getattr(strategy, "strategy", None)
    if isinstance(wrapped, Strategy):
        inner = f"{describe(wrapped)}" + (f", {inner}" if inner else "")
    return f"{type(strategy).__name__}({inner})"
