"""Which samples each client gets: the split of the data set and its held-out shares.

Every draw takes its own stream of randomness (:func:`stream_rng`), mixed from the seed
and a stream id, so that each is reproducible on its own, whatever else is drawn
before it.
"""

from __future__ import annotations

import numpy as np

from fl_clusters.data.pieces import shard_bounds
from fl_clusters.data.spec import MIN_CLIENT_SAMPLES, held_out_sizes

# Distinct streams of randomness, mixed with the seed (and client id).
(
    STREAM_SHUFFLE,
    STREAM_TEST,
    STREAM_MIXTURE,
    STREAM_PERMUTATION,
    STREAM_NOISE,
    STREAM_ROLES,
    STREAM_COPY,
) = range(7)

# A sample's role when held-out splits are decided once for the whole data set.
ROLE_TEST, ROLE_VALIDATION, ROLE_TRAIN = range(3)


def stream_rng(seed: int, *stream: int) -> np.random.Generator:
    """The generator of one stream of randomness (see the stream ids above)."""
    return np.random.default_rng([seed, *stream])


def shuffled(num_samples: int, seed: int) -> np.ndarray:
    """The seeded shuffle of a data set's sample indices that IID splits cut, int64."""
    return stream_rng(seed, STREAM_SHUFFLE).permutation(num_samples).astype(np.int64)


def split_samples(
    labels: np.ndarray, num_clients: int, dirichlet_alpha: float, seed: int
) -> list[np.ndarray]:
    """Sample indices of each client, IID or Dirichlet label skew (flwr-datasets).

    IID: the shuffled rows cut into ``num_clients`` contiguous shards, the first
    ``len(labels) % num_clients`` one row longer: the shards of flwr-datasets'
    ``IidPartitioner`` (``Dataset.shard(contiguous=True)``), cut in one call
    instead of one shard call per client (3 ms each, 30 s at 10,000 clients).
    """
    if dirichlet_alpha == 0.0:
        order = shuffled(len(labels), seed)
        starts, lengths = shard_bounds(len(labels), num_clients, np.arange(num_clients))
        return [order[start : start + size] for start, size in zip(starts, lengths, strict=True)]
    import datasets as hf_datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=dirichlet_alpha,
        min_partition_size=MIN_CLIENT_SAMPLES,
        self_balancing=False,
        seed=seed,
    )
    order = np.arange(len(labels))
    partitioner.dataset = hf_datasets.Dataset.from_dict({"label": labels, "idx": order})
    try:
        return [
            # Slicing the column reads it in one go; converting the lazy column
            # object itself would format it row by row.
            np.asarray(
                partitioner.load_partition(client).with_format("numpy")["idx"][:], dtype=np.int64
            )
            for client in range(num_clients)
        ]
    except ValueError as err:
        raise ValueError(
            f"dirichlet_alpha={dirichlet_alpha} with num_clients={num_clients} left a "
            f"client with fewer than {MIN_CLIENT_SAMPLES} samples in every try ({err}); "
            f"raise dirichlet_alpha or lower num_clients"
        ) from err


def split_group_copies(
    labels: np.ndarray, groups: list[int], num_groups: int, dirichlet_alpha: float, seed: int
) -> list[np.ndarray]:
    """Each group's copy of the whole data set, split over that group's clients."""
    indices: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(groups)
    for group in range(num_groups):
        members = [client for client, g in enumerate(groups) if g == group]
        # A distinct seed per group: the groups' copies are split differently.
        group_seed = seed * num_groups + group
        for client, share in zip(
            members, split_samples(labels, len(members), dirichlet_alpha, group_seed), strict=True
        ):
            indices[client] = share
    return indices


def sample_roles(
    num_samples: int, test_fraction: float, validation_fraction: float, seed: int
) -> np.ndarray:
    """One role (test, validation or train) per sample of the data set, seeded."""
    order = stream_rng(seed, STREAM_ROLES).permutation(num_samples)
    num_test = round(test_fraction * num_samples)
    num_val = round(validation_fraction * num_samples)
    roles = np.full(num_samples, ROLE_TRAIN, dtype=np.int64)
    roles[order[:num_test]] = ROLE_TEST
    roles[order[num_test : num_test + num_val]] = ROLE_VALIDATION
    return roles


def held_out_positions(
    client: int,
    indices: np.ndarray,
    roles: np.ndarray | None,
    test_fraction: float,
    validation_fraction: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions in ``indices`` of the client's test, validation and train samples.

    Without ``roles`` the client draws its own held-out shares
    (:func:`~fl_clusters.data.spec.held_out_sizes`); with them (one role per sample
    of the data set, see :func:`sample_roles`) a sample keeps its role, and
    :func:`missing_held_out` tells a client that lacks one.
    """
    order = stream_rng(seed, STREAM_TEST, client).permutation(len(indices))
    if roles is not None:
        by_role = [order[roles[indices[order]] == role] for role in range(3)]
        return by_role[ROLE_TEST], by_role[ROLE_VALIDATION], by_role[ROLE_TRAIN]
    num_test, num_val = held_out_sizes(len(indices), test_fraction, validation_fraction)
    held_out = num_test + num_val
    return order[:num_test], order[num_test:held_out], order[held_out:]


def missing_held_out(client: int, role: int, size: int, sized: bool) -> str:
    """Why client ``client`` of ``size`` samples cannot be planned: it lacks ``role``.

    ``sized``: the clients got ``samples_per_client`` samples, so more of them (not
    fewer clients) is the other fix.
    """
    fix = (
        "raise test_fraction (run-config key test-fraction)",
        "raise validation_fraction (run-config key validation-fraction), or set it to "
        "0 for no validation split (only ACFL reads one)",
        "lower test_fraction or validation_fraction (run-config keys test-fraction, "
        "validation-fraction)",
    )[role]
    more = (
        "raise samples_per_client (run-config key samples-per-client)"
        if sized
        else "run fewer clients (simulation: num-supernodes)"
    )
    name = ("test", "validation", "train")[role]
    return f"client {client} got no {name} sample out of its {size}. Fix: {fix}, or {more}"
