"""What a federated partition is asked for, and the checks of those settings.

:class:`PartitionSpec` holds the keyword arguments of
:func:`~fl_clusters.data.partition_dataset` and
:func:`~fl_clusters.data.load_client_data`; :func:`checked_spec` refuses any value
outside its allowed range before a sample is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fl_clusters.data.loaders import ImageDataset

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
# Structures with one group per client; only they take unequal group sizes.
HARD_STRUCTURES = ("rotation", "label-permutation")

# Smallest number of samples a client may get from the partitioner: enough for a
# train and a test split with a few samples each.
MIN_CLIENT_SAMPLES = 10


@dataclass(frozen=True)
class PartitionSpec:
    """How a data set is split over clients with a ground-truth group structure.

    Parameters
    ----------
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
        Dirichlet draws can leave a source with few clients, which no clustering
        can be judged on. ``label-permutation-mixture``: the same with label
        permutations as the sources.
    num_groups : int
        Ground-truth groups (sources for the mixtures), at least 1; for
        ``rotation`` and ``label-permutation`` at most the number of clients, so
        that every group has a client.
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
    samples_per_client : int
        0 splits the data set (each group's copy with ``copy_per_group``) over the
        clients. ``n > 0`` gives every client ``n`` samples, as IFCA's m x n split:
        the clients that share a copy (or the data set) take consecutive slices of
        ``n`` of its seeded shuffle, disjoint while they fit and wrapping around it
        beyond (then clients share samples, each client's ``n`` staying distinct;
        :attr:`~fl_clusters.data.plan.Plan.overlapping` says so and a warning is
        logged). A mixture's copies give a client its share of ``n`` from each
        source's copy, in the same way. At least the fewest samples that split
        into a test and a train sample (2; 3 with a validation split), at most
        the data set's size; IID only (``dirichlet_alpha`` 0). With
        ``copy_per_group`` the shuffles spread the test and validation samples
        evenly, so that every slice gets its share of each.
    natural_ids : bool
        One client per distinct value of the data set's per-sample ``ids`` (a user
        or writer column), as flwr-datasets' ``NaturalIdPartitioner``: client ``k``
        holds the samples of the ``k``-th id in sorted order. The data set must
        carry ids, their count must be the number of clients and each user needs
        enough samples for a test and a train split; not with ``dirichlet_alpha``,
        ``copy_per_group`` or ``samples_per_client``.
    seed : int
        Seed of every random draw, >= 0.
    """

    structure: str = "rotation"
    num_groups: int = 4
    dirichlet_alpha: float = 0.0
    test_fraction: float = 0.2
    validation_fraction: float = 0.0
    noisy_clients: int = 0
    mixture_alpha: float = 0.5
    rotation_step: float = 0.0
    copy_per_group: bool = False
    group_sizes: tuple[float, ...] | None = None
    samples_per_client: int = 0
    natural_ids: bool = False
    seed: int = 0

    @property
    def copies(self) -> bool:
        """Whether every group (or source) gets its own copy of the data set."""
        return bool(self.copy_per_group) and self.structure != "none" and self.num_groups > 1


def check_int(name: str, value: Any, minimum: int) -> None:
    """Refuse ``value`` unless it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid; allowed: an integer >= {minimum}")


def check_number(name: str, value: Any, low: float, high: float, allowed: str) -> float:
    """``value`` as a float in ``[low, high]``; ``allowed`` tells the user what is."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")
    value = float(value)
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name}={value!r} is invalid; allowed: {allowed}")
    return value


def checked_spec(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> PartitionSpec:
    """``spec`` with its numbers as floats, once every setting is allowed for ``dataset``.

    Raises
    ------
    ValueError
        For a setting outside its allowed values or a data set too small for
        ``num_clients``.
    """
    if not isinstance(dataset, ImageDataset):
        raise ValueError(f"dataset must be an ImageDataset, got {type(dataset).__name__}")
    check_int("num_clients", num_clients, minimum=1)
    _check_groups(dataset, num_clients, spec)
    spec = _checked_shares(num_clients, spec)
    _check_size(dataset, num_clients, spec)
    return spec


def _check_groups(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> None:
    if spec.structure not in CLUSTER_STRUCTURES:
        raise ValueError(
            f"structure={spec.structure!r} is unknown; allowed: {', '.join(CLUSTER_STRUCTURES)}"
        )
    check_int("num_groups", spec.num_groups, minimum=1)
    if spec.structure in HARD_STRUCTURES and spec.num_groups > num_clients:
        raise ValueError(
            f"num_groups={spec.num_groups} exceeds num_clients={num_clients}; with structure "
            f"{spec.structure!r} every group needs a client. Fix: run at least "
            f"{spec.num_groups} clients (simulation: --federation-config "
            f"\"num-supernodes={spec.num_groups}\"; deployment: deploy/start.sh -n "
            f"{spec.num_groups}), or fewer groups (run-config num-groups, which defaults to "
            f"num-clusters: e.g. --run-config \"num-clusters={num_clients}\", also to "
            f"deploy/start.sh)"
        )
    permutations = math.factorial(dataset.num_classes)
    if spec.structure in PERMUTATION_STRUCTURES and spec.num_groups > permutations:
        raise ValueError(
            f"num_groups={spec.num_groups} exceeds the {permutations} "
            f"distinct permutations of {dataset.num_classes} labels; use fewer groups"
        )


def _checked_shares(num_clients: int, spec: PartitionSpec) -> PartitionSpec:
    """The fractions, concentrations and rotation of ``spec``, checked and as floats."""
    dirichlet_alpha = check_number(
        "dirichlet_alpha", spec.dirichlet_alpha, 0.0, math.inf, "0 (IID) or a finite number > 0"
    )
    test_fraction = check_number(
        "test_fraction", spec.test_fraction, 0.0, 1.0, "a number strictly between 0 and 1"
    )
    if test_fraction in (0.0, 1.0):
        raise ValueError(
            f"test_fraction={test_fraction!r} is invalid; allowed: a number strictly "
            f"between 0 and 1"
        )
    validation_fraction = check_number(
        "validation_fraction", spec.validation_fraction, 0.0, 1.0, "a number in [0, 1)"
    )
    if test_fraction + validation_fraction >= 1.0:
        raise ValueError(
            f"test_fraction={test_fraction} + validation_fraction={validation_fraction} "
            f"leaves no training data; their sum must stay below 1"
        )
    check_int("noisy_clients", spec.noisy_clients, minimum=0)
    if spec.noisy_clients > num_clients:
        raise ValueError(
            f"noisy_clients={spec.noisy_clients} exceeds num_clients={num_clients}; allowed: "
            f"0 to {num_clients}"
        )
    mixture_alpha = check_number(
        "mixture_alpha", spec.mixture_alpha, 0.0, math.inf, "a finite number > 0"
    )
    if spec.structure in MIXTURE_STRUCTURES and mixture_alpha == 0.0:
        raise ValueError(
            f"mixture_alpha=0.0 is invalid for structure {spec.structure!r}; allowed: a "
            "finite number > 0 (small values give one dominant source per client)"
        )
    return replace(
        spec,
        dirichlet_alpha=dirichlet_alpha,
        test_fraction=test_fraction,
        validation_fraction=validation_fraction,
        mixture_alpha=mixture_alpha,
        rotation_step=_checked_rotation(spec.rotation_step, spec.num_groups),
    )


def _checked_rotation(rotation_step: Any, num_groups: int) -> float:
    rotation_step = check_number(
        "rotation_step", rotation_step, 0.0, math.nextafter(360.0, 0.0), "degrees in [0, 360)"
    )
    if rotation_step * (num_groups - 1) >= 360.0:
        raise ValueError(
            f"rotation_step={rotation_step} wraps {num_groups} groups past 360 degrees, so "
            f"two groups would share a rotation; use rotation_step < {360.0 / (num_groups - 1):g}"
            " or 0 to spread the groups evenly"
        )
    return rotation_step


def _check_size(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> None:
    """The seed, the copies, and enough samples for every client."""
    check_int("seed", spec.seed, minimum=0)
    if not isinstance(spec.copy_per_group, bool | np.bool_):
        raise ValueError(
            f"copy_per_group={spec.copy_per_group!r} is invalid; allowed: True or False"
        )
    if spec.copies and spec.structure in MIXTURE_STRUCTURES and spec.dirichlet_alpha > 0.0:
        raise ValueError(
            f"dirichlet_alpha={spec.dirichlet_alpha} cannot be combined with copy_per_group for "
            f"structure {spec.structure!r} (its sources' copies are split IID); use "
            f"dirichlet_alpha=0 or copy_per_group=False"
        )
    check_int("samples_per_client", spec.samples_per_client, minimum=0)
    if not isinstance(spec.natural_ids, bool | np.bool_):
        raise ValueError(f"natural_ids={spec.natural_ids!r} is invalid; allowed: True or False")
    if spec.natural_ids:
        _check_natural(dataset, num_clients, spec)
    elif spec.samples_per_client > 0:
        _check_samples_per_client(dataset, spec)
    else:
        _check_split_size(dataset, num_clients, spec)


def held_out_sizes(
    size: Any, test_fraction: float, validation_fraction: float
) -> tuple[Any, Any]:
    """Test and validation sample counts of a client of ``size`` samples (an int or array).

    At least one test sample and, with a validation split, one validation sample;
    the test split leaves at least one sample, the validation split one more.
    """
    num_test = np.minimum(np.maximum(np.round(test_fraction * size), 1), size - 1)
    num_val = np.minimum(np.round(validation_fraction * size), size - num_test - 1)
    if validation_fraction > 0:
        num_val = np.maximum(num_val, 1)
    return num_test.astype(np.int64), num_val.astype(np.int64)


def splits_fit(size: Any, test_fraction: float, validation_fraction: float) -> Any:
    """Whether a client of ``size`` samples (an int or array) gets a test and a train sample."""
    num_test, num_val = held_out_sizes(size, test_fraction, validation_fraction)
    return (num_test >= 1) & (size - num_test - num_val >= 1)


def smallest_client(test_fraction: float, validation_fraction: float) -> int:
    """The fewest samples a client splits into a test and a train sample (:func:`splits_fit`)."""
    size = 2
    while not splits_fit(size, test_fraction, validation_fraction):
        size += 1
    return size


def _check_split_size(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> None:
    """Enough samples for every client when the data set is split over the clients."""
    num_samples = len(dataset.y)
    # With copies each group splits the whole data set over its own clients only.
    copies_per_split = (
        spec.num_groups if spec.copies and spec.structure not in MIXTURE_STRUCTURES else 1
    )
    if num_samples * copies_per_split < MIN_CLIENT_SAMPLES * num_clients:
        raise ValueError(
            f"num_clients={num_clients} is too many for {dataset.name!r} with "
            f"{num_samples} samples: each client needs at least {MIN_CLIENT_SAMPLES}; use "
            f"num_clients <= {num_samples // MIN_CLIENT_SAMPLES * copies_per_split} or a "
            f"larger data set"
        )


def _check_samples_per_client(dataset: ImageDataset, spec: PartitionSpec) -> None:
    """``samples_per_client`` fits the data set and a client's held-out splits."""
    wanted = spec.samples_per_client
    if spec.dirichlet_alpha > 0.0:
        raise ValueError(
            f"samples_per_client={wanted} takes IID slices of the data set and cannot be "
            f"combined with dirichlet_alpha={spec.dirichlet_alpha}; set one of them to 0 "
            f"(run-config keys samples-per-client, dirichlet-alpha)"
        )
    if not splits_fit(wanted, spec.test_fraction, spec.validation_fraction):
        smallest = smallest_client(spec.test_fraction, spec.validation_fraction)
        held_out = "test, one validation" if spec.validation_fraction > 0 else "test"
        raise ValueError(
            f"samples_per_client={wanted} is too small: a client needs at least {smallest} "
            f"samples for one {held_out} and one train sample at test_fraction="
            f"{spec.test_fraction}, validation_fraction={spec.validation_fraction}; allowed: 0 "
            f"(split the data set over the clients) or at least {smallest} (run-config key "
            f"samples-per-client)"
        )
    if wanted > len(dataset.y):
        raise ValueError(
            f"samples_per_client={wanted} exceeds the {len(dataset.y)} samples of "
            f"{dataset.name!r} a client draws from; allowed: at most {len(dataset.y)}, or 0 "
            f"to split the data set over the clients (run-config key samples-per-client)"
        )


def _check_natural(dataset: ImageDataset, num_clients: int, spec: PartitionSpec) -> None:
    """Per-sample ids, one client per id, and enough samples for every user."""
    if dataset.ids is None or len(dataset.ids) != len(dataset.y):
        have = "none" if dataset.ids is None else f"{len(dataset.ids)} for {len(dataset.y)} samples"
        raise ValueError(
            f"natural_ids needs one id (user or writer) per sample; {dataset.name!r} has "
            f"{have}. Fix: set natural_ids=False, or load a "
            f"data set with an id column"
        )
    mixed = {"dirichlet_alpha": spec.dirichlet_alpha > 0.0, "copy_per_group": spec.copies,
             "samples_per_client": spec.samples_per_client > 0}
    if any(mixed.values()):
        clash = ", ".join(name for name, on in mixed.items() if on)
        raise ValueError(
            f"natural_ids gives each user's own samples to one client and cannot be "
            f"combined with {clash}; turn those off or set natural_ids=False"
        )
    users, sizes = np.unique(dataset.ids, return_counts=True)
    if len(users) != num_clients:
        raise ValueError(
            f"natural_ids gives one client per user: {dataset.name!r} has {len(users)} users "
            f"but num_clients={num_clients}. Fix: run {len(users)} clients (simulation: "
            f"num-supernodes or num-clients={len(users)}), or set natural_ids=False"
        )
    short = np.flatnonzero(~splits_fit(sizes, spec.test_fraction, spec.validation_fraction))
    if len(short):
        user = int(short[0])
        smallest = smallest_client(spec.test_fraction, spec.validation_fraction)
        raise ValueError(
            f"user {users[user].item()!r} (client {user}) of {dataset.name!r} has {sizes[user]} "
            f"sample(s); each needs at least {smallest} for its held-out and train splits. "
            f"Fix: drop the data set's users with fewer samples"
        )
