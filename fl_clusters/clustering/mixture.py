"""FedEM (Marfoq et al., NeurIPS 2021): a client's E-step and mixture prediction."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from fl_clusters.clustering.similarity import _finite_matrix


def _check_weights(weights: np.ndarray, num_components: int) -> np.ndarray:
    pi = np.asarray(weights, dtype=np.float64)
    if pi.shape != (num_components,) or not np.all(np.isfinite(pi)) or np.any(pi < 0):
        raise ValueError(
            f"mixture weights must be {num_components} finite non-negative values, got {pi!r}"
        )
    if not pi.sum() > 0:
        raise ValueError("mixture weights sum to 0; at least one component needs weight")
    return pi / pi.sum()


def responsibilities(losses: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """FedEM's E-step: ``q(m, i)`` proportional to ``pi_m exp(-loss_m(x_i, y_i))``.

    Computed in log space (a softmax over components of ``log pi_m - loss``), so
    large losses do not underflow to an all-zero column.

    Parameters
    ----------
    losses : np.ndarray
        (M, n) finite per-sample losses of M components on n samples (the negative
        log-likelihood of each sample under each component).
    weights : np.ndarray
        (M,) mixture weights pi, non-negative, not all zero (renormalized here).

    Returns
    -------
    np.ndarray
        (M, n) float64; every column sums to 1, zero where ``pi_m`` is 0.
    """
    matrix = _finite_matrix("losses", losses).astype(np.float64)
    pi = _check_weights(weights, matrix.shape[0])
    with np.errstate(divide="ignore"):
        log_joint = np.log(pi)[:, None] - matrix
    return np.exp(log_joint - logsumexp(log_joint, axis=0, keepdims=True))


def e_step(losses: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One E-step: the responsibilities and the updated mixture weights ``pi = mean_i q``.

    Parameters
    ----------
    losses : np.ndarray
        (M, n) per-sample losses of the M components on the client's TRAINING
        samples (never its test split: pi then decides the test prediction).
    weights : np.ndarray
        (M,) current mixture weights pi.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        ``q`` (M, n) and the new ``pi`` (M,), which sums to 1.
    """
    q = responsibilities(losses, weights)
    if q.shape[1] == 0:
        raise ValueError("losses has no sample; the E-step needs the client's training samples")
    return q, q.mean(axis=1)


def fit_mixture_weights(
    losses: np.ndarray, max_iter: int = 100, tol: float = 1e-6
) -> np.ndarray:
    """Mixture weights of fixed components: E-steps from uniform pi until pi settles.

    What a client that never trained uses: with the components fixed, EM only
    updates pi, which converges to the maximum-likelihood weights.

    Parameters
    ----------
    losses : np.ndarray
        (M, n) per-sample training losses of the M components.
    max_iter : int
        Most E-steps, >= 1.
    tol : float
        Stop when no weight moves by more than this, >= 0.
    """
    if max_iter < 1 or tol < 0:
        raise ValueError(f"max_iter={max_iter} must be >= 1 and tol={tol} >= 0")
    matrix = _finite_matrix("losses", losses)
    pi = np.full(matrix.shape[0], 1.0 / max(matrix.shape[0], 1))
    for _ in range(max_iter):
        _, new = e_step(matrix, pi)
        done = np.max(np.abs(new - pi)) <= tol
        pi = new
        if done:
            break
    return pi


def mixture_probabilities(probabilities: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """FedEM's personalized prediction ``p(y | x) = sum_m pi_m p_m(y | x)``.

    Parameters
    ----------
    probabilities : np.ndarray
        (M, n, C) class probabilities of each component on n samples.
    weights : np.ndarray
        (M,) the client's mixture weights pi.

    Returns
    -------
    np.ndarray
        (n, C) float64 class probabilities of the mixture.
    """
    probs = np.asarray(probabilities, dtype=np.float64)
    if probs.ndim != 3 or not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise ValueError(
            f"probabilities must be a finite non-negative (M, n, C) array, got shape {probs.shape}"
        )
    pi = _check_weights(weights, probs.shape[0])
    return np.tensordot(pi, probs, axes=1)
