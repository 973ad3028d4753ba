"""Client replies that fail at random: a Flower client mod and the log of what it injected.

:class:`FaultInjector` is a Flower client mod that makes a share of the train and
evaluate replies fail: the client raises (``crash``), stalls past the round timeout
(``stall``), or sends a malformed reply (``inf-examples``, ``nan-model``,
``wrong-shape``, ``missing-key``). The fault of a message is drawn from a hash of
(seed, node key, round, message type), so the same run config injects the same
faults, and a resumed run injects in its rounds the faults the uninterrupted run
would have. Every injection is written as one JSON line to a folder
(:func:`read_fault_log`), so what was injected is counted, not inferred.
:mod:`fl_clusters.chaos` runs a federation with it, killed mid-way and resumed.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.client.task import node_key

CRASH, STALL = "crash", "stall"
MALFORMED = ("inf-examples", "nan-model", "wrong-shape", "missing-key")
# The faults drawn at equal odds; stalls have a share of their own (FaultInjector).
REPLY_FAULTS = (CRASH, *MALFORMED)
FAULTS = (*REPLY_FAULTS, STALL)
# Rates are whole percents: a message's draw is one of 100 values.
_DRAWS = 100


def draw_fault(
    key: int, server_round: int, message_type: str, rate: float, seed: int,
    stall_rate: float = 0.0, kinds: Sequence[str] = REPLY_FAULTS,
) -> str | None:
    """The fault of one message, or ``None`` (a share ``1 - rate`` of the messages).

    Parameters
    ----------
    key : int
        The node's stable key (:func:`~fl_clusters.client.task.node_key`).
    server_round : int
        The message's round (absolute, as a resumed run numbers it).
    message_type : str
        ``train`` or ``evaluate``.
    rate : float
        The share of messages that fail, stalls included (a whole percent).
    seed : int
        The hash's starting value: another seed, other failing messages.
    stall_rate : float
        The share of messages that stall (a whole percent, at most ``rate``).
    kinds : Sequence[str]
        The other faults, each drawn for an equal part of ``rate - stall_rate``.
    """
    draw = zlib.crc32(f"{key}/{server_round}/{message_type}".encode(), seed) % _DRAWS
    stalls, fails = round(stall_rate * _DRAWS), round(rate * _DRAWS)
    if draw < stalls:
        return STALL
    return kinds[(draw - stalls) % len(kinds)] if draw < fails else None


def corrupt(reply: Message, fault: str) -> Message:
    """``reply`` made malformed by ``fault`` (one of :data:`MALFORMED`).

    ``nan-model`` and ``wrong-shape`` on a reply without a model (an evaluation)
    remove the metrics instead, as ``missing-key`` does.
    """
    metrics = MetricRecord(dict(reply.content.metric_records[p.METRICS]))
    content = RecordDict({p.METRICS: metrics})
    arrays = reply.content.array_records.get(p.ARRAYS)
    if arrays is not None:
        names = list(arrays.keys())
        values = [a.numpy().copy() for a in arrays.values()]
        if fault == "nan-model":
            values[0].flat[0] = np.nan
        elif fault == "wrong-shape":
            values[-1] = np.zeros(values[-1].size + 1, dtype=values[-1].dtype)
        content[p.ARRAYS] = p.numpy_to_record(names, values)
    if fault == "inf-examples":
        metrics[p.M_NUM_EXAMPLES] = float("inf")
    elif fault == "missing-key" or (fault in ("nan-model", "wrong-shape") and arrays is None):
        for key in (p.M_TRAIN_LOSS, p.M_ACCURACY):
            if key in metrics:
                del metrics[key]
    reply.content = content
    return reply


@dataclass(frozen=True)
class FaultInjector:
    """A Flower client mod that makes a share of the train and evaluate replies fail.

    Pass it to :func:`~fl_clusters.client_app.build_client_app` (``mods=[...]``).
    Other messages (the handshake, checkpoint state, the final report) pass
    untouched.

    Parameters
    ----------
    rate : float
        Share of train and evaluate messages that fail, stalls included; a whole
        percent in [0, 1].
    seed : int
        Seed of the draw (:func:`draw_fault`).
    stall_rate : float
        Share of messages that stall, a whole percent up to ``rate``. Each round
        phase with a stall waits the whole ``round-timeout``, so stalls cost wall
        time the other faults do not.
    stall_s : float
        How long a stalled client sleeps before answering; longer than the run's
        ``round-timeout``, so the server goes on without the reply.
    kinds : tuple[str, ...]
        The other faults, a subset of :data:`REPLY_FAULTS`, drawn at equal odds.
    log_dir : str
        Folder that receives one JSON line per injected fault (``""``: none).
    """

    rate: float
    seed: int = 0
    stall_rate: float = 0.0
    stall_s: float = 0.0
    kinds: tuple[str, ...] = REPLY_FAULTS
    log_dir: str = ""

    def __post_init__(self) -> None:
        for name in ("rate", "stall_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0 or round(value * _DRAWS) != value * _DRAWS:
                raise ValueError(f"FaultInjector: {name}={value} is not a whole percent in "
                                 "[0, 1]")
        if self.stall_rate > self.rate:
            raise ValueError(f"FaultInjector: stall_rate={self.stall_rate} exceeds rate="
                             f"{self.rate}; stalls are part of the failing share")
        unknown = sorted(set(self.kinds) - set(REPLY_FAULTS))
        if unknown or not self.kinds:
            raise ValueError(f"FaultInjector: kinds {list(self.kinds)} must be a non-empty "
                             f"subset of {list(REPLY_FAULTS)}")
        if self.stall_rate > 0 and self.stall_s <= 0:
            raise ValueError("FaultInjector: stall_rate > 0 needs stall_s > 0, longer than "
                             "the run's round-timeout")

    def fault(self, context: Context, msg: Message) -> str | None:
        """The fault this node injects into ``msg``, or ``None``."""
        config = msg.content.config_records.get(p.CONFIG)
        server_round = int(config.get(p.CFG_ROUND, 0)) if config is not None else 0  # type: ignore[arg-type]
        return draw_fault(node_key(context), server_round, msg.metadata.message_type,
                          self.rate, self.seed, self.stall_rate, self.kinds)

    def __call__(
        self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
    ) -> Message:
        if msg.metadata.message_type not in (MessageType.TRAIN, MessageType.EVALUATE):
            return call_next(msg, context)
        fault = self.fault(context, msg)
        if fault is None:
            return call_next(msg, context)
        self._record(context, msg, fault)
        if fault == CRASH:
            raise RuntimeError("injected crash")
        if fault == STALL:
            time.sleep(self.stall_s)  # the reply comes after the server stopped waiting
            return call_next(msg, context)
        reply = call_next(msg, context)
        return reply if reply.has_error() else corrupt(reply, fault)

    def _record(self, context: Context, msg: Message, fault: str) -> None:
        if not self.log_dir:
            return
        config = msg.content.config_records.get(p.CONFIG)
        line = json.dumps({
            "node": node_key(context),
            "round": int(config.get(p.CFG_ROUND, 0)) if config is not None else 0,  # type: ignore[arg-type]
            "message": msg.metadata.message_type,
            "fault": fault,
        })
        # One file per client process: lines of concurrent writers never interleave.
        with (Path(self.log_dir) / f"faults-{os.getpid()}.jsonl").open("a") as out:
            out.write(line + "\n")


def read_fault_log(folder: Path) -> list[dict[str, Any]]:
    """Every fault a :class:`FaultInjector` with ``log_dir=folder`` recorded.

    A line without its newline (its process was killed while writing it) is left
    out: the fault it names may not have happened.
    """
    faults = []
    for path in sorted(folder.glob("faults-*.jsonl")):
        faults += [json.loads(line) for line in path.read_text().splitlines(keepends=True)
                   if line.endswith("\n")]
    return faults


def count_faults(faults: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of ``faults`` are of each kind of :data:`FAULTS` (each listed)."""
    return {kind: sum(f["fault"] == kind for f in faults) for kind in FAULTS}
