"""How k cluster models start: the local-k-means warm start, or the best random restart."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_clusters.clustering.gates import output_layer_profiles, unit_rows
from fl_clusters.clustering.similarity import model_updates


def warm_start_points(
    start: Sequence[np.ndarray], trained: Sequence[Sequence[np.ndarray]]
) -> np.ndarray:
    """The output layer's updates of the clients (their whole unit update without one).

    From a random start the whole update is dominated by each client's label
    frequencies (Dirichlet skew); the output layer's rows, less their mean, carry
    which inputs go to which label (label permutations, rotations), see
    :func:`~fl_clusters.clustering.output_layer_profiles`. The output layer is
    the model's last 2-D array.

    Parameters
    ----------
    start : sequence of np.ndarray
        The model (layer arrays) every client trained from.
    trained : sequence of sequence of np.ndarray
        N trained client models, layers in the order of ``start``.

    Returns
    -------
    np.ndarray
        (N, D) float64 rows of unit norm (or 0), one per client.
    """
    matrices = [i for i, layer in enumerate(start) if np.ndim(layer) == 2]
    if not matrices:
        return unit_rows(model_updates(trained, start))
    last = matrices[-1]
    origin = np.asarray(start[last]).astype(np.float64)
    return output_layer_profiles(np.stack([np.asarray(model[last]) - origin for model in trained]))


def most_balanced_restart(losses: np.ndarray) -> tuple[int, np.ndarray]:
    """The random restart whose loss-based assignment spreads clients most evenly.

    A restart in which most clients pick the same cluster leaves the others
    without data from round 1; the entropy of the cluster shares measures how
    evenly they spread (ties: the first restart).

    Parameters
    ----------
    losses : np.ndarray
        (N, R, k) each client's loss under each restart's k cluster models.

    Returns
    -------
    tuple
        ``(best, counts)``: the index of the best restart, and the (R, k) number of
        clients that pick each cluster under each restart.
    """
    table = np.asarray(losses, dtype=np.float64)
    if table.ndim != 3 or table.shape[0] == 0:
        raise ValueError(f"losses must be a (N, R, k) array with N >= 1, got {table.shape}")
    counts = np.stack([np.bincount(table[:, r].argmin(axis=1), minlength=table.shape[2])
                       for r in range(table.shape[1])])
    best, best_score = 0, -1.0
    for r, row in enumerate(counts):
        shares = row[row > 0] / row.sum()
        score = float(-(shares * np.log(shares)).sum())
        if score > best_score:
            best, best_score = r, score
    return best, counts
