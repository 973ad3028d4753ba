"""Split a data set over clients that fall into ground-truth groups.

Two independent choices define a federation:

* how samples go to clients: IID (``dirichlet_alpha == 0``) or label skew drawn from
  Dirichlet(``dirichlet_alpha``), both with flwr-datasets' partitioners;
* how groups differ (``structure``): client ``i`` belongs to group
  ``i % num_groups`` and the group decides a transform of its images or labels.

Each client's held-out test split is drawn from its own samples by index, before any
transform, so it is disjoint from its train split and follows the same distribution.

By default the groups share one copy of the data set, each client getting a disjoint
part of it. With ``copy_per_group`` every group (or mixture source) gets its own
transformed copy of the whole data set, as in IFCA's rotated MNIST (k x the samples):
then which samples are held out is decided once per sample of the data set, so that no
image is trained on in one group and tested on in another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from fl_clusters.data.loaders import ImageDataset, load_dataset

CLUSTER_STRUCTURES = (
    "rotation",
    "label-permutation",
    "none",
    "rotation-mixture",
    "label-permutation-mixture",
)
# Structures whose clients mix several sources sample by sample (FedSoft, FedEM).
MIXTURE_STRUCTURES = ("rotation-mixture", "label-permutation-mixture")
# Structures whose groups (or sources) relabel the samples.
PERMUTATION_STRUCTURES = ("label-permutation", "label-permutation-mixture")

# Smallest number of samples a client may get from the partitioner: enough for a
# train and a test split with a few samples each.
MIN_CLIENT_SAMPLES = 10

# Distinct streams of randomness, mixed with the seed (and client id) so that each
# draw is reproducible on its own, whatever else is drawn before it.
(
    _STREAM_SHUFFLE,
    _STREAM_TEST,
    _STREAM_MIXTURE,
    _STREAM_PERMUTATION,
    _STREAM_NOISE,
    _STREAM_ROLES,
    _STREAM_COPY,
) = range(7)

# A sample's role when held-out splits are decided once for the whole data set.
_ROLE_TEST, _ROLE_VALIDATION, _ROLE_TRAIN = range(3)


@dataclass(frozen=True)
class ClientData:
    """One client's local data.

    Parameters
    ----------
    x_train, y_train : np.ndarray
        float32 images ``(n, C, H, W)`` and int64 labels ``(n,)`` to train on.
    x_test, y_test : np.ndarray
        Held-out images and labels from the same distribution, disjoint from train.
    x_val, y_val : np.ndarray
        Held-out validation images and labels (same distribution), disjoint from
        train and test; empty when ``validation_fraction`` is 0. For decisions
        that must not read the test split (ACFL's incentive test).
    test_sources : np.ndarray
        int64 ``(n_test,)``: the source (group transform) of every test sample;
        for metrics only (FedSoft's per-source cluster accuracy).
    true_cluster : int
        Ground-truth group, for metrics only; for ``rotation-mixture`` the source
        with the largest share of the train split.
    mixture : np.ndarray
        float64 ``(num_groups,)``: share of each source in the train split (one-hot
        for the hard structures; for ``none`` one-hot at group 0).
    noisy : bool
        Whether the labels were replaced by uniformly random ones.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    test_sources: np.ndarray
    true_cluster: int
    mixture: np.ndarray
    noisy: bool


@dataclass(frozen=True)
class _ClientPlan:
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
class _Plan:
    structure: str
    num_groups: int
    rotation_step: float
    seed: int
    permutations: tuple[np.ndarray, ...]
    clients: tuple[_ClientPlan, ...]


def partition_dataset(
    dataset: ImageDataset,
    num_clients: int,
    *,
    structure: str = "rotation",
    num_groups: int = 4,
    dirichlet_alpha: float = 0.0,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    noisy_clients: int = 0,
    mixture_alpha: float = 0.5,
    rotation_step: float = 0.0,
    copy_per_group: bool = False,
    group_sizes: tuple[float, ...] | None = None,
    seed: int = 0,
) -> list[ClientData]:
    """Split ``dataset`` over ``num_clients`` clients with a ground-truth group structure.

    Parameters
    ----------
    dataset : ImageDataset
        The whole data set, e.g. from :func:`~fl_clusters.data.load_dataset`.
    num_clients : int
        Number of clients, at least 1 and at most ``len(dataset.y) // 10`` (times
        ``num_groups`` with ``copy_per_group`` in a hard structure).
    structure : str
        One of :data:`CLUSTER_STRUCTURES`. ``rotation``: group ``g``'s images are
        rotated counter-clockwise by ``360 * g / num_groups`` degrees (or ``g *
        rotation_step``).
        ``label-permutation``: group ``g`` relabels ``y`` as ``perm_g[y]`` with a
        seeded permutation, group 0 keeping the identity. ``none``: no transform, all
        clients in group 0. ``rotation-mixture`` (FedSoft): ``num_groups`` rotation
        sources; each client draws source proportions from
        Dirichlet(``mixture_alpha``) and each of its samples a source from them.
        The largest proportion goes to source ``client % num_groups`` (the others
        in random order), so every source dominates the same number of clients, as
        every group has the same number of clients in the hard structures: free
        Dirichlet draws can leave a source with few clients (16 against 4 for 20
        clients at seed 2), which no clustering can be judged on.
    num_groups : int
        Ground-truth groups (sources for ``rotation-mixture``), at least 1; for
        ``rotation`` and ``label-permutation`` at most ``num_clients`` so that every
        group has a client.
    dirichlet_alpha : float
        0 for an IID split of the samples, otherwise the concentration of the
        Dirichlet label skew (smaller is more skewed).
    test_fraction : float
        Share of each client's samples held out as its test split, in ``(0, 1)``.
    validation_fraction : float
        Share of each client's samples held out as its validation split, in
        ``[0, 1)``; ``test_fraction + validation_fraction`` must stay below 1.
    noisy_clients : int
        The last ``noisy_clients`` clients get uniformly random train and test labels.
    mixture_alpha : float
        Concentration of the per-client source proportions for the mixture
        structures, > 0 (smaller is closer to one source per client).
    rotation_step : float
        Degrees between consecutive rotation groups (or sources): group ``g`` is
        rotated by ``g * rotation_step``. 0 spreads the groups evenly, ``360 * g /
        num_groups``. Two sources at 0 and 180 degrees share every digit that is
        symmetric under a half turn (0, 1, 8); a step of 90 keeps them apart.
        In ``[0, 360)``, and the groups must not wrap around: ``rotation_step *
        (num_groups - 1) < 360``.
    copy_per_group : bool
        False: the groups share one copy of the data set, so a client holds about
        ``len(dataset.y) / num_clients`` samples. True: every group (every source of
        a mixture) gets its own transformed copy of the whole data set,
        split over its clients, as in IFCA's rotated MNIST; a client then holds
        about ``num_groups`` times more. A mixture source's copy is divided among
        all clients in proportion to their share of that source (IID in the labels:
        ``dirichlet_alpha`` must be 0 there). The test and validation samples are
        chosen once per sample of the data set, so a held-out image is held out in
        every group. No effect for ``none`` or a single group.
    group_sizes : tuple[float, ...] | None
        Unequal groups for ``rotation`` and ``label-permutation``: one positive
        share per group (``num_groups`` of them, normalized to sum 1). Group ``g``
        then holds ``round(share_g * num_clients)`` consecutive client ids (largest
        remainders, at least one client each) instead of the clients ``i`` with
        ``i % num_groups == g``. ``None`` keeps equal groups.
    seed : int
        Seed of every random draw, >= 0.

    Returns
    -------
    list[ClientData]
        One entry per client, in client-id order. Same arguments give identical
        arrays.

    Raises
    ------
    ValueError
        For an argument outside its allowed values or a data set too small for
        ``num_clients``.
    """
    plan = _plan(
        dataset,
        num_clients,
        structure=structure,
        num_groups=num_groups,
        dirichlet_alpha=dirichlet_alpha,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        noisy_clients=noisy_clients,
        mixture_alpha=mixture_alpha,
        rotation_step=rotation_step,
        copy_per_group=copy_per_group,
        group_sizes=group_sizes,
        seed=seed,
    )
    return [_materialize(dataset, plan, client) for client in range(num_clients)]


def load_client_data(
    dataset_name: str,
    data_root: str | None,
    partition_id: int,
    num_partitions: int,
    *,
    download: bool = False,
    **partition_kwargs: Any,
) -> ClientData:
    """One client's part of a partition, with data and split computed once per process.

    Parameters
    ----------
    dataset_name : str
        Passed to :func:`~fl_clusters.data.load_dataset`.
    data_root : str | None
        Passed to :func:`~fl_clusters.data.load_dataset`.
    partition_id : int
        This client's id, in ``[0, num_partitions)``.
    num_partitions : int
        Number of clients of the federation.
    download : bool
        Passed to :func:`~fl_clusters.data.load_dataset`.
    **partition_kwargs : Any
        Keyword arguments of :func:`partition_dataset` (``structure``, ``seed``...).

    Returns
    -------
    ClientData
        Equal to ``partition_dataset(...)[partition_id]``.

    Raises
    ------
    ValueError
        For a ``partition_id`` outside ``[0, num_partitions)`` or any error of
        :func:`partition_dataset` or :func:`~fl_clusters.data.load_dataset`.
    """
    _check_int("num_partitions", num_partitions, minimum=1)
    _check_int("partition_id", partition_id, minimum=0)
    if partition_id >= num_partitions:
        raise ValueError(
            f"partition_id={partition_id} is outside [0, {num_partitions - 1}] for "
            f"num_partitions={num_partitions}"
        )
    dataset = load_dataset(dataset_name, data_root, download=download)
    # Only the index plan of the whole federation is cached: a process that hosts a
    # few clients then holds their pixels, not a transformed copy of the data set.
    plan = _cached_plan(
        dataset_name,
        data_root or None,
        download,
        num_partitions,
        tuple(sorted(partition_kwargs.items())),
    )
    return _materialize(dataset, plan, partition_id)


@lru_cache(maxsize=4)
def _cached_plan(
    dataset_name: str,
    data_root: str | None,
    download: bool,
    num_clients: int,
    partition_kwargs: tuple[tuple[str, Any], ...],
) -> _Plan:
    dataset = load_dataset(dataset_name, data_root, download=download)
    return _plan(dataset, num_clients, **dict(partition_kwargs))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")


def _check_number(name: str, value: Any, low: float, high: float, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")
    value = float(value)
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return value


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def _plan(
    dataset: ImageDataset,
    num_clients: int,
    *,
    structure: str = "rotation",
    num_groups: int = 4,
    dirichlet_alpha: float = 0.0,
    test_fraction: float = 0.2,
    validation_fraction: float = 0.0,
    noisy_clients: int = 0,
    mixture_alpha: float = 0.5,
    rotation_step: float = 0.0,
    copy_per_group: bool = False,
    group_sizes: tuple[float, ...] | None = None,
    seed: int = 0,
) -> _Plan:
    """Validate the arguments and decide every client's indices, group and sources."""
    if not isinstance(dataset, ImageDataset):
        raise ValueError(f"dataset must be an ImageDataset, got {type(dataset).__name__}")
    _check_int("num_clients", num_clients, minimum=1)
    if structure not in CLUSTER_STRUCTURES:
        raise ValueError(
            f"structure={structure!r} is unknown; allowed: {', '.join(CLUSTER_STRUCTURES)}"
        )
    _check_int("num_groups", num_groups, minimum=1)
    if structure in ("rotation", "label-permutation") and num_groups > num_clients:
        raise ValueError(
            f"num_groups={num_groups} exceeds num_clients={num_clients}; with structure "
            f"{structure!r} every group needs a client: use num_groups <= num_clients"
        )
    if structure in PERMUTATION_STRUCTURES and num_groups > math.factorial(dataset.num_classes):
        raise ValueError(
            f"num_groups={num_groups} exceeds the {math.factorial(dataset.num_classes)} "
            f"distinct permutations of {dataset.num_classes} labels; use fewer groups"
        )
    dirichlet_alpha = _check_number(
        "dirichlet_alpha", dirichlet_alpha, 0.0, math.inf, "0 (IID) or a finite number > 0"
    )
    test_fraction = _check_number(
        "test_fraction", test_fraction, 0.0, 1.0, "a number strictly between 0 and 1"
    )
    if test_fraction in (0.0, 1.0):
        raise ValueError(
            f"test_fraction={test_fraction!r} is invalid; allowed: a number strictly "
            f"between 0 and 1"
        )
    validation_fraction = _check_number(
        "validation_fraction", validation_fraction, 0.0, 1.0, "a number in [0, 1)"
    )
    if test_fraction + validation_fraction >= 1.0:
        raise ValueError(
            f"test_fraction={test_fraction} + validation_fraction={validation_fraction} "
            f"leaves no training data; their sum must stay below 1"
        )
    _check_int("noisy_clients", noisy_clients, minimum=0)
    if noisy_clients > num_clients:
        raise ValueError(
            f"noisy_clients={noisy_clients} exceeds num_clients={num_clients}; allowed: "
            f"0 to {num_clients}"
        )
    mixture_alpha = _check_number(
        "mixture_alpha", mixture_alpha, 0.0, math.inf, "a finite number > 0"
    )
    if structure in MIXTURE_STRUCTURES and mixture_alpha == 0.0:
        raise ValueError(
            f"mixture_alpha=0.0 is invalid for structure {structure!r}; allowed: a "
            "finite number > 0 (small values give one dominant source per client)"
        )
    rotation_step = _check_number(
        "rotation_step", rotation_step, 0.0, math.nextafter(360.0, 0.0), "degrees in [0, 360)"
    )
    if rotation_step * (num_groups - 1) >= 360.0:
        raise ValueError(
            f"rotation_step={rotation_step} wraps {num_groups} groups past 360 degrees, so "
            f"two groups would share a rotation; use rotation_step < {360.0 / (num_groups - 1):g}"
            " or 0 to spread the groups evenly"
        )
    _check_int("seed", seed, minimum=0)
    if not isinstance(copy_per_group, bool | np.bool_):
        raise ValueError(f"copy_per_group={copy_per_group!r} is invalid; allowed: True or False")
    copies = bool(copy_per_group) and structure != "none" and num_groups > 1
    if copies and structure in MIXTURE_STRUCTURES and dirichlet_alpha > 0.0:
        raise ValueError(
            f"dirichlet_alpha={dirichlet_alpha} cannot be combined with copy_per_group for "
            f"structure {structure!r} (its sources' copies are split IID); use "
            f"dirichlet_alpha=0 or copy_per_group=False"
        )
    num_samples = len(dataset.y)
    # With copies each group splits the whole data set over its own clients only.
    copies_per_split = num_groups if copies and structure not in MIXTURE_STRUCTURES else 1
    if num_samples * copies_per_split < MIN_CLIENT_SAMPLES * num_clients:
        raise ValueError(
            f"num_clients={num_clients} is too many for {dataset.name!r} with "
            f"{num_samples} samples: each client needs at least {MIN_CLIENT_SAMPLES}; use "
            f"num_clients <= {num_samples // MIN_CLIENT_SAMPLES * copies_per_split} or a "
            f"larger data set"
        )

    permutations = _label_permutations(structure, num_groups, dataset.num_classes, seed)
    groups = _client_groups(structure, num_clients, num_groups, group_sizes)
    roles = None
    if copies:
        roles = _sample_roles(num_samples, test_fraction, validation_fraction, seed)
        if structure in MIXTURE_STRUCTURES:
            proportions = np.stack([
                _client_proportions(seed, client, num_groups, mixture_alpha)[0]
                for client in range(num_clients)
            ])
            client_indices, client_sources = _split_source_copies(num_samples, proportions, seed)
        else:
            client_indices = _split_group_copies(
                dataset.y, groups, num_groups, dirichlet_alpha, seed
            )
            client_sources = [np.full(len(idx), groups[c]) for c, idx in enumerate(client_indices)]
    else:
        client_indices = _split_samples(dataset.y, num_clients, dirichlet_alpha, seed)
        client_sources = []
        for client, indices in enumerate(client_indices):
            if structure in MIXTURE_STRUCTURES:
                share, rng = _client_proportions(seed, client, num_groups, mixture_alpha)
                client_sources.append(rng.choice(num_groups, size=len(indices), p=share))
            else:
                client_sources.append(np.full(len(indices), groups[client]))
    clients = []
    for client, (indices, sources) in enumerate(zip(client_indices, client_sources, strict=True)):
        test_pos, val_pos, train_pos = _held_out_positions(
            client, indices, roles, test_fraction, validation_fraction, seed
        )
        clients.append(
            _ClientPlan(
                train_idx=indices[train_pos],
                test_idx=indices[test_pos],
                val_idx=indices[val_pos],
                group=groups[client],
                train_sources=sources[train_pos],
                test_sources=sources[test_pos],
                val_sources=sources[val_pos],
                noisy=client >= num_clients - noisy_clients,
            )
        )
    return _Plan(structure, num_groups, rotation_step, seed, permutations, tuple(clients))


def _client_groups(
    structure: str, num_clients: int, num_groups: int, group_sizes: tuple[float, ...] | None
) -> list[int]:
    """Every client's group: ``i % num_groups``, or consecutive blocks sized by shares."""
    if group_sizes is None:
        return [0 if structure == "none" else c % num_groups for c in range(num_clients)]
    if structure not in ("rotation", "label-permutation"):
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
    return np.repeat(np.arange(num_groups), counts).tolist()


def _client_proportions(
    seed: int, client: int, num_sources: int, mixture_alpha: float
) -> tuple[np.ndarray, np.random.Generator]:
    """A client's Dirichlet source proportions, its own source dominant, and its stream."""
    rng = _rng(seed, _STREAM_MIXTURE, client)
    draw = rng.dirichlet(np.full(num_sources, mixture_alpha))
    return _balanced_proportions(draw, client % num_sources, rng), rng


def _held_out_positions(
    client: int,
    indices: np.ndarray,
    roles: np.ndarray | None,
    test_fraction: float,
    validation_fraction: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions in ``indices`` of the client's test, validation and train samples.

    Without ``roles`` the client draws its own held-out shares; with them (one role
    per sample of the data set, see :func:`_sample_roles`) a sample keeps its role.
    """
    order = _rng(seed, _STREAM_TEST, client).permutation(len(indices))
    if roles is not None:
        by_role = [order[roles[indices[order]] == role] for role in range(3)]
        needed = (True, validation_fraction > 0, True)
        for role, name in enumerate(("test", "validation", "train")):
            if needed[role] and len(by_role[role]) == 0:
                raise ValueError(
                    f"client {client} got no {name} sample out of its {len(indices)}; use "
                    f"fewer clients or a larger test_fraction/validation_fraction"
                )
        return by_role[_ROLE_TEST], by_role[_ROLE_VALIDATION], by_role[_ROLE_TRAIN]
    # At least one test and one train sample, whatever the rounding.
    num_test = min(max(round(test_fraction * len(indices)), 1), len(indices) - 1)
    num_val = min(round(validation_fraction * len(indices)), len(indices) - num_test - 1)
    if validation_fraction > 0:
        num_val = max(num_val, 1)
    held_out = num_test + num_val
    return order[:num_test], order[num_test:held_out], order[held_out:]


def _sample_roles(
    num_samples: int, test_fraction: float, validation_fraction: float, seed: int
) -> np.ndarray:
    """One role (test, validation or train) per sample of the data set, seeded."""
    order = _rng(seed, _STREAM_ROLES).permutation(num_samples)
    num_test = round(test_fraction * num_samples)
    num_val = round(validation_fraction * num_samples)
    roles = np.full(num_samples, _ROLE_TRAIN, dtype=np.int64)
    roles[order[:num_test]] = _ROLE_TEST
    roles[order[num_test : num_test + num_val]] = _ROLE_VALIDATION
    return roles


def _split_group_copies(
    labels: np.ndarray, groups: list[int], num_groups: int, dirichlet_alpha: float, seed: int
) -> list[np.ndarray]:
    """Each group's copy of the whole data set, split over that group's clients."""
    indices: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(groups)
    for group in range(num_groups):
        members = [client for client, g in enumerate(groups) if g == group]
        # A distinct seed per group: the groups' copies are split differently.
        group_seed = seed * num_groups + group
        for client, share in zip(
            members, _split_samples(labels, len(members), dirichlet_alpha, group_seed), strict=True
        ):
            indices[client] = share
    return indices


def _split_source_copies(
    num_samples: int, proportions: np.ndarray, seed: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Divide every source's copy of the data set among clients by their share of it.

    Client ``k`` gets ``proportions[k, s] / proportions[:, s].sum()`` of source ``s``'s
    shuffled copy, so its sample count is about ``num_groups * num_samples /
    num_clients`` and its mixture follows its proportions.
    """
    num_clients, num_sources = proportions.shape
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for source in range(num_sources):
        order = _rng(seed, _STREAM_COPY, source).permutation(num_samples)
        shares = proportions[:, source] / proportions[:, source].sum()
        bounds = np.round(np.concatenate([[0.0], np.cumsum(shares)]) * num_samples).astype(int)
        for client in range(num_clients):
            pieces[client].append(order[bounds[client] : bounds[client + 1]])
    indices = [np.concatenate(p) for p in pieces]
    sources = [
        np.concatenate([np.full(len(part), s) for s, part in enumerate(p)]) for p in pieces
    ]
    return indices, sources


def _split_samples(
    labels: np.ndarray, num_clients: int, dirichlet_alpha: float, seed: int
) -> list[np.ndarray]:
    """Sample indices of each client, IID or Dirichlet label skew (flwr-datasets)."""
    import datasets as hf_datasets
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, Partitioner

    partitioner: Partitioner
    if dirichlet_alpha == 0.0:
        # IidPartitioner cuts contiguous shards, so shuffle the rows first.
        order = _rng(seed, _STREAM_SHUFFLE).permutation(len(labels))
        partitioner = IidPartitioner(num_partitions=num_clients)
    else:
        order = np.arange(len(labels))
        partitioner = DirichletPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            alpha=dirichlet_alpha,
            min_partition_size=MIN_CLIENT_SAMPLES,
            self_balancing=False,
            seed=seed,
        )
    partitioner.dataset = hf_datasets.Dataset.from_dict(
        {"label": labels[order], "idx": order}
    )
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


def _label_permutations(
    structure: str, num_groups: int, num_classes: int, seed: int
) -> tuple[np.ndarray, ...]:
    """Group g's relabeling ``perm_g`` (identity for group 0), pairwise distinct."""
    if structure not in PERMUTATION_STRUCTURES:
        return ()
    rng = _rng(seed, _STREAM_PERMUTATION)
    permutations = [np.arange(num_classes)]
    while len(permutations) < num_groups:
        candidate = rng.permutation(num_classes)
        # Two groups with the same labelling would be one cluster in disguise.
        if not any(np.array_equal(candidate, seen) for seen in permutations):
            permutations.append(candidate)
    return tuple(permutations)


def _balanced_proportions(
    proportions: np.ndarray, dominant: int, rng: np.random.Generator
) -> np.ndarray:
    """Reorder Dirichlet proportions: the largest to ``dominant``, the rest shuffled."""
    ranked = np.sort(proportions)[::-1]
    others = [s for s in range(len(proportions)) if s != dominant]
    order = np.array([dominant, *rng.permutation(others)], dtype=np.int64)
    balanced = np.empty_like(proportions)
    balanced[order] = ranked
    return balanced


def _rotate(images: np.ndarray, source: int, plan: _Plan) -> np.ndarray:
    """Rotate images counter-clockwise by the source's angle (see ``rotation_step``)."""
    angle = source * (plan.rotation_step or 360.0 / plan.num_groups)
    if angle % 90.0 == 0.0:
        # Multiples of 90 degrees: exact and lossless.
        return np.rot90(images, k=int(angle // 90.0), axes=(-2, -1))
    import torch
    from torchvision.transforms.functional import InterpolationMode, rotate

    rotated = rotate(torch.from_numpy(images), angle, interpolation=InterpolationMode.BILINEAR)
    return rotated.numpy()


def _apply(
    dataset: ImageDataset,
    plan: _Plan,
    client: _ClientPlan,
    indices: np.ndarray,
    sources: np.ndarray,
    noise_stream: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of ``indices`` after the client's group transform and noise."""
    x = dataset.x[indices]
    y = dataset.y[indices]
    if plan.structure in ("rotation", "rotation-mixture"):
        for source in np.unique(sources):
            mask = sources == source
            x[mask] = _rotate(x[mask], int(source), plan)
    elif plan.structure == "label-permutation":
        y = plan.permutations[client.group][y]
    elif plan.structure == "label-permutation-mixture":
        # Every sample is relabelled by its own source's permutation.
        y = np.stack(plan.permutations)[sources, y]
    if client.noisy:
        y = _rng(plan.seed, _STREAM_NOISE, noise_stream).integers(
            dataset.num_classes, size=len(y), dtype=np.int64
        )
    return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)


def _materialize(dataset: ImageDataset, plan: _Plan, client_id: int) -> ClientData:
    client = plan.clients[client_id]
    # Train, test and validation labels of a noisy client come from separate noise streams.
    x_train, y_train = _apply(
        dataset, plan, client, client.train_idx, client.train_sources, 2 * client_id
    )
    x_test, y_test = _apply(
        dataset, plan, client, client.test_idx, client.test_sources, 2 * client_id + 1
    )
    val_stream = 2 * (len(plan.clients) + client_id)
    x_val, y_val = _apply(dataset, plan, client, client.val_idx, client.val_sources, val_stream)
    mixture = np.bincount(client.train_sources, minlength=plan.num_groups).astype(np.float64)
    mixture /= mixture.sum()
    return ClientData(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        x_val=x_val,
        y_val=y_val,
        test_sources=client.test_sources.astype(np.int64),
        true_cluster=int(np.argmax(mixture)),
        mixture=mixture,
        noisy=client.noisy,
    )
