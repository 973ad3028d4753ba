"""Data loaders and federated partitions (fl_clusters.data), offline and fast."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fl_clusters.data import (
    EMNIST_SPLIT,
    FASHION_MNIST_ROOT,
    MIN_CLIENT_SAMPLES,
    ClientData,
    ImageDataset,
    load_client_data,
    load_dataset,
    partition_dataset,
    read_idx,
)
from fl_clusters.data.sampling import STREAM_SHUFFLE, split_samples, stream_rng


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to reach the network, so 'offline' is checked, not hoped."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"test tried to open a network connection to {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def digits() -> ImageDataset:
    return load_dataset("digits")


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file (MNIST's format)."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def indexed_dataset(num_samples: int = 600, num_classes: int = 10) -> ImageDataset:
    """Test fixture, not a real data set: 4x4 images black but for their top-left pixel.

    That pixel encodes the sample's index, and where it ends up tells which multiple of
    90 degrees the image was rotated by, so partitions can be traced back exactly.
    """
    x = np.zeros((num_samples, 1, 4, 4), dtype=np.float32)
    x[:, 0, 0, 0] = (np.arange(num_samples) + 1) / (num_samples + 1)
    y = np.arange(num_samples, dtype=np.int64) % num_classes
    return ImageDataset(name="indexed", x=x, y=y, num_classes=num_classes)


def trace(images: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Recover (index, quarter turns) of images from :func:`indexed_dataset`."""
    flat = images.reshape(len(images), -1)
    position = flat.argmax(axis=1)
    index = np.rint(flat.max(axis=1) * (num_samples + 1)).astype(int) - 1
    marker = np.zeros((4, 4))
    marker[0, 0] = 1
    position_to_turns = {int(np.rot90(marker, k).argmax()): k for k in range(4)}
    return index, np.array([position_to_turns[int(p)] for p in position])


# --- loaders -----------------------------------------------------------------------


def test_digits_is_bundled_and_scaled(digits: ImageDataset) -> None:
    assert digits.x.shape == (1797, 1, 8, 8)
    assert digits.x.dtype == np.float32 and digits.y.dtype == np.int64
    assert digits.x.min() == 0.0 and digits.x.max() == 1.0
    assert set(np.unique(digits.y)) == set(range(10)) and digits.num_classes == 10
    # One shared instance per process, so it must not be mutable by accident.
    assert load_dataset("digits") is digits
    with pytest.raises(ValueError):
        digits.x[0, 0, 0, 0] = 0.5


def test_unknown_dataset_name_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"'imagenet'.*digits, fashion-mnist"):
        load_dataset("imagenet")


@pytest.mark.skipif(
    not Path(FASHION_MNIST_ROOT).is_dir(),
    reason=f"{FASHION_MNIST_ROOT} absent: apt-get install -y dataset-fashion-mnist",
)
def test_fashion_mnist_from_debian_package() -> None:
    dataset = load_dataset("fashion-mnist")
    assert dataset.x.shape == (70000, 1, 28, 28) and dataset.num_classes == 10
    assert dataset.x.dtype == np.float32 and 0.0 <= dataset.x.min() < dataset.x.max() <= 1.0
    # Fashion-MNIST is balanced: 6000 train + 1000 test images per class.
    assert np.bincount(dataset.y).tolist() == [7000] * 10


def test_fashion_mnist_reads_uncompressed_idx(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    train, test = rng.integers(0, 256, (5, 28, 28)), rng.integers(0, 256, (3, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte", train)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(5))
    write_idx(tmp_path / "t10k-images-idx3-ubyte", test)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([9, 8, 7]))
    dataset = load_dataset("fashion-mnist", str(tmp_path))
    np.testing.assert_array_equal(dataset.x[:, 0] * 255, np.concatenate([train, test]))
    assert dataset.y.tolist() == [0, 1, 2, 3, 4, 9, 8, 7]


def test_fashion_mnist_missing_files_say_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"apt-get install -y dataset-fashion-mnist"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_read_idx_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "bogus"
    path.write_bytes(b"not an idx file")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(path)


def test_mnist_from_local_idx_files(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    train, test = rng.integers(0, 256, (6, 28, 28)), rng.integers(0, 256, (4, 28, 28))
    write_idx(raw / "train-images-idx3-ubyte", train)
    write_idx(raw / "train-labels-idx1-ubyte", np.array([0, 1, 2, 3, 4, 5]))
    write_idx(raw / "t10k-images-idx3-ubyte", test)
    write_idx(raw / "t10k-labels-idx1-ubyte", np.array([6, 7, 8, 9]))
    dataset = load_dataset("mnist", str(tmp_path))
    assert dataset.x.shape == (10, 1, 28, 28) and dataset.num_classes == 10
    np.testing.assert_allclose(dataset.x[:, 0], np.concatenate([train, test]) / 255, atol=1e-7)
    assert dataset.y.tolist() == list(range(10))


def test_mnist_without_files_or_download_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"download=True"):
        load_dataset("mnist", str(tmp_path))


def test_emnist_from_local_idx_files_is_upright(tmp_path: Path) -> None:
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    upright = np.random.default_rng(2).integers(0, 256, (3, 28, 28))
    prefix = f"emnist-{EMNIST_SPLIT}"
    # The EMNIST files store every image transposed.
    write_idx(raw / f"{prefix}-train-images-idx3-ubyte", upright[:2].transpose(0, 2, 1))
    write_idx(raw / f"{prefix}-train-labels-idx1-ubyte", np.array([0, 46]))
    write_idx(raw / f"{prefix}-test-images-idx3-ubyte", upright[2:].transpose(0, 2, 1))
    write_idx(raw / f"{prefix}-test-labels-idx1-ubyte", np.array([10]))
    dataset = load_dataset("emnist", str(tmp_path))
    assert dataset.num_classes == 47 and dataset.y.tolist() == [0, 46, 10]
    np.testing.assert_allclose(dataset.x[:, 0], upright / 255, atol=1e-7)


def test_cifar10_from_local_parquet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets as hf_datasets
    from PIL import Image

    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    labels = [3, 1, 4, 1, 5]
    features = hf_datasets.Features(
        {"img": hf_datasets.Image(), "label": hf_datasets.ClassLabel(num_classes=10)}
    )
    folder = tmp_path / "cifar10"
    folder.mkdir()
    for split, rows in (("train", slice(0, 3)), ("test", slice(3, 5))):
        hf_datasets.Dataset.from_dict(
            {"img": [Image.fromarray(p) for p in pixels[rows]], "label": labels[rows]},
            features=features,
        ).to_parquet(str(folder / f"{split}-00000-of-00001.parquet"))
    dataset = load_dataset("cifar10", str(folder))
    assert dataset.x.shape == (5, 3, 32, 32) and dataset.num_classes == 10
    np.testing.assert_allclose(dataset.x, pixels.transpose(0, 3, 1, 2) / 255, atol=1e-7)
    assert dataset.y.tolist() == labels


def test_cifar10_hub_needs_download_flag() -> None:
    with pytest.raises(FileNotFoundError, match=r"download=True"):
        load_dataset("cifar10")


# --- partitions --------------------------------------------------------------------


def assert_same(a: ClientData, b: ClientData) -> None:
    for field in ("x_train", "y_train", "x_test", "y_test", "mixture"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.true_cluster, a.noisy) == (b.true_cluster, b.noisy)


@pytest.mark.parametrize("structure", ["rotation", "label-permutation", "rotation-mixture"])
def test_partition_is_deterministic_in_the_seed(digits: ImageDataset, structure: str) -> None:
    kwargs: dict[str, Any] = {"structure": structure, "dirichlet_alpha": 0.5, "noisy_clients": 1}
    first = partition_dataset(digits, 8, seed=3, **kwargs)
    for a, b in zip(first, partition_dataset(digits, 8, seed=3, **kwargs), strict=True):
        assert_same(a, b)
    other = partition_dataset(digits, 8, seed=4, **kwargs)
    assert any(
        a.y_train.shape != b.y_train.shape or not np.array_equal(a.x_train, b.x_train)
        for a, b in zip(first, other, strict=True)
    )


def test_rotation_groups_are_exact_quarter_turns(digits: ImageDataset) -> None:
    plain = partition_dataset(digits, 8, structure="none", seed=1)
    rotated = partition_dataset(digits, 8, structure="rotation", num_groups=4, seed=1)
    for client, (base, turned) in enumerate(zip(plain, rotated, strict=True)):
        group = client % 4
        assert turned.true_cluster == group and base.true_cluster == 0
        assert turned.mixture.tolist() == np.eye(4)[group].tolist()
        for x_base, x_turned in ((base.x_train, turned.x_train), (base.x_test, turned.x_test)):
            np.testing.assert_array_equal(x_turned, np.rot90(x_base, group, axes=(-2, -1)))
        np.testing.assert_array_equal(turned.y_train, base.y_train)


def test_rotation_by_other_angles_keeps_group_zero_raw(digits: ImageDataset) -> None:
    plain = partition_dataset(digits, 3, structure="none", seed=0)
    rotated = partition_dataset(digits, 3, structure="rotation", num_groups=3, seed=0)
    np.testing.assert_array_equal(rotated[0].x_train, plain[0].x_train)
    for client in (1, 2):
        assert rotated[client].x_train.shape == plain[client].x_train.shape
        assert rotated[client].x_train.dtype == np.float32
        assert not np.allclose(rotated[client].x_train, plain[client].x_train)
        assert rotated[client].true_cluster == client


def test_rotation_step_sets_the_angle_between_groups(digits: ImageDataset) -> None:
    plain = partition_dataset(digits, 4, structure="none", seed=3)
    quarter = partition_dataset(
        digits, 4, structure="rotation", num_groups=2, rotation_step=90, seed=3
    )
    half = partition_dataset(digits, 4, structure="rotation", num_groups=2, seed=3)
    for client in range(4):
        turns = client % 2
        np.testing.assert_array_equal(
            quarter[client].x_train, np.rot90(plain[client].x_train, turns, axes=(-2, -1))
        )
        np.testing.assert_array_equal(
            half[client].x_train, np.rot90(plain[client].x_train, 2 * turns, axes=(-2, -1))
        )
    mixture = partition_dataset(
        digits, 4, structure="rotation-mixture", num_groups=2, rotation_step=90, seed=3
    )
    # A mixture client's test sample from source 1 is a quarter turn of the raw image.
    base, mixed = plain[0], mixture[0]
    turned = mixed.test_sources == 1
    assert 0 < turned.sum() < len(turned) or mixed.mixture.max() > 0.9
    np.testing.assert_array_equal(
        mixed.x_test[turned], np.rot90(base.x_test[turned], 1, axes=(-2, -1))
    )


def test_label_permutation_relabels_each_group_consistently(digits: ImageDataset) -> None:
    plain = partition_dataset(digits, 8, structure="none", seed=2)
    permuted = partition_dataset(digits, 8, structure="label-permutation", num_groups=4, seed=2)
    mappings: dict[int, dict[int, int]] = {}
    for client, (base, moved) in enumerate(zip(plain, permuted, strict=True)):
        np.testing.assert_array_equal(moved.x_train, base.x_train)
        mapping = mappings.setdefault(client % 4, {})
        for old, new in zip(
            np.concatenate([base.y_train, base.y_test]),
            np.concatenate([moved.y_train, moved.y_test]),
            strict=True,
        ):
            assert mapping.setdefault(int(old), int(new)) == new, "not a function of the label"
    perms = [tuple(mappings[g][label] for label in range(10)) for g in range(4)]
    assert perms[0] == tuple(range(10))
    assert all(sorted(perm) == list(range(10)) for perm in perms)
    assert len(set(perms)) == 4


def label_entropy(labels: np.ndarray, num_classes: int) -> float:
    counts = np.bincount(labels, minlength=num_classes)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def test_dirichlet_split_is_label_skewed(digits: ImageDataset) -> None:
    iid = partition_dataset(digits, 10, structure="none")
    skewed = partition_dataset(digits, 10, structure="none", dirichlet_alpha=0.1)

    def mean_entropy(clients: list[ClientData]) -> float:
        return float(np.mean([label_entropy(c.y_train, 10) for c in clients]))

    assert mean_entropy(iid) > 0.95 * np.log(10)
    assert mean_entropy(skewed) < 0.7 * mean_entropy(iid)
    assert min(len(c.y_train) + len(c.y_test) for c in skewed) >= MIN_CLIENT_SAMPLES


@pytest.mark.parametrize("dirichlet_alpha", [0.0, 0.3])
def test_train_and_test_are_disjoint_and_cover_the_data(dirichlet_alpha: float) -> None:
    dataset = indexed_dataset()
    clients = partition_dataset(
        dataset, 6, structure="rotation", dirichlet_alpha=dirichlet_alpha, test_fraction=0.25
    )
    seen = []
    for client in clients:
        train, _ = trace(client.x_train, 600)
        test, _ = trace(client.x_test, 600)
        assert not set(train) & set(test)
        np.testing.assert_array_equal(client.y_train, dataset.y[train])
        np.testing.assert_array_equal(client.y_test, dataset.y[test])
        assert len(test) == round(0.25 * (len(train) + len(test)))
        seen.extend([*train, *test])
    assert sorted(seen) == list(range(600))


def test_validation_split_is_disjoint_and_follows_the_sources() -> None:
    dataset = indexed_dataset()
    clients = partition_dataset(
        dataset, 6, structure="rotation-mixture", num_groups=4, test_fraction=0.2,
        validation_fraction=0.1,
    )
    seen = []
    for client in clients:
        train, _ = trace(client.x_train, 600)
        test, test_turns = trace(client.x_test, 600)
        val, _ = trace(client.x_val, 600)
        assert not (set(train) & set(test) or set(train) & set(val) or set(test) & set(val))
        assert len(val) == round(0.1 * (len(train) + len(test) + len(val)))
        np.testing.assert_array_equal(client.y_val, dataset.y[val])
        # test_sources names the rotation each test image really went through.
        np.testing.assert_array_equal(client.test_sources, test_turns)
        seen.extend([*train, *test, *val])
    assert sorted(seen) == list(range(600))


def test_rotation_mixture_proportions_match_the_data() -> None:
    clients = partition_dataset(
        indexed_dataset(4000), 8, structure="rotation-mixture", num_groups=4, mixture_alpha=0.5
    )
    for client in clients:
        _, train_turns = trace(client.x_train, 4000)
        _, test_turns = trace(client.x_test, 4000)
        assert client.mixture.dtype == np.float64 and client.mixture.shape == (4,)
        assert client.mixture.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(
            client.mixture, np.bincount(train_turns, minlength=4) / len(train_turns)
        )
        assert client.true_cluster == int(np.argmax(client.mixture))
        # The held-out split (100 samples) follows the same source proportions.
        test_mixture = np.bincount(test_turns, minlength=4) / len(test_turns)
        assert np.abs(test_mixture - client.mixture).max() < 0.15
    assert any(np.count_nonzero(client.mixture > 0.1) > 1 for client in clients)


def test_small_mixture_alpha_gives_one_dominant_source() -> None:
    clients = partition_dataset(
        indexed_dataset(), 8, structure="rotation-mixture", num_groups=4, mixture_alpha=0.01
    )
    assert min(client.mixture.max() for client in clients) > 0.9


@pytest.mark.parametrize("seed", [0, 2])
def test_every_source_dominates_the_same_number_of_clients(seed: int) -> None:
    """Free Dirichlet draws gave source 0 16 of 20 clients at seed 2."""
    clients = partition_dataset(
        indexed_dataset(), 20, structure="rotation-mixture", num_groups=2,
        mixture_alpha=0.1, validation_fraction=0.0, seed=seed,
    )
    dominant = [int(client.mixture.argmax()) for client in clients]
    assert dominant == [client % 2 for client in range(20)]
    assert [c.true_cluster for c in clients] == dominant


def test_noisy_clients_have_random_labels(digits: ImageDataset) -> None:
    plain = partition_dataset(digits, 10, structure="none", seed=5)
    noisy = partition_dataset(digits, 10, structure="none", noisy_clients=3, seed=5)
    assert [client.noisy for client in noisy] == [False] * 7 + [True] * 3
    for base, client in zip(plain, noisy, strict=True):
        np.testing.assert_array_equal(client.x_train, base.x_train)
        if client.noisy:
            for y_noisy, y_true in ((client.y_train, base.y_train), (client.y_test, base.y_test)):
                assert np.mean(y_noisy == y_true) < 0.4
                assert y_noisy.min() >= 0 and y_noisy.max() < 10
        else:
            np.testing.assert_array_equal(client.y_train, base.y_train)
            np.testing.assert_array_equal(client.y_test, base.y_test)


def test_load_client_data_matches_partition(digits: ImageDataset) -> None:
    kwargs: dict[str, Any] = {"structure": "rotation", "num_groups": 2, "seed": 7}
    everyone = partition_dataset(digits, 5, **kwargs)
    for client in (0, 4):
        assert_same(load_client_data("digits", None, client, 5, **kwargs), everyone[client])
    with pytest.raises(ValueError, match="partition_id"):
        load_client_data("digits", None, 5, 5, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 500}, "num_clients"),
        ({"structure": "spiral"}, "structure"),
        ({"num_groups": 0}, "num_groups"),
        ({"num_clients": 3, "num_groups": 4}, "num_groups"),
        ({"dirichlet_alpha": -0.5}, "dirichlet_alpha"),
        ({"dirichlet_alpha": float("nan")}, "dirichlet_alpha"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"validation_fraction": -0.1}, "validation_fraction"),
        ({"test_fraction": 0.5, "validation_fraction": 0.5}, "validation_fraction"),
        ({"noisy_clients": 9}, "noisy_clients"),
        ({"noisy_clients": -1}, "noisy_clients"),
        ({"structure": "rotation-mixture", "mixture_alpha": 0.0}, "mixture_alpha"),
        ({"mixture_alpha": -1.0}, "mixture_alpha"),
        ({"rotation_step": -90.0}, "rotation_step"),
        ({"num_groups": 1, "rotation_step": 360.0}, "rotation_step"),
        ({"num_groups": 5, "rotation_step": 90.0}, "rotation_step"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments_name_the_key(
    digits: ImageDataset, kwargs: dict[str, Any], key: str
) -> None:
    arguments: dict[str, Any] = {"num_clients": 8, **kwargs}
    with pytest.raises(ValueError, match=key):
        partition_dataset(digits, **arguments)


def test_mixture_train_validation_and_test_splits_are_disjoint() -> None:
    """FedSoft's public code scored local models on training data: ours never can."""
    dataset = indexed_dataset()
    clients = partition_dataset(
        dataset, 6, structure="rotation-mixture", num_groups=2, mixture_alpha=0.5,
        test_fraction=0.2, validation_fraction=0.1,
    )
    seen = []
    for client in clients:
        train, _ = trace(client.x_train, 600)
        val, _ = trace(client.x_val, 600)
        test, test_turns = trace(client.x_test, 600)
        assert len(val) > 0 and len(test) > 0
        assert not set(train) & set(test)
        assert not set(train) & set(val)
        assert not set(val) & set(test)
        np.testing.assert_array_equal(client.y_test, dataset.y[test])
        # Two sources are 0 and 180 degrees: two quarter turns per source step.
        np.testing.assert_array_equal(client.test_sources, test_turns // 2)
        seen.extend([*train, *val, *test])
    assert sorted(seen) == list(range(600))


@pytest.mark.parametrize(
    ("structure", "num_groups", "dirichlet_alpha"),
    [("rotation", 4, 0.0), ("rotation", 3, 0.5), ("rotation-mixture", 2, 0.0)],
)
def test_copy_per_group_gives_every_group_the_whole_data_set(
    structure: str, num_groups: int, dirichlet_alpha: float
) -> None:
    """IFCA's rotated MNIST: k transformed copies, and a held-out image is held out everywhere."""
    dataset = indexed_dataset()
    clients = partition_dataset(
        dataset, 12, structure=structure, num_groups=num_groups,
        dirichlet_alpha=dirichlet_alpha, test_fraction=0.2, validation_fraction=0.1,
        mixture_alpha=0.3, rotation_step=90, copy_per_group=True, seed=1,
    )
    per_source: dict[int, list[int]] = {s: [] for s in range(num_groups)}
    trained, held_out = set(), set()
    for client in clients:
        train, train_turns = trace(client.x_train, 600)
        val, val_turns = trace(client.x_val, 600)
        test, test_turns = trace(client.x_test, 600)
        assert len(train) and len(val) and len(test)
        np.testing.assert_array_equal(client.y_test, dataset.y[test])
        # A quarter turn per source (rotation_step 90): the turns name the source.
        turns = np.concatenate([train_turns, val_turns, test_turns])
        for index, turn in zip([*train, *val, *test], turns, strict=True):
            per_source[int(turn)].append(int(index))
        trained.update(train.tolist())
        held_out.update([*val.tolist(), *test.tolist()])
    # No image is trained on by one client and held out by another, in any group.
    assert not trained & held_out
    assert len(held_out) == round(0.3 * 600)
    for indices in per_source.values():  # each source's copy: every sample once
        assert sorted(indices) == list(range(600))
    sizes = [len(c.y_train) + len(c.y_val) + len(c.y_test) for c in clients]
    assert sum(sizes) == num_groups * 600


def test_copy_per_group_mixture_follows_each_clients_proportions() -> None:
    clients = partition_dataset(
        indexed_dataset(4000), 20, structure="rotation-mixture", num_groups=2,
        mixture_alpha=0.1, rotation_step=90, validation_fraction=0.0, copy_per_group=True,
    )
    plain = partition_dataset(
        indexed_dataset(4000), 20, structure="rotation-mixture", num_groups=2,
        mixture_alpha=0.1, rotation_step=90, validation_fraction=0.0,
    )
    # About twice the samples per client, with the same dominant sources.
    assert sum(len(c.y_train) for c in clients) > 1.9 * sum(len(c.y_train) for c in plain)
    assert [int(c.mixture.argmax()) for c in clients] == [k % 2 for k in range(20)]
    for copied, base in zip(clients, plain, strict=True):
        assert abs(copied.mixture[0] - base.mixture[0]) < 0.15


def test_copy_per_group_refuses_label_skew_in_a_mixture(digits: ImageDataset) -> None:
    with pytest.raises(ValueError, match="copy_per_group"):
        partition_dataset(
            digits, 8, structure="rotation-mixture", num_groups=2, dirichlet_alpha=0.3,
            copy_per_group=True,
        )
    with pytest.raises(ValueError, match="copy_per_group"):
        partition_dataset(digits, 8, copy_per_group=1)  # type: ignore[arg-type]


def sample_index(images: np.ndarray, num_samples: int) -> np.ndarray:
    """Index of each unrotated image of :func:`indexed_dataset`."""
    return np.rint(images[:, 0, 0, 0] * (num_samples + 1)).astype(int) - 1


def test_label_permutation_mixture_relabels_each_sample_by_its_source() -> None:
    dataset = indexed_dataset(4000)
    clients = partition_dataset(
        dataset, 8, structure="label-permutation-mixture", num_groups=3, mixture_alpha=0.5,
        validation_fraction=0.1, seed=4,
    )
    new_labels: dict[int, set[int]] = {}
    for client in clients:
        _, turns = trace(client.x_train, 4000)
        assert not turns.any()  # images are not transformed
        assert client.mixture.shape == (3,) and client.mixture.sum() == pytest.approx(1.0)
        assert client.true_cluster == int(np.argmax(client.mixture))
        original = dataset.y[sample_index(client.x_train, 4000)]
        for label, new in zip(original, client.y_train, strict=True):
            new_labels.setdefault(int(label), set()).add(int(new))
    # Three sources relabel each original label to at most three labels, one of them
    # itself (source 0 keeps the identity), and not all to the same one.
    assert all(label in news and 2 <= len(news) <= 3 for label, news in new_labels.items())
    assert any(np.count_nonzero(client.mixture > 0.1) > 1 for client in clients)


def test_label_permutation_mixture_labels_follow_the_test_sources() -> None:
    dataset = indexed_dataset(4000)
    clients = partition_dataset(
        dataset, 6, structure="label-permutation-mixture", num_groups=2, mixture_alpha=0.3,
        seed=1,
    )
    changed = 0
    for client in clients:
        original = dataset.y[sample_index(client.x_test, 4000)]
        identity = client.test_sources == 0
        np.testing.assert_array_equal(client.y_test[identity], original[identity])
        changed += int((client.y_test[~identity] != original[~identity]).sum())
    assert changed > 0


def test_label_permutation_mixture_needs_a_positive_mixture_alpha() -> None:
    with pytest.raises(
        ValueError, match=r"mixture_alpha=0\.0 is invalid for structure 'label-permutation-mixture'"
    ):
        partition_dataset(
            indexed_dataset(), 4, structure="label-permutation-mixture", mixture_alpha=0.0
        )


@pytest.mark.parametrize(("size", "num_clients"), [(1797, 7), (1797, 179), (100, 3)])
def test_the_iid_split_is_flwr_datasets_iid_shards(size: int, num_clients: int) -> None:
    # Cut in one call, the shards are those IidPartitioner gives one client at a time
    # (the split every existing seed's results were made with).
    import datasets as hf_datasets
    from flwr_datasets.partitioner import IidPartitioner

    labels = np.random.default_rng(0).integers(10, size=size)
    order = stream_rng(4, STREAM_SHUFFLE).permutation(size)
    partitioner = IidPartitioner(num_partitions=num_clients)
    partitioner.dataset = hf_datasets.Dataset.from_dict({"label": labels[order], "idx": order})
    shards = split_samples(labels, num_clients, 0.0, seed=4)
    assert len(shards) == num_clients
    for client, shard in enumerate(shards):
        expected = partitioner.load_partition(client).with_format("numpy")["idx"][:]
        np.testing.assert_array_equal(shard, expected)
        assert shard.dtype == np.int64
