"""Decision margins: how far a threshold decision lies from flipping, and ties reported.

A decision ``value <= threshold`` whose two sides differ by a few ulps is decided
by floating-point noise: the BLAS kernel, its thread count, or the order of a sum
can flip it between machines. The helpers here measure the margin of such a
decision relative to a scale and log a warning naming the decision when it is
below :data:`TIE_TOLERANCE`, and compute Euclidean distances without BLAS, so a
distance compared twice is the same number both times.
"""

from __future__ import annotations

import logging
import math
from logging import WARNING

import numpy as np
from scipy.spatial.distance import cdist

from fl_clusters.clustering.similarity import _finite_matrix

# Relative margin below which a decision counts as a tie: far above the noise of a
# float64 distance or norm (about 1e-15 relative), far below any measured gap
# between the groups the strategies separate.
TIE_TOLERANCE = 1e-4

LOGGER = logging.getLogger(__name__)


def relative_margin(value: float, threshold: float, scale: float | None = None) -> float:
    """``|value - threshold| / scale``: how far a decision is from its threshold.

    Parameters
    ----------
    value : float
        The compared quantity.
    threshold : float
        What it is compared with.
    scale : float or None (default: None)
        Unit of the margin, > 0; None uses ``|threshold|``, or ``|value|`` when
        the threshold is 0. Pass 1 for quantities with a natural unit (cosine
        similarities, silhouettes, accuracies), whose thresholds may be 0.

    Returns
    -------
    float
        The margin, >= 0; inf when value and threshold are both exactly 0 with
        no scale given (an exact zero is no floating-point tie).
    """
    unit = scale if scale is not None else abs(threshold) or abs(value)
    if unit == 0.0:
        return math.inf
    return abs(value - threshold) / unit


def warn_tie(decision: str, value: float, threshold: float, margin: float,
             tolerance: float = TIE_TOLERANCE) -> None:
    """Log a warning that ``decision`` is a tie, when ``margin`` is below ``tolerance``."""
    if margin < tolerance:
        LOGGER.log(WARNING, "%s is a tie: %.17g against threshold %.17g, relative margin "
                   "%.3g < %.3g, so floating-point noise can flip it", decision, value,
                   threshold, margin, tolerance)


def check_margin(decision: str, value: float, threshold: float, scale: float | None = None,
                 tolerance: float = TIE_TOLERANCE) -> float:
    """The :func:`relative_margin` of a decision, with a warning when it is a tie.

    Parameters
    ----------
    decision : str
        What is decided, in words for the log (e.g. "CFL cross similarity < gamma_max").
    value, threshold, scale
        As in :func:`relative_margin`.
    tolerance : float (default: TIE_TOLERANCE)
        Margins below it are ties.

    Returns
    -------
    float
        The margin.
    """
    margin = relative_margin(value, threshold, scale)
    warn_tie(decision, value, threshold, margin, tolerance)
    return margin


def pairwise_euclidean(points: np.ndarray, others: np.ndarray | None = None) -> np.ndarray:
    """Euclidean distances computed coordinate by coordinate (scipy's cdist), not by BLAS.

    sklearn's ``euclidean_distances`` expands ``||x||^2 - 2 x.y + ||y||^2`` with a
    matrix product, whose rounding follows the BLAS kernel and thread count; the
    same pair then comes out an ulp apart on two machines, or in two calls.

    Parameters
    ----------
    points : np.ndarray
        (N, D) finite points.
    others : np.ndarray or None (default: None)
        (M, D) finite points; None means ``points`` (then the diagonal is exactly 0).

    Returns
    -------
    np.ndarray
        (N, M) float64 distances.
    """
    left = _finite_matrix("points", points).astype(np.float64)
    right = left if others is None else _finite_matrix("others", others).astype(np.float64)
    return cdist(left, right, metric="euclidean")


def assignment_margins(squared_distances: np.ndarray) -> np.ndarray:
    """Per point, how much nearer its nearest centre is than the second nearest.

    Parameters
    ----------
    squared_distances : np.ndarray
        (N, k) squared distances of N points to k centres.

    Returns
    -------
    np.ndarray
        (N,) ``(second - nearest) / second`` (0 for an exact tie, inf with one
        centre or when both are 0: the point is the centre).
    """
    table = np.asarray(squared_distances, dtype=np.float64)
    if table.shape[1] < 2:
        return np.full(table.shape[0], np.inf)
    two = np.partition(table, 1, axis=1)[:, :2]
    gap = two[:, 1] - two[:, 0]
    return np.divide(gap, two[:, 1], out=np.full(table.shape[0], np.inf), where=two[:, 1] > 0)
