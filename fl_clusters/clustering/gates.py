"""Scale-free convergence gates (CFL, ACFL) and the choice of a cluster to re-seed (IFCA).

Update norms scale with the model, the learning rate, the optimizer and the
local work: an absolute threshold tuned for one MLP never fires for a CNN trained
five epochs, and a threshold on the norms of the first rounds never fires once
momentum or Adam make the norms grow, or once Adam's shrinking steps make them
fall. The gates here compare quantities of the same round with each other, or
a run with its own history where only its change over rounds matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_clusters.clustering.margins import check_margin
from fl_clusters.clustering.similarity import _finite_matrix


def update_coherence(updates: np.ndarray) -> float:
    """How much the clients' updates agree: ``||mean_i Delta_i|| / mean_i ||Delta_i||``.

    1 when every client moves the same way, near 0 when their moves cancel. Both
    norms are of the same round's updates, so any common scale (learning rate,
    momentum, Adam's step sizes, the number of local steps) cancels.

    Parameters
    ----------
    updates : np.ndarray
        (N, D) finite client updates, N >= 1.

    Returns
    -------
    float
        The coherence in [0, 1]; 0 when every update is zero.
    """
    matrix = _finite_matrix("updates", updates).astype(np.float64)
    if matrix.shape[0] < 1:
        raise ValueError("updates must hold at least one row")
    average_norm = float(np.linalg.norm(matrix, axis=1).mean())
    if average_norm == 0.0:
        return 0.0
    return float(np.linalg.norm(matrix.mean(axis=0)) / average_norm)


def coherence_split_gate(
    coherence: float,
    max_norm: float,
    reference_norm: float,
    mean_ratio: float,
    max_ratio: float,
) -> bool:
    """CFL's norm test made scale-free: the joint objective stalls while clients still move.

    The paper splits when ``||mean Delta|| < eps1`` (near a stationary point of
    the joint objective) and ``max ||Delta_i|| > eps2`` (some client is still far
    from its own). The first test here compares the mean update with the same
    round's client updates (:func:`update_coherence` < ``mean_ratio``): clients of
    one distribution still descending together move alike (coherence 0.78-0.88
    measured), clients pulled apart by different data cancel (0.46-0.66). Their
    ratio does not change when an optimizer scales every update, so momentum,
    Adam or more local epochs cannot keep it from opening. The second test asks
    that the largest update is above ``max_ratio`` of the largest update of the
    run's first rounds. At ``max_ratio`` 0 (CFL's default) it only asks that
    some client moved at all: a reference from the run's history is one that
    an optimizer whose steps shrink (Adam, several local epochs) drives every
    update below while the clients still disagree. Whether the members' moves
    cancel as groups or as noise is the split test's call
    (:func:`~fl_clusters.clustering.decide_cfl_split`).

    Parameters
    ----------
    coherence : float
        :func:`update_coherence` of the cluster's updates this round, in [0, 1].
    max_norm : float
        Largest client update norm this round, >= 0.
    reference_norm : float
        Largest client update norm of the run's first rounds, >= 0.
    mean_ratio : float
        Largest coherence that counts as stalled, in (0, 1].
    max_ratio : float
        The largest norm's least fraction of ``reference_norm``, >= 0.

    Returns
    -------
    bool
        ``coherence < mean_ratio and max_norm > max_ratio * reference_norm``;
        either comparison closer than ``TIE_TOLERANCE`` (coherence: absolute,
        norms: relative) is logged as a tie.
    """
    for name, value in (("max_norm", max_norm), ("reference_norm", reference_norm)):
        if not (np.isfinite(value) and value >= 0.0):
            raise ValueError(f"{name}={value} is outside [0, inf)")
    if not 0.0 <= coherence <= 1.0 + 1e-9:
        raise ValueError(f"coherence={coherence} is outside [0, 1]")
    if not 0.0 < mean_ratio <= 1.0:
        raise ValueError(f"mean_ratio={mean_ratio} is outside (0, 1]")
    if not (np.isfinite(max_ratio) and max_ratio >= 0.0):
        raise ValueError(f"max_ratio={max_ratio} is outside [0, inf)")
    check_margin("CFL gate: coherence < mean_ratio", coherence, mean_ratio, scale=1.0)
    if max_ratio > 0.0:
        # At max_ratio 0 the test is "some client moved": an exact zero, no tie.
        check_margin("CFL gate: max norm > max_ratio x reference norm", max_norm,
                     max_ratio * reference_norm)
    return bool(coherence < mean_ratio and max_norm > max_ratio * reference_norm)


def has_converged(mean_norms: np.ndarray, window: int, tolerance: float) -> bool:
    """Whether a run's mean-update norms have levelled off (ACFL's end of phase 1).

    FedAvg has converged when the mean update norm of the last ``window`` rounds
    is within ``tolerance`` (relative) of the mean of the ``window`` rounds
    before them: neither still falling (the model still descends) nor rising
    (it still accelerates from its random start). The test compares the run
    with itself, so it holds the same for any model and learning rate.

    Parameters
    ----------
    mean_norms : np.ndarray
        (T,) non-negative mean-update norm of every round so far, oldest first.
    window : int
        Rounds averaged on each side, >= 1; fewer than ``2 * window`` rounds
        never count as converged.
    tolerance : float
        Relative change below which the norms count as flat, in (0, 1).

    Returns
    -------
    bool
        ``|mean(last window) - mean(window before)| <= tolerance * mean(window before)``;
        a comparison closer than ``TIE_TOLERANCE`` (relative) is logged as a tie.
    """
    norms = np.asarray(mean_norms, dtype=np.float64)
    if norms.ndim != 1 or not np.all(np.isfinite(norms)) or np.any(norms < 0):
        raise ValueError("mean_norms must be a 1-D array of finite values >= 0")
    if window < 1:
        raise ValueError(f"window={window} is outside [1, inf)")
    if not 0.0 < tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance} is outside (0, 1)")
    if norms.size < 2 * window:
        return False
    recent = norms[-window:].mean()
    before = norms[-2 * window:-window].mean()
    check_margin("ACFL phase-1 gate: |change of mean norm| <= tolerance x before",
                 abs(recent - before), tolerance * before)
    return bool(abs(recent - before) <= tolerance * before)


def levelled_off_gate(
    mean_norms: Sequence[float], window: int, tolerance: float
) -> tuple[bool, str]:
    """:func:`has_converged` on ``mean_norms``, and what it compared in words.

    Parameters
    ----------
    mean_norms : Sequence[float]
        Mean-update norm of every round so far, oldest first, at least one.
    window, tolerance
        As :func:`has_converged` takes them.

    Returns
    -------
    tuple[bool, str]
        Whether the norms levelled off, and the comparison for the round's log line.
    """
    norms = list(mean_norms)
    converged = has_converged(np.array(norms), window, tolerance)
    if len(norms) < 2 * window:
        return converged, (f"mean update norm {norms[-1]:.4g}; {len(norms)} of the "
                           f"{2 * window} rounds of norms the test compares")
    recent, before = np.mean(norms[-window:]), np.mean(norms[-2 * window:-window])
    change = abs(recent - before) / before if before > 0 else np.inf
    return converged, (f"mean update norm of the last {window} rounds {recent:.4g} "
                       f"against {before:.4g} before: change {change:.1%} "
                       f"{'<=' if change <= tolerance else '>'} {tolerance:.0%}")


def norm_threshold_gate(
    mean_norm: float, max_norm: float, mean_norm_max: float, max_norm_min: float
) -> tuple[bool, str]:
    """ACFL's absolute gate: the mean update norm below ``mean_norm_max`` and the largest
    above ``max_norm_min``; whether both hold, and the comparison in words."""
    converged = mean_norm < mean_norm_max and max_norm > max_norm_min
    return converged, (
        f"mean update norm {mean_norm:.4g} "
        f"{'<' if mean_norm < mean_norm_max else '>='} {mean_norm_max:.4g}, "
        f"max {max_norm:.4g} {'>' if max_norm > max_norm_min else '<='} "
        f"{max_norm_min:.4g}")


def widest_group(groups: list[np.ndarray]) -> int | None:
    """The group whose points spread most: IFCA re-seeds an empty cluster from it.

    Spread is the sum of squared distances of a group's points to their mean
    (k-means' inertia for one centre): the cluster whose members disagree most
    is the one most likely to hold two true groups on one model.

    Parameters
    ----------
    groups : list of np.ndarray
        One (N_j, D) array per group (N_j may be 0), all with the same D.

    Returns
    -------
    int | None
        Index of the widest group with at least 2 points; ``None`` when no
        group has 2 points (nothing can be split).
    """
    best, best_spread = None, -1.0
    width = None
    for index, points in enumerate(groups):
        matrix = np.asarray(points, dtype=np.float64)
        if matrix.size == 0:
            continue
        matrix = _finite_matrix(f"groups[{index}]", matrix)
        if width is not None and matrix.shape[1] != width:
            raise ValueError(
                f"groups[{index}] has {matrix.shape[1]} columns, earlier groups have {width}"
            )
        width = matrix.shape[1]
        if matrix.shape[0] < 2:
            continue
        spread = float(((matrix - matrix.mean(axis=0)) ** 2).sum())
        if spread > best_spread:
            best, best_spread = index, spread
    return best


def unit_rows(points: np.ndarray) -> np.ndarray:
    """Every row scaled to unit L2 norm (zero rows stay zero).

    K-means over unit updates groups clients by the direction they move in, as
    CFL's cosine similarity does, not by how far (which follows their data size).

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points.

    Returns
    -------
    np.ndarray
        (N, D) float64 rows of norm 1, or 0 for a zero row.
    """
    matrix = _finite_matrix("points", points).astype(np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def output_layer_profiles(updates: np.ndarray) -> np.ndarray:
    """Clients' output-layer updates less their mean row, scaled to unit norm.

    From a common start, row c of a client's output-layer update points to the
    mean feature of the inputs it labels c: which inputs go to which label, the
    signal that tells label permutations apart and, through the features, input
    transforms (rotations). Every row also moves along the mean feature of all
    inputs (the softmax pushes all outputs together); removing the mean row
    drops that common part.

    Parameters
    ----------
    updates : np.ndarray
        (N, R, C) finite output-layer weight updates of N clients (R outputs).

    Returns
    -------
    np.ndarray
        (N, R * C) float64 rows of norm 1 (or 0 for an update with equal rows).
    """
    tensor = np.asarray(updates, dtype=np.float64)
    if tensor.ndim != 3 or not np.all(np.isfinite(tensor)):
        raise ValueError(f"updates must be a finite (N, R, C) array, got shape {tensor.shape}")
    centred = tensor - tensor.mean(axis=1, keepdims=True)
    return unit_rows(centred.reshape(len(tensor), -1))
