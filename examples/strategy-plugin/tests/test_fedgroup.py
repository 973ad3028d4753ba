"""FedGroup through fl-clusters' conformance checks, and on the groups it must find."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fl_clusters.strategies.kit.registry import strategy_classes
from fl_clusters.testing import in_process_server, loopback_run, parametrize_with_checks

from fl_clusters_fedgroup import FedGroup
from fl_clusters_fedgroup.fedgroup import decomposed_cosine


@parametrize_with_checks([FedGroup])
def test_fedgroup(strategy, check) -> None:  # type: ignore[no-untyped-def]
    check(strategy)


def test_the_entry_point_registers_it() -> None:
    assert strategy_classes()["fedgroup"] is FedGroup


def test_clients_of_one_direction_share_a_row_whatever_their_step() -> None:
    direction = np.array([1.0, 2.0, 0.0, -1.0])
    other = np.array([0.0, 1.0, 1.0, 1.0])
    updates = np.stack([direction, 3 * direction, other, 0.5 * other])
    rows = decomposed_cosine(updates, 2)
    assert rows.shape == (4, 2)
    np.testing.assert_allclose(rows[0], rows[1], atol=1e-12)
    np.testing.assert_allclose(rows[2], rows[3], atol=1e-12)
    assert np.linalg.norm(rows[0] - rows[2]) > 0.5


def test_it_finds_the_two_label_groups(tmp_path: Path) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "fedgroup"}, tmp_path)
    assert summary["ari"] == 1.0
    assert summary["num_clusters_found"] == 2
