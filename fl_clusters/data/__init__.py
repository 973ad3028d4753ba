"""Data sets and their federated partitions with a ground-truth cluster structure."""

from fl_clusters.data.client_data import ClientData
from fl_clusters.data.loaders import (
    CIFAR10_HUB_ID,
    DATASET_SHAPES,
    DATASETS,
    EMNIST_SPLIT,
    FASHION_MNIST_ROOT,
    TORCHVISION_ROOT,
    ImageDataset,
    load_dataset,
    read_idx,
)
from fl_clusters.data.partition import load_client_data, partition_dataset
from fl_clusters.data.spec import CLUSTER_STRUCTURES, MIN_CLIENT_SAMPLES, PartitionSpec

__all__ = [
    "CIFAR10_HUB_ID",
    "CLUSTER_STRUCTURES",
    "DATASETS",
    "DATASET_SHAPES",
    "EMNIST_SPLIT",
    "FASHION_MNIST_ROOT",
    "MIN_CLIENT_SAMPLES",
    "TORCHVISION_ROOT",
    "ClientData",
    "ImageDataset",
    "PartitionSpec",
    "load_client_data",
    "load_dataset",
    "partition_dataset",
    "read_idx",
]
