"""How the samples go to clients: every client's slices of the shuffled pools, at once.

Each split of :func:`fl_clusters.data.partition_dataset` as
:class:`~fl_clusters.data.pieces.Pieces`: IID shards (or ``samples_per_client``
slices) of one shuffle, of each group's copy, or of each mixture source's copy, and
the natural split by user, cut with array arithmetic for all clients together.
Two splits still go client by client, as they draw per client: the Dirichlet label
skew (flwr-datasets' ``DirichletPartitioner``, one ``load_partition`` call a client,
about 3 ms each) and the mixture sources' copies (each client's proportions come
from a stream of its own, some 40 microseconds a client: 40 s at a million).
"""

from __future__ import annotations

import numpy as np

from fl_clusters.data.groups import client_proportions
from fl_clusters.data.loaders import ImageDataset
from fl_clusters.data.pieces import (
    Pieces,
    flat_pieces,
    group_ranks,
    largest_remainders,
    shard_bounds,
    single_slices,
    spread_roles,
)
from fl_clusters.data.sampling import (
    STREAM_COPY,
    shuffled,
    split_group_copies,
    split_samples,
    stream_rng,
)
from fl_clusters.data.spec import MIXTURE_STRUCTURES, PartitionSpec


def client_pieces(
    dataset: ImageDataset,
    num_clients: int,
    spec: PartitionSpec,
    groups: np.ndarray,
    roles: np.ndarray | None,
) -> Pieces:
    """Every client's samples under ``spec`` (checked), as slices of shuffled pools.

    ``roles`` (with copies) are the samples' held-out roles: ``samples_per_client``
    slices are then cut from shuffles that spread each role evenly
    (:func:`~fl_clusters.data.pieces.spread_roles`).
    """
    if spec.natural_ids:
        return natural_pieces(dataset.ids)
    if spec.copies and spec.structure in MIXTURE_STRUCTURES:
        return _source_copies(len(dataset.y), num_clients, spec, roles)
    if spec.copies:
        return _group_copies(dataset.y, groups, spec, roles)
    if spec.dirichlet_alpha > 0.0:
        return flat_pieces(split_samples(dataset.y, num_clients, spec.dirichlet_alpha, spec.seed))
    ranks = np.arange(num_clients)
    start, length = _slices(len(dataset.y), num_clients, ranks, spec.samples_per_client)
    return single_slices(
        (shuffled(len(dataset.y), spec.seed),), np.zeros(num_clients, dtype=np.int64),
        start, length,
    )


def natural_pieces(ids: np.ndarray) -> Pieces:
    """One client per distinct id, as flwr-datasets' ``NaturalIdPartitioner`` splits.

    Client ``k`` holds the samples of the ``k``-th id in sorted order, in the data
    set's order: the partitioner's ``load_partition(k)``, for all users in one sort
    instead of one ``select`` a user.
    """
    _, user = np.unique(ids, return_inverse=True)
    order = np.argsort(user.ravel(), kind="stable").astype(np.int64)
    sizes = np.bincount(user.ravel()).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return single_slices((order,), np.zeros(len(sizes), dtype=np.int64), starts, sizes)


def _slices(
    num_samples: int, sharers: np.ndarray | int, ranks: np.ndarray, per_client: int
) -> tuple[np.ndarray, np.ndarray]:
    """Start and length of each client's slice of the pool it shares with ``sharers`` - 1.

    ``per_client`` 0: the pool's IID shards; otherwise consecutive slices of
    ``per_client``, wrapping around the pool once they pass its end.
    """
    if per_client == 0:
        return shard_bounds(num_samples, sharers, ranks)
    start = (ranks * per_client) % num_samples
    return start.astype(np.int64), np.full(len(ranks), per_client, dtype=np.int64)


def _group_copies(
    labels: np.ndarray, groups: np.ndarray, spec: PartitionSpec, roles: np.ndarray | None
) -> Pieces:
    """Each group's copy of the data set, split over that group's clients."""
    if spec.dirichlet_alpha > 0.0:
        return flat_pieces(
            split_group_copies(labels, groups, spec.num_groups, spec.dirichlet_alpha, spec.seed)
        )
    pools = []
    for group in range(spec.num_groups):
        # A distinct seed per group: the groups' copies are split differently.
        order = shuffled(len(labels), spec.seed * spec.num_groups + group)
        pools.append(spread_roles(order, roles) if spec.samples_per_client else order)
    ranks, sizes = group_ranks(groups, spec.num_groups)
    start, length = _slices(len(labels), sizes[groups], ranks, spec.samples_per_client)
    return single_slices(tuple(pools), groups.astype(np.int64), start, length)


def _source_copies(
    num_samples: int, num_clients: int, spec: PartitionSpec, roles: np.ndarray | None
) -> Pieces:
    """Divide every source's copy of the data set among clients by their share of it.

    Client ``k`` gets ``proportions[k, s] / proportions[:, s].sum()`` of source
    ``s``'s shuffled copy, so its sample count is about ``num_groups * num_samples
    / num_clients`` and its mixture follows its proportions; with
    ``samples_per_client`` ``n``, ``proportions[k, s] * n`` samples of it (rounded
    to sum to ``n``), consecutive slices in client order.
    """
    num_sources, per_client = spec.num_groups, spec.samples_per_client
    proportions = np.stack([
        client_proportions(spec.seed, client, num_sources, spec.mixture_alpha)[0]
        for client in range(num_clients)
    ])
    if per_client:
        counts = largest_remainders(proportions * per_client, per_client)
    pools, starts, lengths = [], [], []
    for source in range(num_sources):
        order = stream_rng(spec.seed, STREAM_COPY, source).permutation(num_samples)
        if per_client:
            pools.append(spread_roles(order, roles))
            lengths.append(counts[:, source])
            starts.append((np.cumsum(counts[:, source]) - counts[:, source]) % num_samples)
            continue
        pools.append(order)
        shares = proportions[:, source] / proportions[:, source].sum()
        bounds = np.round(np.concatenate([[0.0], np.cumsum(shares)]) * num_samples)
        starts.append(bounds[:-1].astype(np.int64))
        lengths.append(np.diff(bounds).astype(np.int64))
    pool = np.broadcast_to(np.arange(num_sources), (num_clients, num_sources))
    return Pieces(tuple(pools), pool.copy(), np.stack(starts, axis=1), np.stack(lengths, axis=1))
