"""Faults: bounded sends, no empty model written, no IFCA restarts without replies."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message
from flwr.serverapp.strategy import Result

from fl_clusters.config import parse_run_config
from fl_clusters.server_app import write_results
from fl_clusters.strategies import IFCA
from tests.test_fldc_awcfl_mcfl import StubGrid, server_identity  # noqa: F401


class TimedGrid(StubGrid):
    """A StubGrid that records the timeout of every send."""

    def __init__(self, nodes: list[int], features: dict[int, list[float]]) -> None:
        super().__init__(nodes, features)
        self.timeouts: list[float | None] = []

    def send_and_receive(  # type: ignore[override]
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        self.timeouts.append(timeout)
        return super().send_and_receive(messages)


def test_mcfl_feature_query_waits_at_most_the_round_timeout(server_identity: None) -> None:  # noqa: F811
    grid = TimedGrid([1, 2], {1: [0.0, 1.0], 2: [1.0, 0.0]})
    strategy = IFCA(num_clusters=2, restarts=1, mcfl=True)
    arrays = ArrayRecord([np.zeros(2, dtype=np.float32)])
    strategy.start(grid, arrays, num_rounds=0, timeout=7.0)  # type: ignore[arg-type]
    assert grid.timeouts == [7.0]
    assert sorted(strategy.node_features) == [1, 2]


def test_an_empty_model_is_never_written(tmp_path: Path) -> None:
    result = Result(arrays=ArrayRecord())
    settings = parse_run_config({})
    with pytest.raises(RuntimeError, match="no model"):
        write_results(tmp_path / "run", settings, result, None, [], {})  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


class FailingGrid(TimedGrid):
    """Every node answers every query with an error."""

    def send_and_receive(  # type: ignore[override]
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        self.timeouts.append(timeout)
        return [Message(Error(code=0, reason="simulated crash"), reply_to=m) for m in messages]


def test_ifca_skips_its_restarts_when_every_client_fails(server_identity: None) -> None:  # noqa: F811
    grid = FailingGrid([1, 2, 3], {})
    strategy = IFCA(num_clusters=2, restarts=3, min_available_nodes=3)
    model = ArrayRecord([np.zeros(2, dtype=np.float32)])
    packed = strategy.initialize(model, grid)  # type: ignore[arg-type]
    assert len(grid.timeouts) == 1  # one query, not three
    assert strategy.rejected_replies == 3
    assert len(packed) > 0
