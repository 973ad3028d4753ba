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
