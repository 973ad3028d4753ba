"""Which replies a strategy may read, and when rounds without one stop the run.

Every reply a strategy reads passes :func:`validate_replies` first, so reading a
valid reply never raises. Whether a query is a round's training is the caller's
explicit ``trains`` flag (:meth:`ClusteredStrategy.check_replies`): only
training rounds count towards :func:`count_failed_round`'s limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from fl_clusters import protocol as p
from fl_clusters.client_errors import describe_error
from fl_clusters.clustering import model_updates, weighted_average

# Reasons quoted in the error that stops a run; the rest are counted.
SHOWN_REASONS = 10


# Why a reply's claims about its sender contradict the handshake, or None
# (NodeRegistry.claim_problem): node id, the reply's metrics.
ClaimCheck = Callable[[int, MetricRecord], str | None]


def reply_problem(
    msg: Message,
    reference: ArrayRecord | None,
    fields: Mapping[str, p.MetricField],
    source: str | None = None,
    claims: ClaimCheck | None = None,
) -> str | None:
    """Why ``msg`` cannot be used (one line), or ``None`` when it can.

    Parameters
    ----------
    msg : Message
        A reply from the grid.
    reference : ArrayRecord | None
        Model the reply's ``arrays`` must match in keys and shapes; ``None`` when
        the reply carries no model.
    fields : Mapping[str, MetricField]
        Metrics the caller reads besides ``num-examples``.
    source : str | None
        How the log names the sender (``node <id>`` when ``None``); a client
        error's whole text is logged under it once per distinct error
        (:func:`~fl_clusters.client_errors.show_once`).
    claims : ClaimCheck | None
        Checks a ``node-key`` or ``partition-id`` the reply carries against what
        its node id registered (:meth:`~fl_clusters.handshake.NodeRegistry.claim_problem`).
    """
    if msg.has_error():
        return describe_error(msg.error.reason, source or f"node {msg.metadata.src_node_id}")
    metrics = msg.content.metric_records.get(p.METRICS)
    if metrics is None:
        return f"no '{p.METRICS}' record"
    problem = p.check_metrics(metrics, fields)
    if problem is None and claims is not None:
        problem = claims(msg.metadata.src_node_id, metrics)
    if problem is not None or reference is None:
        return problem
    arrays = msg.content.array_records.get(p.ARRAYS)
    if arrays is None:
        return f"no '{p.ARRAYS}' record"
    return p.check_model_reply(arrays, reference)


def validate_replies(
    replies: Iterable[Message],
    reference: ArrayRecord | None,
    stage: str,
    fields: Mapping[str, p.MetricField],
    describe: Callable[[int], str] | None = None,
    claims: ClaimCheck | None = None,
) -> tuple[list[Message], list[str]]:
    """Split ``replies`` into the usable ones and the reasons of the others, logging both.

    Parameters
    ----------
    replies : Iterable[Message]
        Replies from the grid.
    reference : ArrayRecord | None
        See :func:`reply_problem`.
    stage : str
        Name used in the log lines.
    fields : Mapping[str, MetricField]
        See :func:`reply_problem`.
    describe : Callable[[int], str] | None
        How the log names a node (``node <id>`` when ``None``), e.g.
        :meth:`~fl_clusters.handshake.NodeRegistry.describe`: by the node id's
        registered identity, never by what the reply claims.
    claims : ClaimCheck | None
        See :func:`reply_problem`.

    Returns
    -------
    tuple
        ``(valid, reasons)``: the usable replies in arrival order, and one
        ``"<node>: <why>"`` per rejected reply.
    """
    valid: list[Message] = []
    reasons: list[str] = []
    replies = list(replies)
    for msg in replies:
        node = msg.metadata.src_node_id
        source = describe(node) if describe is not None else f"node {node}"
        reason = reply_problem(msg, reference, fields, source, claims)
        if reason is not None:
            reasons.append(f"{source}: {reason}")
            log(WARNING, "%s: rejected reply from %s: %s", stage, source, reason)
            continue
        valid.append(msg)
    log(INFO, "%s: %d valid replies, %d rejected", stage, len(valid), len(replies) - len(valid))
    return valid, reasons


def count_failed_round(
    failed_rounds: int, limit: int, limit_hint: str, stage: str, valid: bool, reasons: list[str]
) -> int:
    """The count of training rounds in a row without a valid reply, after this one.

    Flower's loop goes on when ``aggregate_train`` returns nothing, so a
    federation whose every client fails would otherwise finish "successfully"
    with the untrained models it started from.

    Parameters
    ----------
    failed_rounds : int
        The count before this round.
    limit : int
        ``max_failed_rounds``: the count that stops the run.
    limit_hint : str
        How the user raises ``limit`` (a run-config key or a constructor argument).
    stage : str
        Name used in the log line.
    valid : bool
        Whether this round had a valid reply (which resets the count).
    reasons : list[str]
        Why each reply of this round was rejected, for the error.

    Raises
    ------
    RuntimeError
        When the count reaches ``limit``; it quotes the clients' errors.
    """
    if valid:
        return 0
    failed_rounds += 1
    log(WARNING, "%s: no valid reply (%d of %d training rounds in a row allowed)",
        stage, failed_rounds, limit)
    if failed_rounds >= limit:
        shown = ("; ".join(reasons[:SHOWN_REASONS])
                 or "no node answered (none sampled or all timed out)")
        more = (f" (+{len(reasons) - SHOWN_REASONS} more)"
                if len(reasons) > SHOWN_REASONS else "")
        raise RuntimeError(
            f"{failed_rounds} training rounds in a row without one valid reply, so no "
            f"model was trained; the clients said: {shown}{more}. Fix the failing "
            f"ClientApps (or raise {limit_hint})"
        )
    return failed_rounds


def num_examples(msg: Message) -> float:
    """The ``num-examples`` a valid reply reports."""
    return float(msg.content.metric_records[p.METRICS][p.M_NUM_EXAMPLES])  # type: ignore[arg-type]


def epochs_done(msg: Message) -> float | None:
    """The ``local-epochs-done`` a valid training reply reports, or ``None`` without it."""
    metrics = msg.content.metric_records[p.METRICS]
    return float(metrics[p.M_EPOCHS_DONE]) if p.M_EPOCHS_DONE in metrics else None  # type: ignore[arg-type]


def train_losses(replies: Iterable[Message]) -> list[float]:
    """The ``train-loss`` of each valid training reply."""
    return [float(m.content.metric_records[p.METRICS][p.M_TRAIN_LOSS])  # type: ignore[arg-type]
            for m in replies]


def describe_steps_done(replies: Sequence[Message], asked: int | None) -> str:
    """What the nodes' training did, from their replies' ``local-steps-done``.

    A node that runs its own ``train()`` (``ClusteredClient``) takes the steps its
    loop takes, whatever the server asked; the log must say what happened.

    Parameters
    ----------
    replies : Sequence[Message]
        Valid training replies.
    asked : int | None
        The ``local-steps`` the server sent (``None`` or 0: it left the number
        to the node's epochs).

    Returns
    -------
    str
        E.g. ``"clients ran 13-13 local steps (asked 100)"``; nodes that did not
        report their steps are counted.
    """
    done = [int(m.content.metric_records[p.METRICS][p.M_STEPS_DONE])  # type: ignore[arg-type]
            for m in replies if p.M_STEPS_DONE in m.content.metric_records[p.METRICS]]
    request = f"asked {asked}" if asked else "asked for local epochs"
    text = (f"clients ran {min(done)}-{max(done)} local steps ({request})" if done
            else f"clients did not report their local steps ({request})")
    missing = len(replies) - len(done)
    if done and missing:
        text += f"; {missing} of {len(replies)} did not report theirs"
    return text


def reply_layers(replies: Iterable[Message], names: Sequence[str]) -> list[list[np.ndarray]]:
    """The layers ``names`` of each valid reply's model, as numpy arrays."""
    return [[m.content.array_records[p.ARRAYS][n].numpy() for n in names] for m in replies]


def average_replies(
    replies: Sequence[Message], keys: Sequence[str] | None = None, *, weighted: bool = True
) -> ArrayRecord:
    """Example-weighted average of the valid replies' models (or of ``keys`` only).

    ``weighted=False``: their plain mean, each reply counting once.
    """
    names = list(keys if keys is not None else replies[0].content.array_records[p.ARRAYS])
    weights = [num_examples(m) if weighted else 1.0 for m in replies]
    return p.numpy_to_record(names, weighted_average(reply_layers(replies, names), weights))


def average_packed_clusters(replies: Sequence[Message], weights: np.ndarray) -> ArrayRecord:
    """Each packed cluster of the valid replies averaged with weights of its own.

    ``weights`` is (replies, clusters): column j weighs the replies' cluster j,
    non-negative with a positive total. The replies pack clusters only (no
    shared arrays).
    """
    names = list(replies[0].content.array_records[p.ARRAYS])
    averaged: dict[str, np.ndarray] = {}
    for cluster in range(weights.shape[1]):
        keys = [n for n in names if n.startswith(p.cluster_prefix(cluster))]
        layers = weighted_average(reply_layers(replies, keys), weights[:, cluster].tolist())
        averaged.update(zip(keys, layers, strict=True))
    if len(averaged) != len(names):
        raise ValueError(f"the replies hold {len(names)} arrays, {len(averaged)} of them in "
                         f"{weights.shape[1]} packed clusters; every array must be in one")
    return p.numpy_to_record(names, [averaged[n] for n in names])


def reply_updates(trained: Sequence[Message], start: ArrayRecord) -> np.ndarray:
    """Flattened float32 updates of the replies, relative to the model they started from."""
    names = list(start.keys())
    return model_updates(reply_layers(trained, names), [start[n].numpy() for n in names])
