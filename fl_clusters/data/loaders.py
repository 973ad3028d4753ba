"""Image data sets as plain numpy arrays, loaded once per process.

Every loader returns the whole data set (its official train and test parts
concatenated): :mod:`fl_clusters.data.partition` makes its own per-client train and
test splits, so the official split carries no meaning here.

Only ``digits`` is available without any file on disk. The others read local files
and touch the network only when the caller passes ``download=True``:

========================  ======================================================
name                      source
========================  ======================================================
``digits``                ``sklearn.datasets.load_digits`` (bundled), 8x8
``fashion-mnist``         IDX files, default ``/usr/share/datasets/fashion-mnist``
                          (Debian package ``dataset-fashion-mnist``), 28x28
``mnist``                 ``torchvision.datasets.MNIST`` under ``<root>/MNIST/raw``
``emnist``                ``torchvision.datasets.EMNIST``, split ``balanced``
                          (47 classes), under ``<root>/EMNIST/raw``
``cifar10``               ``datasets.load_dataset``: a local folder (e.g. parquet
                          files) or a Hugging Face hub id, default
                          ``uoft-cs/cifar10``
========================  ======================================================
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

DATASETS = ("digits", "fashion-mnist", "mnist", "cifar10", "emnist")
# Input shape (C, H, W) and number of classes of each data set, so the server can
# size the model without loading the data (tests check them against the loaders).
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "digits": ((1, 8, 8), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "emnist": ((1, 28, 28), 47),
}

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
TORCHVISION_ROOT = str(Path.home() / ".cache" / "fl-clusters")
CIFAR10_HUB_ID = "uoft-cs/cifar10"
# "balanced" over "letters": its 47 labels are already 0..46 (letters uses 1..26 with
# an empty class 0) and every class has the same size, so label skew comes only from
# the partitioner.
EMNIST_SPLIT = "balanced"

_IDX_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class ImageDataset:
    """A labelled image data set held in memory.

    The arrays are read-only because :func:`load_dataset` shares one instance per
    process; index them (which copies) before changing anything.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`.
    x : np.ndarray
        float32 images, shape ``(N, C, H, W)``, scaled to ``[0, 1]``.
    y : np.ndarray
        int64 labels, shape ``(N,)``, in ``[0, num_classes)``.
    num_classes : int
        Number of classes.
    ids : np.ndarray | None
        The user (writer, device...) of every sample, shape ``(N,)``, for a natural
        partition (``natural_ids``: one client per user); ``None`` where the data set
        has no such column, as every loader here.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    ids: np.ndarray | None = None


def load_dataset(name: str, data_root: str | None = None, download: bool = False) -> ImageDataset:
    """Load a whole data set, once per process.

    Parameters
    ----------
    name : str
        One of :data:`DATASETS`.
    data_root : str | None
        Where the files are; ``None`` or ``""`` picks the data set's default. For
        ``fashion-mnist`` the folder holding the IDX files (default
        :data:`FASHION_MNIST_ROOT`); for ``mnist`` and ``emnist`` torchvision's root
        folder (default :data:`TORCHVISION_ROOT`); for ``cifar10`` a local folder that
        ``datasets.load_dataset`` reads or a hub id (default :data:`CIFAR10_HUB_ID`).
        Ignored for ``digits``.
    download : bool
        Allow network access for ``mnist``, ``emnist`` and ``cifar10`` when the data
        are not on disk yet. Files already downloaded are reused either way.

    Returns
    -------
    ImageDataset
        Official train and test parts concatenated, train first.

    Raises
    ------
    ValueError
        For an unknown ``name``, or a file that is not what the data set should hold.
    FileNotFoundError
        When the data are not on disk and cannot or may not be downloaded.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset name {name!r} is unknown; allowed: {', '.join(DATASETS)}")
    return _load_cached(name, data_root or None, bool(download))


@lru_cache(maxsize=4)
def _load_cached(name: str, data_root: str | None, download: bool) -> ImageDataset:
    if name == "digits":
        dataset = _load_digits()
    elif name == "fashion-mnist":
        dataset = _load_fashion_mnist(data_root or FASHION_MNIST_ROOT)
    elif name in ("mnist", "emnist"):
        dataset = _load_torchvision(name, data_root or TORCHVISION_ROOT, download)
    else:
        dataset = _load_cifar10(data_root or CIFAR10_HUB_ID, download)
    dataset.x.flags.writeable = False
    dataset.y.flags.writeable = False
    return dataset


def _from_uint8(
    name: str, images: np.ndarray, labels: np.ndarray, num_classes: int
) -> ImageDataset:
    """Build an :class:`ImageDataset` from uint8 images shaped (N, H, W) or (N, H, W, C)."""
    images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    labels = labels.astype(np.int64)
    if len(images) != len(labels):
        raise ValueError(f"{name}: {len(images)} images but {len(labels)} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"{name}: labels span [{labels.min()}, {labels.max()}], expected [0, {num_classes - 1}]"
        )
    x = np.ascontiguousarray(images, dtype=np.float32) / np.float32(255.0)
    return ImageDataset(name=name, x=x, y=labels, num_classes=num_classes)


def _load_digits() -> ImageDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel values are counts of set bits in 4x4 blocks, so 16 is the maximum.
    x = (bunch.images / 16.0).astype(np.float32)[:, None]
    return ImageDataset(name="digits", x=x, y=bunch.target.astype(np.int64), num_classes=10)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file of unsigned bytes (MNIST's format), gzip-compressed or not.

    Parameters
    ----------
    path : str | os.PathLike[str]
        The file; a name ending in ``.gz`` is decompressed.

    Returns
    -------
    np.ndarray
        uint8 array with the shape written in the file's header.

    Raises
    ------
    ValueError
        When the file is not an IDX file of unsigned bytes or is truncated.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        data = stream.read()
    # Header: two zero bytes, a type code (0x08 = unsigned byte), the number of
    # dimensions, then one big-endian uint32 per dimension.
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = data[3]
    offset = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:offset])
    values = np.frombuffer(data, dtype=np.uint8, offset=offset)
    if values.size != int(np.prod(shape)):
        raise ValueError(f"{path} holds {values.size} values, its header says shape {shape}")
    return values.reshape(shape)


def _load_fashion_mnist(root: str) -> ImageDataset:
    folder = Path(root)
    arrays = []
    for stem in _IDX_STEMS:
        candidates = [folder / f"{stem}.gz", folder / stem]
        found = next((path for path in candidates if path.is_file()), None)
        if found is None:
            raise FileNotFoundError(
                f"fashion-mnist: {stem}[.gz] not found in {folder}. Install the Debian "
                f"package with `apt-get install -y dataset-fashion-mnist` (files land in "
                f"{FASHION_MNIST_ROOT}) or set the 'data-root' run-config key to the "
                f"folder that holds the four IDX files."
            )
        arrays.append(read_idx(found))
    train_x, train_y, test_x, test_y = arrays
    return _from_uint8(
        "fashion-mnist", np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y]), 10
    )


def _load_torchvision(name: str, root: str, download: bool) -> ImageDataset:
    from torchvision import datasets as tv_datasets

    parts = []
    for train in (True, False):
        try:
            if name == "mnist":
                part = tv_datasets.MNIST(root, train=train, download=download)
            else:
                part = tv_datasets.EMNIST(root, split=EMNIST_SPLIT, train=train, download=download)
        except RuntimeError as err:
            # torchvision signals missing files with a bare RuntimeError.
            folder = Path(root) / ("MNIST" if name == "mnist" else "EMNIST") / "raw"
            raise FileNotFoundError(
                f"{name}: torchvision found no data under {folder} ({err}). Put the "
                f"uncompressed IDX files there, set the 'data-root' run-config key to "
                f"the folder that holds {folder.parent.name}/raw, or pass download=True "
                f"to allow the download."
            ) from err
        images = part.data.numpy()
        if name == "emnist":
            # EMNIST's files store each image transposed; flip it back so that
            # rotation groups rotate upright characters, as with MNIST.
            images = images.transpose(0, 2, 1)
        parts.append((images, part.targets.numpy()))
    num_classes = (
        10 if name == "mnist" else len(tv_datasets.EMNIST.classes_split_dict[EMNIST_SPLIT])
    )
    return _from_uint8(
        name,
        np.concatenate([images for images, _ in parts]),
        np.concatenate([labels for _, labels in parts]),
        num_classes,
    )


def _load_cifar10(source: str, download: bool) -> ImageDataset:
    import datasets as hf_datasets

    if not os.path.isdir(source) and not download:
        raise FileNotFoundError(
            f"cifar10: {source!r} is no local folder, so it would be fetched from the "
            f"Hugging Face hub. Pass download=True to allow that, or set the "
            f"'data-root' run-config key to a local folder of the data set's files "
            f"(e.g. parquet files with an image and a 'label' column)."
        )
    splits = hf_datasets.load_dataset(source)
    # Train first, then the rest in a fixed order, so the arrays do not depend on
    # the order the builder lists its splits in.
    names = sorted(splits, key=lambda split: (split != "train", split))
    table = hf_datasets.concatenate_datasets([splits[split] for split in names])
    image_columns = [
        column for column, feature in table.features.items()
        if isinstance(feature, hf_datasets.Image)
    ]
    if len(image_columns) != 1 or "label" not in table.features:
        raise ValueError(
            f"cifar10: {source!r} has columns {dict(table.features)}; expected one image "
            f"column and a 'label' column"
        )
    numpy_table = table.with_format("numpy")
    images = np.stack([np.asarray(image) for image in numpy_table[image_columns[0]]])
    if images.shape[1:] != (32, 32, 3):
        raise ValueError(f"cifar10: images have shape {images.shape[1:]}, expected (32, 32, 3)")
    return _from_uint8("cifar10", images, np.asarray(numpy_table["label"]), 10)
