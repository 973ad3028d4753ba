"""The index plan of a federation: every client's samples, group and sources, no pixels.

A plan is small: the samples of all clients are slices of a few shuffled arrays of
the data set's size (:mod:`fl_clusters.data.pieces`), decided for every client at
once, and a client's :class:`ClientPlan` (its indices, sources and held-out splits) is
built from them when asked for. So a process caches the whole federation's plan, even
at a million clients, and builds the pixels of the clients it hosts
(:mod:`fl_clusters.data.client_data`).
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.common.logger import log

from fl_clusters.data.groups import client_groups, client_proportions, label_permutations
from fl_clusters.data.loaders import ImageDataset
from fl_clusters.data.pieces import Pieces, role_counts
from fl_clusters.data.sampling import held_out_positions, missing_held_out, sample_roles
from fl_clusters.data.slicing import client_pieces
from fl_clusters.data.spec import MIXTURE_STRUCTURES, PartitionSpec, checked_spec


@dataclass(frozen=True)
class ClientPlan:
    """Which samples a client gets and how they are transformed, without the pixels."""

    train_idx: np.ndarray
    test_idx: np.ndarray
    val_idx: np.ndarray
    group: int
    train_sources: np.ndarray
    test_sources: np.ndarray
    val_sources: np.ndarray
    noisy: bool


@dataclass(frozen=True)
class Plan:
    """Every client's samples and group, and the transforms their groups share.

    Parameters
    ----------
    spec : PartitionSpec
        The checked settings the plan was made with.
    num_clients : int
        Clients of the federation, ids ``0 .. num_clients - 1``.
    permutations : tuple[np.ndarray, ...]
        Each group's (or source's) relabelling for the permutation structures.
    groups : np.ndarray
        int64 ``(num_clients,)``: every client's ground-truth group.
    pieces : Pieces
        Every client's samples, as slices of shuffled pools.
    roles : np.ndarray | None
        With ``copy_per_group``: every sample's held-out role
        (:func:`~fl_clusters.data.sampling.sample_roles`); otherwise ``None``.
    overlapping : bool
        Whether clients share samples: ``samples_per_client`` asked more of a
        copy (or of the data set) than it holds.
    """

    spec: PartitionSpec
    num_clients: int
    permutations: tuple[np.ndarray, ...]
    groups: np.ndarray
    pieces: Pieces
    roles: np.ndarray | None
    overlapping: bool

    @property
    def structure(self) -> str:
        """The cluster structure (:data:`~fl_clusters.data.spec.CLUSTER_STRUCTURES`)."""
        return self.spec.structure

    @property
    def num_groups(self) -> int:
        """Ground-truth groups (sources for the mixtures)."""
        return self.spec.num_groups

    @property
    def rotation_step(self) -> float:
        """Degrees between consecutive rotation groups (0: spread evenly)."""
        return self.spec.rotation_step

    @property
    def seed(self) -> int:
        """Seed of every random draw."""
        return self.spec.seed

    def client(self, client_id: int) -> ClientPlan:
        """Client ``client_id``'s samples, sources and held-out splits.

        Built on each call from the plan's slices (a few small arrays and one
        client's shuffle, microseconds), so nothing is kept per client.

        Raises
        ------
        ValueError
            For an id outside ``[0, num_clients)``.
        """
        if not 0 <= client_id < self.num_clients:
            raise ValueError(
                f"client {client_id} is outside [0, {self.num_clients - 1}] for a plan of "
                f"{self.num_clients} clients"
            )
        spec = self.spec
        indices, pools = self.pieces.samples(client_id)
        group = int(self.groups[client_id])
        if spec.structure in MIXTURE_STRUCTURES and spec.copies:
            # A mixture's copies are one pool per source.
            sources = pools
        elif spec.structure in MIXTURE_STRUCTURES:
            share, rng = client_proportions(spec.seed, client_id, spec.num_groups,
                                            spec.mixture_alpha)
            sources = rng.choice(spec.num_groups, size=len(indices), p=share)
        else:
            sources = np.full(len(indices), group)
        test_pos, val_pos, train_pos = held_out_positions(
            client_id, indices, self.roles, spec.test_fraction, spec.validation_fraction,
            spec.seed,
        )
        return ClientPlan(
            train_idx=indices[train_pos],
            test_idx=indices[test_pos],
            val_idx=indices[val_pos],
            group=group,
            train_sources=sources[train_pos],
            test_sources=sources[test_pos],
            val_sources=sources[val_pos],
            noisy=client_id >= self.num_clients - spec.noisy_clients,
        )


def plan_partition(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> Plan:
    """Check ``spec`` and decide every client's samples, group and sources.

    Raises
    ------
    ValueError
        For a setting outside its allowed values, a data set too small for the
        clients, or (with ``copy_per_group``) a client without a test, validation
        or train sample: the first such client, whichever process asks.
    """
    spec = checked_spec(dataset, num_clients, spec)
    permutations = label_permutations(
        spec.structure, spec.num_groups, dataset.num_classes, spec.seed
    )
    groups = client_groups(spec.structure, num_clients, spec.num_groups, spec.group_sizes)
    roles = (
        sample_roles(len(dataset.y), spec.test_fraction, spec.validation_fraction, spec.seed)
        if spec.copies
        else None
    )
    pieces = client_pieces(dataset, num_clients, spec, groups, roles)
    if roles is not None:
        _check_roles(pieces, roles, spec)
    return Plan(spec, num_clients, permutations, groups, pieces, roles,
                _overlapping(pieces, spec))


def _check_roles(pieces: Pieces, roles: np.ndarray, spec: PartitionSpec) -> None:
    """Refuse a plan in which a client lacks a test, (needed) validation or train sample."""
    counts = role_counts(pieces, roles, num_roles=3)
    needed = np.array([True, spec.validation_fraction > 0, True])
    lacking = (counts == 0) & needed
    short = np.flatnonzero(lacking.any(axis=1))
    if len(short):
        client = int(short[0])
        role = int(np.argmax(lacking[client]))
        raise ValueError(missing_held_out(
            client, role, int(counts[client].sum()), spec.samples_per_client > 0
        ))


def _overlapping(pieces: Pieces, spec: PartitionSpec) -> bool:
    """Whether the clients share samples; if so, say so once, with the numbers and fixes."""
    wanted, available = pieces.demand(), np.array([len(pool) for pool in pieces.pools])
    over = np.flatnonzero(wanted > available)
    if not len(over):
        return False
    pool = int(over[np.argmax(wanted[over] - available[over])])
    clients = int(np.count_nonzero((pieces.pool == pool) & (pieces.length > 0)))
    if spec.copies:
        kind = "source" if spec.structure in MIXTURE_STRUCTURES else "group"
        what = f"{kind} {pool}'s copy of the data set"
    else:
        what = "the data set"
    per_client = spec.samples_per_client
    log(
        WARNING,
        "samples_per_client=%d: the %d clients that draw from %s take %d samples of its %d, "
        "so clients share samples (each client's %d stay distinct). Fix, for disjoint "
        "clients: at most %d clients drawing from it, a smaller samples-per-client, %sor a "
        "larger data set",
        per_client, clients, what, int(wanted[pool]), int(available[pool]), per_client,
        int(available[pool]) // per_client, (
            "copy-per-group, "
            if not spec.copies and spec.structure != "none" and spec.num_groups > 1
            else ""
        ),
    )
    return True
