"""FedSoft (Ruan and Joe-Wong 2022): importance weights and per-cluster client sampling."""

from __future__ import annotations

import numpy as np

from fl_clusters.clustering.similarity import _finite_matrix


def best_fit_counts(losses: np.ndarray) -> np.ndarray:
    """FedSoft's ``n_ks``: how many samples each cluster fits best, ties shared.

    A sample whose lowest loss is reached by several clusters (identical cluster
    models, or a loss that saturates) counts ``1/t`` for each of its ``t`` best
    clusters: ``argmin`` would hand every tie to the first cluster and bias the
    importance weights towards cluster 0 exactly when they carry no information.

    Parameters
    ----------
    losses : np.ndarray
        (S, n) finite per-sample losses of S cluster models on n samples.

    Returns
    -------
    np.ndarray
        (S,) float64 counts summing to n.
    """
    matrix = _finite_matrix("losses", losses).astype(np.float64)
    best = matrix == matrix.min(axis=0, keepdims=True)
    return (best / best.sum(axis=0, keepdims=True)).sum(axis=1)


def importance_weights(counts: np.ndarray, sigma: float) -> np.ndarray:
    """Importance weights ``u_ks = max(n_ks / n_k, sigma)``.

    The rows are not renormalized after the floor, as in the paper: ``u`` is used
    only as proximal weights and, through :func:`selection_probabilities`, in
    ratios, so a row may sum to slightly more than 1.

    Parameters
    ----------
    counts : np.ndarray
        (N, S) non-negative counts: ``counts[k, s]`` is how many of client k's
        samples have cluster s as their lowest-loss cluster. Every client needs
        at least one sample.
    sigma : float
        Floor of every weight, in [0, 1], so each cluster keeps a chance of
        being trained by each client (1e-4 in our defaults).

    Returns
    -------
    np.ndarray
        (N, S) float64 weights, each in [sigma, 1].
    """
    if not 0.0 <= sigma <= 1.0:
        raise ValueError(f"sigma={sigma} is outside [0, 1]")
    matrix = _finite_matrix("counts", counts).astype(np.float64)
    if np.any(matrix < 0):
        raise ValueError("counts must be non-negative")
    totals = matrix.sum(axis=1)
    if np.any(totals <= 0):
        raise ValueError(f"counts has clients with no samples (rows {np.flatnonzero(totals <= 0)})")
    return np.maximum(matrix / totals[:, None], sigma)


def selection_probabilities(u: np.ndarray, num_samples: np.ndarray) -> np.ndarray:
    """Per-cluster client selection probabilities ``v_sk = u_ks n_k / sum_k' u_k's n_k'``.

    Parameters
    ----------
    u : np.ndarray
        (N, S) importance weights from :func:`importance_weights`.
    num_samples : np.ndarray
        (N,) positive sample counts ``n_k``.

    Returns
    -------
    np.ndarray
        (S, N) float64; each row sums to 1, except the row of a cluster that no
        client weighs at all (possible only with ``sigma = 0``), which is all
        zeros: no client can train it.
    """
    weights = _finite_matrix("u", u).astype(np.float64)
    sizes = np.asarray(num_samples, dtype=np.float64)
    if sizes.shape != (weights.shape[0],):
        raise ValueError(
            f"num_samples must have shape ({weights.shape[0]},) to match u, got {sizes.shape}"
        )
    if np.any(weights < 0):
        raise ValueError("u must be non-negative")
    if not np.all(sizes > 0) or not np.all(np.isfinite(sizes)):
        raise ValueError("num_samples must be positive and finite")
    mass = (weights * sizes[:, None]).T
    totals = mass.sum(axis=1, keepdims=True)
    return np.divide(mass, totals, out=np.zeros_like(mass), where=totals > 0)


def sample_per_cluster(v: np.ndarray, K: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Draw K clients for every cluster with probabilities ``v``, independently per cluster.

    A client can be drawn for several clusters; within a cluster it is drawn at
    most once.

    Parameters
    ----------
    v : np.ndarray
        (S, N) selection probabilities from :func:`selection_probabilities`.
    K : int
        Clients per cluster, >= 1. Capped at the number of clients with a
        non-zero probability for that cluster (at most N).
    rng : np.random.Generator
        Source of randomness.

    Returns
    -------
    list of np.ndarray
        S sorted int arrays of client indices; empty for a cluster whose row is
        all zeros.
    """
    if K < 1:
        raise ValueError(f"K={K} is outside [1, inf)")
    probabilities = _finite_matrix("v", v).astype(np.float64)
    if np.any(probabilities < 0):
        raise ValueError("v must be non-negative")
    samples = []
    for row in probabilities:
        eligible = int(np.count_nonzero(row))
        if eligible == 0:
            samples.append(np.zeros(0, dtype=np.int64))
            continue
        # Renormalize against rounding so the draw does not reject a row that
        # sums to 1 only approximately.
        picked = rng.choice(row.size, size=min(K, eligible), replace=False, p=row / row.sum())
        samples.append(np.sort(picked))
    return samples
