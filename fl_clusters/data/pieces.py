"""Every client's samples as slices of a few pools, decided for all clients at once.

A pool is a flat array of sample indices (a shuffled data set, a group's shuffled
copy...); a client's samples are one slice of a pool, or one slice of each pool for
the mixtures' copies. A federation's plan then holds a few arrays of the data set's
size and three numbers a client and pool, instead of one array per client: at a
million clients it is built in seconds and holds tens of megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Pieces:
    """The slices of the pools that make up each client's samples.

    Parameters
    ----------
    pools : tuple[np.ndarray, ...]
        int64 sample indices, one flat array per pool.
    pool : np.ndarray
        int64 ``(num_clients, K)``: the pool each of a client's ``K`` slices is cut from.
    start : np.ndarray
        int64 ``(num_clients, K)``: where each slice starts in its pool.
    length : np.ndarray
        int64 ``(num_clients, K)``: its length, at most its pool's; a slice that
        runs past the pool's end wraps around to its start.
    """

    pools: tuple[np.ndarray, ...]
    pool: np.ndarray
    start: np.ndarray
    length: np.ndarray

    def samples(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """The client's sample indices, slice after slice, and the pool of each."""
        parts = [
            self.pools[pool][(start + np.arange(length)) % len(self.pools[pool])]
            for pool, start, length in zip(
                self.pool[client], self.start[client], self.length[client], strict=True
            )
        ]
        return np.concatenate(parts), np.repeat(self.pool[client], self.length[client])

    def demand(self) -> np.ndarray:
        """The number of samples the clients take from each pool, int64."""
        taken = np.bincount(
            self.pool.ravel(), weights=self.length.ravel(), minlength=len(self.pools)
        )
        return taken.astype(np.int64)


def single_slices(pools: tuple[np.ndarray, ...], pool: np.ndarray, start: np.ndarray,
                  length: np.ndarray) -> Pieces:
    """:class:`Pieces` of one slice a client, from flat per-client arrays."""
    return Pieces(pools, pool[:, None], start[:, None], length[:, None])


def flat_pieces(client_indices: list[np.ndarray]) -> Pieces:
    """One pool, the clients' index arrays end to end: for splits drawn client by client."""
    lengths = np.array([len(indices) for indices in client_indices], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pool = np.concatenate(client_indices).astype(np.int64)
    return single_slices((pool,), np.zeros(len(lengths), dtype=np.int64), starts, lengths)


def shard_bounds(num_samples: int, num_parts: int, rank: np.ndarray) -> tuple[np.ndarray, ...]:
    """Start and length of shard ``rank`` when ``np.array_split`` cuts ``num_samples``.

    The first ``num_samples % num_parts`` shards are one sample longer.
    """
    base, longer = divmod(num_samples, num_parts)
    start = rank * base + np.minimum(rank, longer)
    length = base + (rank < longer)
    return start.astype(np.int64), length.astype(np.int64)


def group_ranks(groups: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Every client's rank among its group's clients (by id) and each group's size."""
    sizes = np.bincount(groups, minlength=num_groups)
    by_group = np.argsort(groups, kind="stable")
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ranks = np.empty(len(groups), dtype=np.int64)
    ranks[by_group] = np.arange(len(groups)) - first[groups[by_group]]
    return ranks, sizes


def spread_roles(order: np.ndarray, roles: np.ndarray) -> np.ndarray:
    """``order`` rearranged so that each role's samples are evenly spaced along it.

    Each role keeps its samples' order in ``order``; its ``j``-th of ``c`` samples
    moves to about position ``(j + 1/2) / c`` of the whole. Any ``n`` consecutive
    samples (wrapping around) then hold about ``n`` times each role's share, so a
    client's slice of ``n`` samples has its share of test samples, where a slice of
    a plain shuffle misses them now and then (0.8 ** 50 for 50 samples and
    test_fraction 0.2: some 14 clients in a million).
    """
    role_of = roles[order]
    key = np.empty(len(order))
    for role in np.unique(role_of):
        where = np.flatnonzero(role_of == role)
        key[where] = (np.arange(len(where)) + 0.5) / len(where)
    return order[np.argsort(key, kind="stable")]


def largest_remainders(ideal: np.ndarray, total: int) -> np.ndarray:
    """Round each row of ``ideal`` (rows summing to ``total``) to integers summing to it."""
    counts = np.floor(ideal).astype(np.int64)
    # The row's largest remainders get the samples the floors leave out.
    order = np.argsort(-(ideal - counts), axis=1, kind="stable")
    place = np.empty_like(order)
    np.put_along_axis(place, order, np.arange(ideal.shape[1])[None, :], axis=1)
    counts += place < (total - counts.sum(axis=1))[:, None]
    return counts


def role_counts(pieces: Pieces, roles: np.ndarray, num_roles: int) -> np.ndarray:
    """int64 ``(num_clients, num_roles)``: how many samples of each role a client holds."""
    counts = np.zeros((len(pieces.pool), num_roles), dtype=np.int64)
    for index, pool in enumerate(pieces.pools):
        size = len(pool)
        # Cumulative counts of each role along the pool, so that any slice's count is
        # one difference, wrapping slices counting the whole pool once per turn.
        cumulative = np.zeros((size + 1, num_roles), dtype=np.int64)
        cumulative[1:] = np.cumsum(np.eye(num_roles, dtype=np.int64)[roles[pool]], axis=0)

        def upto(end: np.ndarray, size: int = size, cumulative: np.ndarray = cumulative
                 ) -> np.ndarray:
            return (end // size)[:, None] * cumulative[size] + cumulative[end % size]

        for slot in range(pieces.pool.shape[1]):
            mine = np.flatnonzero(pieces.pool[:, slot] == index)
            start = pieces.start[mine, slot]
            counts[mine] += upto(start + pieces.length[mine, slot]) - upto(start)
    return counts
