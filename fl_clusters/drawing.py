"""Drawing fresh models: the random cluster models a strategy starts from.

Server and clients both draw (IFCA's restarts travel as seeds, and every node
draws exactly the arrays the server draws), so the drawing is a function of the
model and the seed only.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from fl_clusters.protocol import head_keys, numpy_to_record, pack_clusters, split_shared


def random_like(model: ArrayRecord, rng: np.random.Generator) -> ArrayRecord:
    """Draw a fresh model with the same shapes and per-array scale as ``model``.

    Each floating array is redrawn uniformly in ``+-sqrt(3) * std`` of the given
    array (torch's default initializations are uniform, so this matches their
    scale); constant arrays (zero biases, counters) are kept. IFCA needs k models
    that start different: k copies of one model make every client pick cluster 0.
    """
    names = list(model.keys())
    arrays = []
    for name in names:
        values = model[name].numpy()
        std = float(values.std()) if np.issubdtype(values.dtype, np.floating) else 0.0
        if std > 0.0:
            bound = np.sqrt(3.0) * std
            values = rng.uniform(-bound, bound, size=values.shape).astype(values.dtype)
        arrays.append(values)
    return numpy_to_record(names, arrays)


def draw_clusters(
    model: ArrayRecord, num_clusters: int, head_layers: int, seed: int
) -> ArrayRecord:
    """IFCA's ``num_clusters`` random cluster models around ``model``, packed.

    Server and clients both call it: a restart's candidates travel as a seed, and
    every node draws exactly the arrays the server draws from the same ``model``.
    With ``head_layers`` > 0 only those last layers are drawn; the body is the
    given (possibly pretrained) one, shared.
    """
    rng = np.random.default_rng(seed)
    if head_layers == 0:
        return pack_clusters([random_like(model, rng) for _ in range(num_clusters)])
    body, head = split_shared(model, head_keys(model, head_layers))
    return pack_clusters([random_like(head, rng) for _ in range(num_clusters)], shared=body)
