"""Issue 16: AWCFL mixes only aggregated clusters; FLDC r checked at the boundary; FedSoft ties."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.clustering import best_fit_counts
from fl_clusters.config import parse_run_config
from fl_clusters.strategies import CFL


@pytest.fixture(autouse=True)
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run identity Flower gives a ServerApp process; Message() needs it."""
    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


def _model(value: float) -> ArrayRecord:
    return p.numpy_to_record(["w"], [np.full(3, value, np.float32)])


def _trained(node: int, value: float) -> Message:
    request = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
    metrics = MetricRecord({p.M_NUM_EXAMPLES: 10, p.M_TRAIN_LOSS: 0.5})
    return Message(RecordDict({p.ARRAYS: _model(value), p.METRICS: metrics}), reply_to=request)


def test_awcfl_leaves_a_cluster_without_members_out_of_the_mix() -> None:
    cfl = CFL(awcfl_beta=0.5)
    old = [_model(0.0), _model(10.0), _model(100.0)]
    # Clusters 0 and 1 aggregate members this round; cluster 2 has none.
    groups = {0: [_trained(1, 2.0)], 1: [_trained(2, 4.0)]}
    packed, _ = cfl.aggregate_clusters(old, groups)
    models = [m["w"].numpy() for m in p.unpack_clusters(packed)]
    # beta/(n-1) * others + (1 - beta) * own, over the two clusters that aggregated.
    np.testing.assert_allclose(models[0], 0.5 * 4.0 + 0.5 * 2.0)
    np.testing.assert_allclose(models[1], 0.5 * 2.0 + 0.5 * 4.0)
    # The idle cluster keeps its model instead of moving to the others' mean
    # (the old mix gave 0.25 * (2 + 4) + 0.5 * 100 = 51.5).
    np.testing.assert_allclose(models[2], 100.0)


def test_awcfl_with_every_cluster_active_is_the_papers_mix() -> None:
    cfl = CFL(awcfl_beta=0.5)
    mixed = cfl.mix_clusters([_model(0.0), _model(2.0), _model(4.0)])
    np.testing.assert_allclose(
        [m["w"].numpy()[0] for m in mixed], [0.25 * 6 + 0.0, 0.25 * 4 + 1.0, 0.25 * 2 + 2.0]
    )


def test_fldc_r_zero_is_refused_by_the_run_config_not_later() -> None:
    with pytest.raises(ValueError, match=r"'fldc-r' has invalid value 0\.0; allowed: float in "
                       r"\(0\.0, 1\.0\]"):
        parse_run_config({"fldc-r": 0.0})
    assert parse_run_config({"fldc-r": 1.0})["fldc-r"] == 1.0


def test_fedsoft_counts_share_tied_samples_instead_of_giving_them_to_cluster_0() -> None:
    # Three identical cluster models (a random start in the worst case) tie on
    # every sample; argmin gave cluster 0 all 4 samples.
    tied = np.ones((3, 4))
    np.testing.assert_allclose(best_fit_counts(tied), [4 / 3, 4 / 3, 4 / 3])
    losses = np.array([[0.1, 0.5, 0.2, 0.9], [0.3, 0.5, 0.2, 0.1], [0.2, 0.6, 0.7, 0.8]])
    np.testing.assert_allclose(best_fit_counts(losses), [1 + 0.5 + 0.5, 0.5 + 0.5 + 1, 0.0])
    assert best_fit_counts(losses).sum() == pytest.approx(4.0)
