"""Who belongs to which group: group sizes, mixture proportions, label permutations."""

from __future__ import annotations

import numpy as np

from fl_clusters.data.sampling import STREAM_MIXTURE, STREAM_PERMUTATION, stream_rng
from fl_clusters.data.spec import HARD_STRUCTURES, PERMUTATION_STRUCTURES


def client_groups(
    structure: str, num_clients: int, num_groups: int, group_sizes: tuple[float, ...] | None
) -> np.ndarray:
    """Every client's group (int64): ``i % num_groups``, or consecutive blocks sized by shares."""
    if group_sizes is None:
        if structure == "none":
            return np.zeros(num_clients, dtype=np.int64)
        return np.arange(num_clients, dtype=np.int64) % num_groups
    if structure not in HARD_STRUCTURES:
        raise ValueError(
            f"group_sizes={group_sizes} applies to the hard structures 'rotation' and "
            f"'label-permutation', not {structure!r}; leave it empty (None) for {structure!r}"
        )
    shares = np.asarray(group_sizes, dtype=np.float64)
    if shares.shape != (num_groups,) or not np.all(np.isfinite(shares)) or np.any(shares <= 0):
        raise ValueError(
            f"group_sizes={group_sizes} is invalid; allowed: {num_groups} positive finite "
            f"shares, one per group (num_groups={num_groups})"
        )
    if num_clients < num_groups:
        raise ValueError(
            f"num_clients={num_clients} cannot give each of {num_groups} groups a client"
        )
    # Largest remainders of the shares, then every empty group takes a client
    # from the largest one, so that every group exists.
    ideal = shares / shares.sum() * num_clients
    counts = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - counts), kind="stable")
    counts[order[: num_clients - int(counts.sum())]] += 1
    for group in np.flatnonzero(counts == 0):
        counts[np.argmax(counts)] -= 1
        counts[group] = 1
    return np.repeat(np.arange(num_groups, dtype=np.int64), counts)


def client_proportions(
    seed: int, client: int, num_sources: int, mixture_alpha: float
) -> tuple[np.ndarray, np.random.Generator]:
    """A client's Dirichlet source proportions, its own source dominant, and its stream."""
    rng = stream_rng(seed, STREAM_MIXTURE, client)
    draw = rng.dirichlet(np.full(num_sources, mixture_alpha))
    return balanced_proportions(draw, client % num_sources, rng), rng


def balanced_proportions(
    proportions: np.ndarray, dominant: int, rng: np.random.Generator
) -> np.ndarray:
    """Reorder Dirichlet proportions: the largest to ``dominant``, the rest shuffled."""
    ranked = np.sort(proportions)[::-1]
    others = [s for s in range(len(proportions)) if s != dominant]
    order = np.array([dominant, *rng.permutation(others)], dtype=np.int64)
    balanced = np.empty_like(proportions)
    balanced[order] = ranked
    return balanced


def label_permutations(
    structure: str, num_groups: int, num_classes: int, seed: int
) -> tuple[np.ndarray, ...]:
    """Group g's relabeling ``perm_g`` (identity for group 0), pairwise distinct."""
    if structure not in PERMUTATION_STRUCTURES:
        return ()
    rng = stream_rng(seed, STREAM_PERMUTATION)
    permutations = [np.arange(num_classes)]
    while len(permutations) < num_groups:
        candidate = rng.permutation(num_classes)
        # Two groups with the same labelling would be one cluster in disguise.
        if not any(np.array_equal(candidate, seen) for seen in permutations):
            permutations.append(candidate)
    return tuple(permutations)
