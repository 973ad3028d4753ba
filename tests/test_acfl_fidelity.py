"""ACFL against the paper: lost trial scores, a phase 1 that never ends."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.strategies import ACFL


@pytest.fixture
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run identity Flower gives a ServerApp process; Message() needs it."""
    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


class ScoringGrid:
    """Answers validation evaluations with a fixed accuracy; some nodes stay silent."""

    def __init__(self, silent_times: dict[int, int]) -> None:
        self.silent_times = dict(silent_times)  # node -> how many requests it ignores
        self.asked: list[int] = []

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            assert msg.metadata.message_type == MessageType.EVALUATE
            node = msg.metadata.dst_node_id
            self.asked.append(node)
            if self.silent_times.get(node, 0) > 0:
                self.silent_times[node] -= 1
                continue
            metrics = MetricRecord({p.M_ACCURACY: 0.5, p.M_LOSS: 1.0, p.M_NUM_EXAMPLES: 10})
            replies.append(Message(RecordDict({p.METRICS: metrics}), reply_to=msg))
        return replies


def _model() -> object:
    return p.numpy_to_record(["w"], [np.zeros(3, np.float32)])


def test_a_member_silent_once_is_asked_again_and_scored(server_identity: None) -> None:
    acfl = ACFL()
    grid = ScoringGrid({2: 1})
    scores = acfl._trial_accuracy([1, 2, 3], _model(), grid)  # type: ignore[arg-type]
    assert scores == {1: 0.5, 2: 0.5, 3: 0.5}
    assert sorted(grid.asked) == [1, 2, 2, 3]
    assert acfl.trial_failed_members == 0


def test_a_member_silent_twice_is_left_out_not_scored_zero(server_identity: None) -> None:
    acfl = ACFL()
    grid = ScoringGrid({2: 5})
    scores = acfl._trial_accuracy([1, 2, 3], _model(), grid)  # type: ignore[arg-type]
    # Before: the lost member counted as accuracy 0 and could close a cluster.
    assert scores == {1: 0.5, 3: 0.5}
    assert acfl.trial_failed_members == 1
    assert acfl.summary_fields()["trial_failed_members"] == 1


def test_a_phase_1_that_never_ends_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    acfl = ACFL()
    with caplog.at_level(logging.WARNING):
        fields = acfl.summary_fields()
    assert fields["phase1_ended"] is False
    assert fields["clustering_round"] is None
    assert "phase 1 never ended" in caplog.text
