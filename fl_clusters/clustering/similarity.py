"""Flattening client models into vectors, their updates, and cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _finite_matrix(name: str, array: np.ndarray) -> np.ndarray:
    """Return ``array`` as a 2-D numpy array, or raise if it is not 2-D or not finite.

    Parameters
    ----------
    name : str
        Parameter name used in the error message.
    array : np.ndarray
        Value to check; anything ``np.asarray`` accepts.

    Returns
    -------
    np.ndarray
        The same data as a 2-D array (no copy when it already is one).
    """
    matrix = np.asarray(array)
    if matrix.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{name} must hold only finite values (found NaN or Inf)")
    return matrix


def _checked_labels(labels: np.ndarray, num_points: int, low: int, num_clusters: int) -> np.ndarray:
    """Return ``labels`` as an int array, or raise naming what is wrong with it.

    Parameters
    ----------
    labels : np.ndarray
        One cluster per point, anything ``np.asarray`` accepts.
    num_points : int
        How many labels there must be.
    low : int
        The smallest label allowed (0, or -1 where a point may have no cluster yet).
    num_clusters : int
        Labels must be below it.
    """
    clusters = np.asarray(labels)
    if clusters.shape != (num_points,) or not np.issubdtype(clusters.dtype, np.integer):
        raise ValueError(f"labels must be {num_points} ints (one cluster per point), got "
                         f"shape {clusters.shape} of {clusters.dtype}")
    if clusters.size and not (clusters.min() >= low and clusters.max() < num_clusters):
        raise ValueError(f"labels must lie in [{low}, {num_clusters - 1}] for "
                         f"k={num_clusters}, got [{clusters.min()}, {clusters.max()}]")
    return clusters


def flatten_models(models: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """Concatenate every model's layers into one row per model.

    Parameters
    ----------
    models : sequence of sequence of np.ndarray
        N models, each a list of layer arrays; all models must have the same
        number of parameters.

    Returns
    -------
    np.ndarray
        (N, D) float32 array; row i is model i's layers raveled in order.
    """
    if len(models) == 0:
        raise ValueError("models must hold at least one model, got 0")
    rows = [
        np.concatenate([np.asarray(layer, dtype=np.float32).ravel() for layer in model])
        for model in models
    ]
    sizes = {row.size for row in rows}
    if len(sizes) != 1:
        raise ValueError(f"models must all have the same number of parameters, got {sorted(sizes)}")
    return np.stack(rows)


def model_updates(
    trained: Sequence[Sequence[np.ndarray]], start: Sequence[np.ndarray]
) -> np.ndarray:
    """Flattened updates ``Delta_i = w_i - start`` of clients that all began from ``start``.

    Parameters
    ----------
    trained : sequence of sequence of np.ndarray
        N trained client models (lists of layer arrays).
    start : sequence of np.ndarray
        The one model every client started from (e.g. its cluster model this
        round). For clients that started from different models, call once per
        starting model.

    Returns
    -------
    np.ndarray
        (N, D) float32 updates.
    """
    trained_flat = flatten_models(trained)
    start_flat = flatten_models([start])[0]
    if start_flat.size != trained_flat.shape[1]:
        raise ValueError(
            f"start has {start_flat.size} parameters but the trained models have "
            f"{trained_flat.shape[1]}"
        )
    # Subtract in float64: updates are small differences of large weights, and the
    # cosine and norm tests downstream are sensitive to their low bits.
    return (trained_flat.astype(np.float64) - start_flat.astype(np.float64)).astype(np.float32)


def pairwise_cosine(vectors: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows, with one matrix product.

    Parameters
    ----------
    vectors : np.ndarray
        (N, D) array, e.g. client updates. A zero row has similarity 0 with
        every row, itself included (no NaN).

    Returns
    -------
    np.ndarray
        (N, N) float64 symmetric matrix with values in [-1, 1].
    """
    matrix = _finite_matrix("vectors", vectors)
    if not np.issubdtype(matrix.dtype, np.floating):
        matrix = matrix.astype(np.float64)
    norms = np.linalg.norm(matrix, axis=1)
    # Dividing a zero row by 1 keeps it zero, so its dot products, and thus its
    # similarities, are exactly 0 instead of 0/0 = NaN.
    unit = matrix / np.where(norms > 0, norms, 1.0)[:, None]
    # The product stays in the input's float dtype: float32 updates of large
    # models would double in memory if promoted first.
    similarity = (unit @ unit.T).astype(np.float64)
    return np.clip(similarity, -1.0, 1.0)


def closest_direction(update: np.ndarray, directions: np.ndarray) -> int:
    """Index of the direction with the largest cosine similarity to ``update``.

    CFL places a client that joins after a split by this test: its update from
    the split's model is compared with the mean update of each side.

    Parameters
    ----------
    update : np.ndarray
        (D,) the client's update.
    directions : np.ndarray
        (K, D) candidate directions, K >= 1 (e.g. each side's mean update).

    Returns
    -------
    int
        Row of ``directions`` most similar to ``update``; ties go to the first.
    """
    vector = _finite_matrix("update", np.asarray(update)[None, :])
    candidates = _finite_matrix("directions", np.asarray(directions))
    if candidates.shape[0] < 1 or candidates.shape[1] != vector.shape[1]:
        raise ValueError(
            f"directions has shape {candidates.shape}; it needs >= 1 row of the "
            f"update's length {vector.shape[1]}"
        )
    similarity = pairwise_cosine(np.vstack([vector, candidates]))[0, 1:]
    return int(np.argmax(similarity))


def update_norms(updates: np.ndarray) -> tuple[float, float]:
    """CFL's split criteria: norm of the mean update and the largest client update norm.

    Parameters
    ----------
    updates : np.ndarray
        (N, D) client updates.

    Returns
    -------
    tuple of float
        ``(||mean_i Delta_i||, max_i ||Delta_i||)``. The second is the largest
        L2 norm of a whole client update, not the largest single coordinate.
    """
    matrix = _finite_matrix("updates", updates).astype(np.float64)
    if matrix.shape[0] == 0:
        raise ValueError("updates must hold at least one client update, got 0 rows")
    mean_norm = float(np.linalg.norm(matrix.mean(axis=0)))
    max_norm = float(np.linalg.norm(matrix, axis=1).max())
    return mean_norm, max_norm
