"""The shared local-k-means warm start and the explicit failed-round policy.

Covers :mod:`fl_clusters.clustering.starts` (pure math),
:mod:`fl_clusters.strategies.kit.warm_start` (what IFCA, FedEM and FedSoft share) and
:func:`fl_clusters.strategies.kit.replies.count_failed_round`.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict

from fl_clusters import protocol as p
from fl_clusters.clustering import most_balanced_restart, warm_start_points
from fl_clusters.strategies import IFCA, FedEM, FedSoft
from fl_clusters.strategies.kit.replies import count_failed_round
from fl_clusters.strategies.kit.warm_start import group_local_models, kmeans_start_problem
from tests.conftest import START, NodesOnly, train_reply


def test_warm_start_points_use_the_output_layer_less_its_mean_row() -> None:
    start = [np.zeros((3, 4)), np.zeros(3)]
    update = np.arange(12.0).reshape(3, 4)
    trained = [[update, np.ones(3)], [2.0 * update + 5.0, np.zeros(3)]]
    points = warm_start_points(start, trained)
    # Scale and a common row drop out: both clients point the same way.
    np.testing.assert_allclose(points[0], points[1], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(points, axis=1), 1.0)


def test_warm_start_points_without_a_matrix_are_unit_whole_updates() -> None:
    points = warm_start_points([np.zeros(2)], [[np.array([3.0, 4.0])], [np.zeros(2)]])
    np.testing.assert_allclose(points, [[0.6, 0.8], [0.0, 0.0]])


def test_most_balanced_restart_picks_the_even_spread() -> None:
    # Restart 0 sends both clients to cluster 0; restart 1 splits them.
    losses = np.array([[[0.1, 0.9], [0.1, 0.9]], [[0.1, 0.9], [0.9, 0.1]]])
    best, counts = most_balanced_restart(losses)
    assert best == 1
    np.testing.assert_array_equal(counts, [[2, 0], [1, 1]])
    with pytest.raises(ValueError, match=r"\(N, R, k\)"):
        most_balanced_restart(np.ones((2, 2)))


def test_kmeans_start_problem_only_for_the_local_kmeans_start() -> None:
    assert kmeans_start_problem("IFCA", "random", 1, 1.0, 4, "fix") is None
    assert kmeans_start_problem("IFCA", "local-kmeans", 4, 1.0, 4, "fix") is None
    problem = kmeans_start_problem("IFCA", "local-kmeans", 3, 1.0, 4, "set ifca-init='random'")
    assert problem is not None and "samples 3" in problem and "ifca-init='random'" in problem


def _requests(nodes: list[int]) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]


def test_group_local_models_groups_the_nodes_by_their_updates(
    server_identity: None,
) -> None:
    weights = START["layer.weight"].numpy()
    away = np.zeros_like(weights)
    away[0] = 1.0
    toward = np.zeros_like(weights)
    toward[1] = 1.0
    models = [away, away * 2, toward, toward * 3]
    replies = [
        train_reply(request, p.numpy_to_record(["layer.weight", "layer.bias"],
                                               [w.astype(np.float32), np.zeros(3, np.float32)]),
                    10, None)
        for request, w in zip(_requests([1, 2, 3, 4]), models, strict=True)
    ]
    start = group_local_models(replies, START, 2, seed=0)
    groups = start.node_groups()
    assert groups[1] == groups[2] != groups[3] == groups[4]
    assert sorted(start.sizes()) == [2, 2]
    assert [len(members) for members in start.members()] == [2, 2]


@pytest.mark.parametrize("strategy", [
    IFCA(num_clusters=2, max_failed_rounds=5),
    FedEM(num_clusters=2, max_failed_rounds=5),
    FedSoft(num_clusters=2, init="local-kmeans", max_failed_rounds=5),
])
def test_every_warm_start_round_counts_as_training(
    server_identity: None, strategy: IFCA | FedEM | FedSoft
) -> None:
    """IFCA, FedEM and FedSoft share one warm start: it counts as training, and a
    round without a local model per cluster is repeated, not fatal."""
    failed = [Message(Error(code=0, reason="crash"), reply_to=m) for m in _requests([1, 2])]
    strategy.configure_warm_start(1, START, ConfigRecord(), NodesOnly([1, 2]))  # type: ignore[arg-type]
    assert strategy.aggregate_train(1, failed) == (None, None)
    assert strategy.failed_rounds == 1
    assert strategy.warm_start_due(START)  # the next round warm-starts again


def test_count_failed_round_resets_counts_and_stops() -> None:
    assert count_failed_round(2, 3, "max_failed_rounds=3", "train", True, []) == 0
    assert count_failed_round(0, 3, "max_failed_rounds=3", "train", False, []) == 1
    reasons = [f"node {n}: client error (crash)" for n in range(12)]
    with pytest.raises(RuntimeError, match=r"3 training rounds.*node 9.*\(\+2 more\).*raise x"):
        count_failed_round(2, 3, "x", "train", False, reasons)
