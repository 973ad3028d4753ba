"""The index plan of a federation: every client's samples, group and sources, no pixels.

A plan is small (indices only), so a process caches the whole federation's plan and
builds the pixels of the clients it hosts (:mod:`fl_clusters.data.client_data`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl_clusters.data.groups import client_groups, client_proportions, label_permutations
from fl_clusters.data.loaders import ImageDataset
from fl_clusters.data.sampling import (
    held_out_positions,
    sample_roles,
    split_group_copies,
    split_samples,
    split_source_copies,
)
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
    """Every client's :class:`ClientPlan` and the transforms their groups share."""

    structure: str
    num_groups: int
    rotation_step: float
    seed: int
    permutations: tuple[np.ndarray, ...]
    clients: tuple[ClientPlan, ...]


def plan_partition(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> Plan:
    """Check ``spec`` and decide every client's indices, group and sources."""
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
    client_indices, client_sources = _client_samples(dataset, num_clients, spec, groups)
    clients = []
    for client, (indices, sources) in enumerate(zip(client_indices, client_sources, strict=True)):
        test_pos, val_pos, train_pos = held_out_positions(
            client, indices, roles, spec.test_fraction, spec.validation_fraction, spec.seed
        )
        clients.append(
            ClientPlan(
                train_idx=indices[train_pos],
                test_idx=indices[test_pos],
                val_idx=indices[val_pos],
                group=groups[client],
                train_sources=sources[train_pos],
                test_sources=sources[test_pos],
                val_sources=sources[val_pos],
                noisy=client >= num_clients - spec.noisy_clients,
            )
        )
    return Plan(
        spec.structure, spec.num_groups, spec.rotation_step, spec.seed, permutations,
        tuple(clients),
    )


def _client_samples(
    dataset: ImageDataset, num_clients: int, spec: PartitionSpec, groups: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every client's sample indices and the source (group transform) of each sample."""
    num_groups, seed = spec.num_groups, spec.seed
    mixture = spec.structure in MIXTURE_STRUCTURES
    if spec.copies and mixture:
        proportions = np.stack([
            client_proportions(seed, client, num_groups, spec.mixture_alpha)[0]
            for client in range(num_clients)
        ])
        return split_source_copies(len(dataset.y), proportions, seed)
    if spec.copies:
        client_indices = split_group_copies(
            dataset.y, groups, num_groups, spec.dirichlet_alpha, seed
        )
        sources = [np.full(len(idx), groups[c]) for c, idx in enumerate(client_indices)]
        return client_indices, sources
    client_indices = split_samples(dataset.y, num_clients, spec.dirichlet_alpha, seed)
    client_sources = []
    for client, indices in enumerate(client_indices):
        if mixture:
            share, rng = client_proportions(seed, client, num_groups, spec.mixture_alpha)
            client_sources.append(rng.choice(num_groups, size=len(indices), p=share))
        else:
            client_sources.append(np.full(len(indices), groups[client]))
    return client_indices, client_sources
