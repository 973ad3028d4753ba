"""Model averaging: weighted FedAvg and AWCFL's inter-cluster mixing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check_same_shapes(models: Sequence[Sequence[np.ndarray]], name: str) -> None:
    """Raise unless every model has the layer shapes of the first."""
    if len(models) == 0:
        raise ValueError(f"{name} must hold at least one model, got 0")
    reference = [np.shape(layer) for layer in models[0]]
    for index, model in enumerate(models[1:], start=1):
        shapes = [np.shape(layer) for layer in model]
        if shapes != reference:
            raise ValueError(
                f"{name}[{index}] has layer shapes {shapes}, {name}[0] has {reference}"
            )


def weighted_average(
    models: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
) -> list[np.ndarray]:
    """Layer-wise weighted mean of models, summed in float64.

    Accumulating in the layers' own float32 loses the last bits (Flower's own
    aggregation turns six copies of 2.0 into 1.9999985); here the sum runs in
    float64 and each layer is cast back to its input dtype once.

    Parameters
    ----------
    models : sequence of sequence of np.ndarray
        Models as lists of layer arrays, all with the same layer shapes.
    weights : sequence of float
        One finite, non-negative weight per model (e.g. its number of examples),
        not all 0; only their ratios count, so huge weights cannot overflow.

    Returns
    -------
    list of np.ndarray
        The averaged layers, in the dtypes of ``models[0]``'s layers.
    """
    _check_same_shapes(models, "models")
    factors = _scaled_weights(weights, len(models))
    total = float(factors.sum())
    averaged = []
    for layers in zip(*models, strict=True):
        accumulator = np.zeros(np.shape(layers[0]), dtype=np.float64)
        for factor, layer in zip(factors, layers, strict=True):
            accumulator += factor * np.asarray(layer, dtype=np.float64)
        # Dividing once by the total (not pre-normalized weights) keeps equal
        # inputs exact: sum(w_i x) / sum(w_i) = x.
        averaged.append((accumulator / total).astype(np.asarray(layers[0]).dtype))
    return averaged


def _scaled_weights(weights: Sequence[float], count: int) -> np.ndarray:
    """``weights`` in float64, scaled by a power of two so that the largest is in [0.5, 1).

    Weights near float64's limit (two of 1e308) would otherwise overflow the total
    to Inf and turn every average into 0 or NaN; after scaling the total is at most
    ``count``. A power of two scales exactly, so equal inputs still average exactly.
    """
    factors = np.asarray(weights, dtype=np.float64)
    if factors.shape != (count,):
        raise ValueError(
            f"weights must hold {count} values (one per model), got shape {factors.shape}"
        )
    if not np.all(np.isfinite(factors)) or np.any(factors < 0):
        raise ValueError("weights must be finite and non-negative")
    largest = float(factors.max())
    if not largest > 0:
        raise ValueError(f"weights must have a positive total, got {float(factors.sum())}")
    return np.ldexp(factors, -np.frexp(largest)[1])


def inter_cluster_mix(
    cluster_models: Sequence[Sequence[np.ndarray]], beta: float
) -> list[list[np.ndarray]]:
    """AWCFL: blend every cluster model with the mean of the other clusters.

    ``c_k <- beta/(n-1) * sum_{i != k} c_i + (1 - beta) * c_k``, with every
    ``c_i`` the input (the mean of cluster i's client models), not an already
    mixed one.

    Parameters
    ----------
    cluster_models : sequence of sequence of np.ndarray
        n cluster models as lists of layer arrays, all with the same shapes.
    beta : float
        Weight of the other clusters, in [0, 1] (0.5 in the paper). 0 returns
        the inputs unchanged; so does a single cluster.

    Returns
    -------
    list of list of np.ndarray
        n new models (copies), in the dtypes of the inputs.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta} is outside [0, 1]")
    _check_same_shapes(cluster_models, "cluster_models")
    count = len(cluster_models)
    if count == 1:
        return [[np.array(layer, copy=True) for layer in cluster_models[0]]]
    mixed: list[list[np.ndarray]] = [[] for _ in range(count)]
    for layers in zip(*cluster_models, strict=True):
        stacked = np.stack([np.asarray(layer, dtype=np.float64) for layer in layers])
        others = stacked.sum(axis=0) - stacked
        blended = beta / (count - 1) * others + (1.0 - beta) * stacked
        dtype = np.asarray(layers[0]).dtype
        for model, layer in zip(mixed, blended, strict=True):
            model.append(layer.astype(dtype))
    return mixed
