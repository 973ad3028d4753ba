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


# E-steps of a refit (node_e_step): enough for pi to reach the boundary when the
# components' per-sample losses differ by a few hundredths (each step then moves the
# ratio of two weights by about that factor).
REFIT_ITERATIONS = 1000


def node_e_step(
    losses: np.ndarray, kept: np.ndarray | None, refit: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A node's E-step of a FedEM round: the responsibilities and its new pi.

    Parameters
    ----------
    losses : np.ndarray
        (M, n) per-sample training losses of the M components the node received.
    kept : np.ndarray | None
        The pi the node kept from its last training round; ``None``: uniform.
    refit : bool
        False: one E-step from ``kept`` (the paper's). True: pi refitted to the
        received components (:func:`fit_mixture_weights`, up to
        :data:`REFIT_ITERATIONS` E-steps from uniform; ``kept`` is not used),
        then the E-step under it: the node's maximum-likelihood pi weighs the
        evidence of all its samples at once, where one E-step from nearly equal
        components leaves every responsibility near 1/M.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        ``q`` (M, n) and the new ``pi`` (M,).
    """
    matrix = _finite_matrix("losses", losses)
    if refit:
        return e_step(matrix, fit_mixture_weights(matrix, max_iter=REFIT_ITERATIONS))
    if kept is None:
        kept = np.full(matrix.shape[0], 1.0 / max(matrix.shape[0], 1))
    return e_step(matrix, kept)


def full_step_scales(weights: np.ndarray) -> np.ndarray:
    """Per component, what a node divides its q-weighted M-step loss by: ``max(pi_m, 1/M)``.

    The paper's loss ``mean_i q(m, i) loss_m(i)`` makes a node's steps on
    component m about ``pi_m`` times those of an unweighted loss; divided by
    ``pi_m`` it is the q-weighted mean, at full step size, for every component
    the node explains at least as well as uniform. Below ``1/M`` the steps
    shrink with ``pi_m`` (no sample weight exceeds M), so a component the node
    hardly explains is not pulled at full size by a few of its samples.

    Parameters
    ----------
    weights : np.ndarray
        (M,) the node's mixture weights pi.
    """
    pi = _check_weights(weights, np.asarray(weights).shape[0])
    return np.maximum(pi, 1.0 / pi.size)


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
