"""One client's data: its images and labels, built from the federation's plan.

Only here do pixels get copied and transformed (rotated, relabelled, made noisy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl_clusters.data.loaders import ImageDataset
from fl_clusters.data.plan import ClientPlan, Plan
from fl_clusters.data.sampling import STREAM_NOISE, stream_rng


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


def rotated_images(images: np.ndarray, source: int, plan: Plan) -> np.ndarray:
    """Rotate images counter-clockwise by the source's angle (see ``rotation_step``)."""
    angle = source * (plan.rotation_step or 360.0 / plan.num_groups)
    if angle % 90.0 == 0.0:
        # Multiples of 90 degrees: exact and lossless.
        return np.rot90(images, k=int(angle // 90.0), axes=(-2, -1))
    import torch
    from torchvision.transforms.functional import InterpolationMode, rotate

    rotated = rotate(torch.from_numpy(images), angle, interpolation=InterpolationMode.BILINEAR)
    return rotated.numpy()


def transformed(
    dataset: ImageDataset,
    plan: Plan,
    client: ClientPlan,
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
            x[mask] = rotated_images(x[mask], int(source), plan)
    elif plan.structure == "label-permutation":
        y = plan.permutations[client.group][y]
    elif plan.structure == "label-permutation-mixture":
        # Every sample is relabelled by its own source's permutation.
        y = np.stack(plan.permutations)[sources, y]
    if client.noisy:
        y = stream_rng(plan.seed, STREAM_NOISE, noise_stream).integers(
            dataset.num_classes, size=len(y), dtype=np.int64
        )
    return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)


def train_mixture(plan: Plan, client_id: int) -> np.ndarray:
    """The share of each source in client ``client_id``'s train split, from the plan alone."""
    return _mixture(plan.client(client_id), plan.num_groups)


def _mixture(client: ClientPlan, num_groups: int) -> np.ndarray:
    counts = np.bincount(client.train_sources, minlength=num_groups)
    return counts.astype(np.float64) / counts.sum()


def materialize(dataset: ImageDataset, plan: Plan, client_id: int) -> ClientData:
    """Client ``client_id``'s images and labels, as its plan says."""
    client = plan.client(client_id)
    # Train, test and validation labels of a noisy client come from separate noise streams.
    x_train, y_train = transformed(
        dataset, plan, client, client.train_idx, client.train_sources, 2 * client_id
    )
    x_test, y_test = transformed(
        dataset, plan, client, client.test_idx, client.test_sources, 2 * client_id + 1
    )
    val_stream = 2 * (plan.num_clients + client_id)
    x_val, y_val = transformed(
        dataset, plan, client, client.val_idx, client.val_sources, val_stream
    )
    mixture = _mixture(client, plan.num_groups)
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
