"""Faults: bounded sends, no empty model written, no IFCA restarts without replies."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result

from fl_clusters import protocol as p
from fl_clusters.client_errors import error_line, forget_shown
from fl_clusters.config import parse_run_config
from fl_clusters.flower_log import RAY_BACKEND_NOTICE, ClientErrorsInOneLine
from fl_clusters.handshake import NodeIdentities
from fl_clusters.results import write_results
from fl_clusters.strategies import IFCA
from tests.conftest import FailingGrid, TimedGrid


def test_mcfl_feature_query_waits_at_most_the_round_timeout(server_identity: None) -> None:
    grid = TimedGrid([1, 2], {1: [0.0, 1.0], 2: [1.0, 0.0]})
    strategy = IFCA(num_clusters=2, restarts=1, mcfl=True)
    arrays = ArrayRecord([np.zeros(2, dtype=np.float32)])
    strategy.start(grid, arrays, num_rounds=0, timeout=7.0)  # type: ignore[arg-type]
    assert grid.timeouts == [7.0, 7.0]  # the identity handshake, then the features
    assert sorted(strategy.node_features) == [1, 2]


def test_an_empty_model_is_never_written(tmp_path: Path) -> None:
    result = Result(arrays=ArrayRecord())
    settings = parse_run_config({})
    with pytest.raises(RuntimeError, match="no model"):
        write_results(tmp_path / "run", settings, result, None, [], {})  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_ifca_skips_its_restarts_when_every_client_fails(server_identity: None) -> None:
    grid = FailingGrid([1, 2, 3], {})
    strategy = IFCA(num_clusters=2, restarts=3, min_available_nodes=3)
    model = ArrayRecord([np.zeros(2, dtype=np.float32)])
    packed = strategy.initialize(model, grid)  # type: ignore[arg-type]
    assert len(grid.timeouts) == 1  # one query, not three
    assert strategy.rejected_replies == 3
    assert len(packed) > 0


@pytest.mark.parametrize("init", ["random", "local-kmeans"])
def test_a_run_whose_every_client_fails_stops_with_their_reasons(
    server_identity: None, init: str
) -> None:
    grid = FailingGrid([1, 2, 3], {})
    strategy = IFCA(num_clusters=2, init=init, min_available_nodes=3, max_failed_rounds=2)
    model = ArrayRecord([np.zeros(2, dtype=np.float32)])
    # Built by the user, so the hint names the constructor argument.
    with pytest.raises(RuntimeError, match=r"2 training rounds in a row without one valid reply"
                       r".*node 1: client error: simulated crash.*max_failed_rounds=2"):
        strategy.start(grid, model, num_rounds=5)  # type: ignore[arg-type]


def test_one_valid_round_resets_the_failed_round_count(server_identity: None) -> None:
    strategy = IFCA(num_clusters=2, init="random", max_failed_rounds=2)
    failed = [Message(Error(code=0, reason="crash"), reply_to=m) for m in _train_requests()]
    strategy.check_replies(failed, None, "aggregate_train", trains=True)
    assert strategy.failed_rounds == 1
    strategy.check_replies(_valid_replies(), None, "aggregate_train", trains=True)
    assert strategy.failed_rounds == 0
    # A query stage (not training) never counts as a failed round.
    strategy.check_replies(failed, None, "aggregate_evaluate", trains=False)
    assert strategy.failed_rounds == 0


def _train_requests() -> list[Message]:
    return [
        Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN) for node in (1, 2)
    ]


def _valid_replies() -> list[Message]:
    metrics = MetricRecord({p.M_NUM_EXAMPLES: 5, p.M_TRAIN_LOSS: 0.1})
    return [Message(RecordDict({p.METRICS: metrics}), reply_to=m) for m in _train_requests()]


@pytest.mark.slow
def test_a_simulation_whose_every_client_crashes_writes_no_results(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, ray_session: None
) -> None:
    """End to end: the ServerApp raises with the clients' reasons and writes nothing.

    Each failing node and round is one line; the traceback comes once.
    """
    from flwr.clientapp import ClientApp
    from flwr.simulation import run_simulation

    from fl_clusters.server_app import build_server_app

    broken = ClientApp()

    @broken.train()
    def train(message: Message, context: Context) -> Message:
        raise RuntimeError("the user's data loader is broken")

    settings = {"results-dir": str(tmp_path), "min-nodes": 4, "num-rounds": 4,
                "max-failed-rounds": 2, "strategy": "ifca", "num-clusters": 2}
    with pytest.raises(RuntimeError, match=r"(?s)2 training rounds in a row without one valid "
                       r"reply.*the user's data loader is broken"):
        run_simulation(server_app=build_server_app(settings), client_app=broken,
                       num_supernodes=4,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    assert not list(tmp_path.iterdir())
    output = "\n".join(record.getMessage() for record in caplog.records)
    # This app answers no identity query, so its nodes are named by their ids.
    crashed = re.findall(r"rejected reply from node (\d+): client error: RuntimeError: the "
                         r"user's data loader is broken$", output, re.MULTILINE)
    assert len(crashed) == 8 and all(crashed.count(node) == 2 for node in crashed), output
    # Two distinct errors: the crash in training, the missing evaluate function.
    assert output.count("in full (shown once per distinct error") == 2
    assert output.count('raise RuntimeError("the user\'s data loader is broken")') == 1
    assert "An exception was raised when processing a message" not in output


def _ray_reason(pid: int) -> str:
    """A simulated client's error reason as Flower's Ray backend words it (trimmed)."""
    return (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run() "
        f"(pid={pid}, ip=127.0.0.1, actor_id={pid:x})\n"
        '  File "/app/loader.py", line 9, in load\n    raise OSError("disk gone")\n'
        "OSError: disk gone\n\nThe above exception was the direct cause of the following "
        f"exception:\n\nray::ClientAppActor.run() (pid={pid})\n"
        '  File "/flwr/ray_actor.py", line 65, in run\n'
        "flwr.clientapp.client_app.ClientAppException: \n"
        "Exception ClientAppException occurred. Message: disk gone'>"
    )


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_failing_client_gets_one_line_a_round_and_its_traceback_once(
    server_identity: None,
) -> None:
    from flwr.common.logger import FLOWER_LOGGER

    strategy = IFCA(num_clusters=2, init="random", max_failed_rounds=5)
    strategy.adopt_identities(NodeIdentities(keys={1: 0, 2: 7}, partitions={1: 0, 2: 7}))
    lines = _Lines()
    FLOWER_LOGGER.addHandler(lines)
    forget_shown()
    try:
        for round_pid in (100, 200, 300):  # another actor each round: the same error
            failed = [Message(Error(code=0, reason=_ray_reason(round_pid)), reply_to=m)
                      for m in _train_requests()]
            strategy.check_replies(failed, None, "aggregate_train", trains=True)
    finally:
        FLOWER_LOGGER.removeHandler(lines)
    rejected = [m for m in lines.messages if "rejected reply" in m]
    assert rejected == [
        f"aggregate_train: rejected reply from partition {partition}: client error: "
        "OSError: disk gone" for _ in range(3) for partition in (0, 7)
    ]
    in_full = [m for m in lines.messages if "in full" in m]
    assert len(in_full) == 1 and 'File "/app/loader.py", line 9' in in_full[0]
    assert strategy.rejected_replies == 6


def test_error_line_is_the_clients_exception_or_its_message() -> None:
    assert error_line(_ray_reason(1)) == "OSError: disk gone"
    # A deployed SuperNode's reply carries the message only (it logs the traceback).
    deployed = ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException "
                "ClientAppException occurred. Message: disk gone'>")
    assert error_line(deployed) == "disk gone"


def test_flowers_copies_of_a_client_exception_are_dropped_and_others_kept() -> None:
    keep = ClientErrorsInOneLine()

    def record(msg: object, *args: object) -> logging.LogRecord:
        return logging.LogRecord("flwr", logging.ERROR, __file__, 1, msg, args, None)

    assert not keep.filter(record(RAY_BACKEND_NOTICE, "RayBackend"))
    assert not keep.filter(record(RuntimeError(_ray_reason(1))))
    assert not keep.filter(record("Traceback (most recent call last):\n" + _ray_reason(1)))
    assert keep.filter(record("Traceback (most recent call last):\nKeyError: 'x'"))
    fedavg = record("\t> Received error in reply from node %d: %s", 5, _ray_reason(1))
    assert keep.filter(fedavg)
    assert fedavg.getMessage() == "\t> Received error in reply from node 5: client error: " \
        "OSError: disk gone"
