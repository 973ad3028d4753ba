"""The data layer at a million clients: the lazy plan, samples-per-client, natural ids."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from fl_clusters.config import parse_run_config, partition_settings
from fl_clusters.data import ImageDataset, load_client_data, partition_dataset
from fl_clusters.data.pieces import role_counts
from fl_clusters.data.plan import Plan, plan_partition
from fl_clusters.data.spec import PartitionSpec
from tests.test_data import indexed_dataset, trace

SMALL_SETTINGS = [
    {"structure": "rotation", "num_groups": 4, "copy_per_group": True},
    {"structure": "rotation", "num_groups": 4, "copy_per_group": True, "samples_per_client": 40,
     "validation_fraction": 0.1, "group_sizes": (0.4, 0.3, 0.2, 0.1)},
    {"structure": "rotation-mixture", "num_groups": 4, "copy_per_group": True,
     "samples_per_client": 30},
    {"structure": "rotation-mixture", "num_groups": 4, "noisy_clients": 2},
    {"structure": "label-permutation", "num_groups": 3, "samples_per_client": 25},
    {"structure": "none", "dirichlet_alpha": 0.5, "validation_fraction": 0.1},
]


def _plan(dataset: ImageDataset, num_clients: int, **settings: Any) -> Plan:
    return plan_partition(dataset, num_clients, PartitionSpec(**settings))


def fashion_sized(num_samples: int = 70_000) -> ImageDataset:
    """Test fixture, not a real data set: Fashion-MNIST's sample count, 1-pixel images."""
    labels = np.random.default_rng(0).integers(10, size=num_samples)
    return ImageDataset("fashion-sized", np.zeros((num_samples, 1, 1, 1), np.float32),
                        labels, num_classes=10)


# --- the lazy plan ----------------------------------------------------------------


@pytest.mark.parametrize("settings", SMALL_SETTINGS)
def test_a_clients_plan_is_what_its_materialized_data_hold(settings: dict[str, Any]) -> None:
    dataset = indexed_dataset(600)
    clients = partition_dataset(dataset, 12, **settings)
    plan = _plan(dataset, 12, **settings)
    assert plan.num_clients == 12
    for client_id, data in enumerate(clients):
        planned = plan.client(client_id)
        for images, indices, sources in (
            (data.x_train, planned.train_idx, planned.train_sources),
            (data.x_test, planned.test_idx, planned.test_sources),
            (data.x_val, planned.val_idx, planned.val_sources),
        ):
            assert len(images) == len(indices)
            if not len(images):
                continue
            index, turns = trace(images, 600)
            np.testing.assert_array_equal(index, indices)
            if settings["structure"].startswith("rotation"):
                np.testing.assert_array_equal(turns, sources)
        assert data.noisy == planned.noisy
        np.testing.assert_array_equal(data.test_sources, planned.test_sources)


def test_a_client_outside_the_plan_is_refused() -> None:
    plan = _plan(indexed_dataset(), 5)
    with pytest.raises(ValueError, match=r"client 5 is outside \[0, 4\]"):
        plan.client(5)


# --- samples per client -------------------------------------------------------------


def _all_indices(plan: Plan, client: int) -> np.ndarray:
    planned = plan.client(client)
    return np.concatenate([planned.train_idx, planned.test_idx, planned.val_idx])


@pytest.mark.parametrize("copies", [False, True])
def test_samples_per_client_gives_each_client_n_disjoint_samples_while_they_fit(
    copies: bool,
) -> None:
    dataset = indexed_dataset(600)
    plan = _plan(dataset, 40, structure="rotation", num_groups=4, copy_per_group=copies,
                 samples_per_client=15)  # 40 x 15 = 600: exactly the data set
    assert not plan.overlapping
    seen: dict[int, list[np.ndarray]] = {}
    for client in range(40):
        indices = _all_indices(plan, client)
        assert len(indices) == 15
        seen.setdefault(int(plan.groups[client]) if copies else 0, []).append(indices)
    for group_indices in seen.values():
        joined = np.concatenate(group_indices)
        assert len(np.unique(joined)) == len(joined)


@pytest.mark.parametrize("copies", [False, True])
def test_samples_per_client_beyond_the_data_overlaps_and_says_so(
    copies: bool, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = indexed_dataset(600)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        plan = _plan(dataset, 100, structure="rotation", num_groups=4, copy_per_group=copies,
                     samples_per_client=50)
    assert plan.overlapping
    warned = [r.getMessage() for r in caplog.records if "samples_per_client=50" in r.getMessage()]
    assert len(warned) == 1
    taken = "1250 samples of its 600" if copies else "5000 samples of its 600"
    assert taken in warned[0] and "at most 12 clients" in warned[0]
    for client in (0, 13, 99):
        indices = _all_indices(plan, client)
        assert len(indices) == 50 and len(np.unique(indices)) == 50


def test_samples_per_client_is_the_same_for_the_same_seed() -> None:
    dataset = fashion_sized(5000)
    settings = {"structure": "rotation", "copy_per_group": True, "samples_per_client": 50}
    first, again = _plan(dataset, 300, seed=3, **settings), _plan(dataset, 300, seed=3, **settings)
    other = _plan(dataset, 300, seed=4, **settings)
    for client in (0, 7, 299):
        np.testing.assert_array_equal(_all_indices(first, client), _all_indices(again, client))
        np.testing.assert_array_equal(first.client(client).test_idx, again.client(client).test_idx)
    assert not np.array_equal(_all_indices(first, 7), _all_indices(other, 7))


def test_every_slice_of_a_copy_gets_its_share_of_test_samples() -> None:
    # A slice of a plain shuffle would miss the test samples now and then; the
    # copies' shuffles spread them, so every client of 50 gets its 10.
    plan = _plan(fashion_sized(), 20_000, structure="rotation", copy_per_group=True,
                 samples_per_client=50, validation_fraction=0.1)
    counts = role_counts(plan.pieces, plan.roles, num_roles=3)
    assert counts[:, 0].min() >= 9 and counts[:, 1].min() >= 4
    assert (counts.sum(axis=1) == 50).all()


@pytest.mark.parametrize(("settings", "message"), [
    ({"samples_per_client": 1}, r"samples_per_client=1 is too small: a client needs at least "
                                r"2 samples.*samples-per-client"),
    ({"samples_per_client": 2, "validation_fraction": 0.1}, "at least 3 samples"),
    ({"samples_per_client": 601}, r"exceeds the 600 samples of 'indexed'.*samples-per-client"),
    ({"samples_per_client": 20, "dirichlet_alpha": 0.5},
     "cannot be combined with dirichlet_alpha=0.5"),
    ({"samples_per_client": 3, "copy_per_group": True},
     r"client \d+ got no test sample out of its 3\. Fix: raise test_fraction \(run-config key "
     r"test-fraction\), or raise samples_per_client"),
    ({"samples_per_client": -1}, r"samples_per_client=-1 is invalid"),
])
def test_samples_per_client_mistakes_are_named(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(indexed_dataset(600), 20, structure="rotation", num_groups=4, **settings)


def test_the_run_config_key_reaches_every_client() -> None:
    settings = partition_settings(parse_run_config({"samples-per-client": 30, "num-groups": 2}))
    assert settings["samples_per_client"] == 30
    data = load_client_data("digits", None, 3, 200, **settings)
    assert len(data.y_train) + len(data.y_test) + len(data.y_val) == 30


# --- a million clients ---------------------------------------------------------------


def test_a_million_client_plan_is_built_from_a_few_arrays() -> None:
    plan = _plan(fashion_sized(), 1_000_000, structure="rotation", num_groups=4,
                 copy_per_group=True, samples_per_client=50)
    assert plan.num_clients == 1_000_000 and plan.overlapping
    held = sum(array.nbytes for array in (plan.groups, plan.pieces.pool, plan.pieces.start,
                                          plan.pieces.length, *plan.pieces.pools))
    assert held < 100 * 2**20
    last = plan.client(999_999)
    assert last.group == 3 and set(last.train_sources) == {3}
    assert (len(last.train_idx), len(last.test_idx)) == (40, 10)
    # Group 3's 250,000th client wraps around its copy: its slice starts at
    # 249,999 x 50 mod 70,000 of group 3's shuffle.
    shuffle = plan.pieces.pools[3]
    start = 249_999 * 50 % 70_000
    assert set(_all_indices(plan, 999_999)) == set(shuffle[start : start + 50])


# --- natural ids ---------------------------------------------------------------------

WRITERS = ["writer-c", "writer-a", "writer-b", "writer-a", "writer-c", "writer-b"] * 3


def by_writer(ids: list[str] | None = None) -> ImageDataset:
    """Test fixture, not a real data set: 18 indexed images of three writers, six each."""
    indexed = indexed_dataset(18)
    return ImageDataset("by-writer", indexed.x, indexed.y, indexed.num_classes,
                        ids=np.array(WRITERS if ids is None else ids))


def test_natural_ids_give_one_client_per_writer_as_flwr_datasets_does() -> None:
    import datasets as hf_datasets
    from flwr_datasets.partitioner import NaturalIdPartitioner

    dataset = by_writer()
    clients = partition_dataset(dataset, 3, structure="label-permutation", num_groups=3,
                                natural_ids=True)
    partitioner = NaturalIdPartitioner(partition_by="writer")
    partitioner.dataset = hf_datasets.Dataset.from_dict(
        {"writer": WRITERS, "idx": np.arange(len(WRITERS))})
    assert partitioner.num_partitions == 3
    for client, data in enumerate(clients):
        held = np.concatenate([trace(x, 18)[0] for x in (data.x_train, data.x_test)])
        expected = partitioner.load_partition(client)["idx"]
        assert sorted(held) == expected
        assert {WRITERS[i] for i in held} == {f"writer-{'abc'[client]}"}
        assert data.true_cluster == client


@pytest.mark.parametrize(("dataset", "clients", "settings", "message"), [
    (indexed_dataset(18), 3, {}, r"natural_ids needs one id \(user or writer\) per sample; "
                                 r"'indexed' has none"),
    (by_writer(), 4, {}, r"'by-writer' has 3 users but num_clients=4.*num-clients=3"),
    (by_writer(), 3, {"copy_per_group": True}, "cannot be combined with copy_per_group"),
    (by_writer([*WRITERS[:-1], "writer-d"]), 4, {},
     r"user 'writer-d' \(client 3\) of 'by-writer' has 1 sample\(s\); each needs at least 2"),
])
def test_natural_id_mistakes_are_named(
    dataset: ImageDataset, clients: int, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        partition_dataset(dataset, clients, structure="rotation", num_groups=3,
                          natural_ids=True, **settings)
