"""Unequal ground-truth groups in the partitioner (run-config key ``group-sizes``)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_clusters.config import parse_group_sizes, parse_run_config, partition_settings
from fl_clusters.data import load_dataset, partition_dataset


def _groups(clients: list) -> list[int]:
    return [c.true_cluster for c in clients]


def test_group_sizes_follow_the_shares_and_keep_equal_samples_per_client() -> None:
    digits = load_dataset("digits")
    clients = partition_dataset(digits, 20, structure="rotation", num_groups=4,
                                group_sizes=(0.4, 0.3, 0.2, 0.1))
    assert np.bincount(_groups(clients)).tolist() == [8, 6, 4, 2]
    sizes = [len(c.y_train) for c in clients]
    assert max(sizes) - min(sizes) <= 2  # shared copy: same share of the data each
    # Each group's clients see its own rotation: group 3 differs from group 0.
    first = {g: next(c for c in clients if c.true_cluster == g) for g in range(4)}
    assert not np.allclose(first[0].x_train.mean(axis=0), first[3].x_train.mean(axis=0))


def test_every_group_keeps_a_client_and_shares_are_normalized() -> None:
    digits = load_dataset("digits")
    tiny = partition_dataset(digits, 5, structure="label-permutation", num_groups=4,
                             group_sizes=(100, 1, 1, 1))
    assert np.bincount(_groups(tiny)).tolist() == [2, 1, 1, 1]
    same = partition_dataset(digits, 20, structure="rotation", num_groups=4,
                             group_sizes=(4, 3, 2, 1))
    assert np.bincount(_groups(same)).tolist() == [8, 6, 4, 2]


def test_group_sizes_from_the_run_config_reach_the_partition() -> None:
    settings = partition_settings(parse_run_config({"group-sizes": "0.7,0.1,0.1,0.1"}))
    assert settings["group_sizes"] == (0.7, 0.1, 0.1, 0.1)
    clients = partition_dataset(load_dataset("digits"), 10, **settings)
    assert np.bincount(_groups(clients)).tolist() == [7, 1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"structure": "rotation", "group_sizes": (0.5, 0.5)}, "4 positive finite shares"),
        ({"structure": "rotation", "group_sizes": (0.5, 0.5, 0.0, 0.1)}, "positive"),
        ({"structure": "none", "group_sizes": (0.4, 0.3, 0.2, 0.1)}, "hard structures"),
        ({"structure": "rotation-mixture", "group_sizes": (0.4, 0.3, 0.2, 0.1)}, "hard"),
    ],
)
def test_bad_group_sizes_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        partition_dataset(load_dataset("digits"), 20, num_groups=4, **kwargs)


def test_group_sizes_key_parses_shares_and_names_bad_values() -> None:
    assert parse_group_sizes("") is None
    assert parse_group_sizes("0.4,0.3,0.2,0.1") == (0.4, 0.3, 0.2, 0.1)
    for bad in ("0.5,-0.5", "a,b", "1,,2"):
        with pytest.raises(ValueError, match="group-sizes"):
            parse_group_sizes(bad)
