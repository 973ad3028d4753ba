"""A user's mistakes stop a run before round 1, in one line naming the problem and the fix.

An unwritable results folder, a checkpoint that cannot be resumed, too few nodes
for the clusters, a partition too fine for its splits: each is found before any
node trains, and ends the run as one ``fl-clusters: ...`` line instead of a
traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

from fl_clusters import protocol as p
from fl_clusters.checkpoint import CHECKPOINT_FILE
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.data import partition
from fl_clusters.data.partition import load_client_data
from fl_clusters.errors import ConfigurationError, OneLineConfigurationErrors
from fl_clusters.handshake import NodeIdentities
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.server_app import check_can_start, run_federation
from fl_clusters.strategies import IFCA
from fl_clusters.testing import in_process_server
from tests.conftest import NodesOnly
from tests.test_checkpoint import _checkpoint

# digits (1,797 images) in 4 rotated copies over 700 clients: about 10 samples a
# client, too few for a validation share of 0.1 to reach every client.
TOO_FINE = {"copy_per_group": True, "structure": "rotation", "num_groups": 4,
            "validation_fraction": 0.1}


class CountingNodes(NodesOnly):
    """A grid that counts how often the server asked which nodes are there."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(nodes)
        self.asked = 0

    def get_node_ids(self) -> list[int]:
        self.asked += 1
        return super().get_node_ids()


def _one_line(error: ConfigurationError) -> str:
    """What Flower's log shows of ``error`` ending the ServerApp."""
    record = logging.LogRecord("flwr", logging.ERROR, __file__, 1, "ServerApp raised", (),
                               (type(error), error, error.__traceback__))
    assert OneLineConfigurationErrors().filter(record)
    assert record.exc_info is None
    message = record.getMessage()
    assert "\n" not in message
    return message


def _refused(settings: dict[str, Any]) -> tuple[str, CountingNodes]:
    grid = CountingNodes([1, 2, 3, 4])
    with pytest.raises(ConfigurationError) as error:
        run_federation(grid, parse_run_config(settings))  # type: ignore[arg-type]
    return _one_line(error.value), grid


def test_an_unwritable_results_dir_is_refused_before_any_node_is_asked(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    results = tmp_path / "a-file" / "results"
    line, grid = _refused({"results-dir": str(results)})
    assert line.startswith(f"fl-clusters: results-dir: cannot write the results folder {results}/")
    assert "set the run-config key results-dir to a folder you can write" in line
    assert grid.asked == 0


@pytest.mark.parametrize("mistake", ["truncated", "another strategy", "another num-clusters"])
def test_a_checkpoint_that_cannot_be_resumed_is_refused_in_one_line(
    tmp_path: Path, mistake: str
) -> None:
    saved = {"num-rounds": 4, "strategy": "ifca", "num-clusters": 2}
    _checkpoint(parse_run_config(saved)).write(tmp_path)
    resumed = {**saved, "resume-from": str(tmp_path), "results-dir": str(tmp_path / "out")}
    if mistake == "truncated":
        data = (tmp_path / CHECKPOINT_FILE).read_bytes()
        (tmp_path / CHECKPOINT_FILE).write_bytes(data[: len(data) // 2])
    elif mistake == "another strategy":
        resumed["strategy"] = "cfl"
    else:
        resumed["num-clusters"] = 3
    line, grid = _refused(resumed)
    assert line.startswith("fl-clusters: resume-from: ")
    assert grid.asked == 0
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_too_few_nodes_for_the_clusters_names_the_count_needed() -> None:
    with pytest.raises(ConfigurationError) as error:
        check_can_start(IFCA(num_clusters=25), list(range(20)), NodeIdentities())
    line = _one_line(error.value)
    assert "num-supernodes=25" in line and "deploy/start.sh -n 25" in line
    assert "num-supernodes=20" not in line
    # Half the nodes sampled: 25 of them need 50.
    with pytest.raises(ConfigurationError, match="num-supernodes=50"):
        check_can_start(IFCA(num_clusters=25, fraction_train=0.5), list(range(20)),
                        NodeIdentities())


def test_more_groups_than_partitions_names_the_count_and_both_fixes() -> None:
    # What deploy/start.sh -n 3 prints with the default num-clusters = 4.
    with pytest.raises(ValueError) as error:
        load_client_data("digits", None, 0, 3, structure="rotation", num_groups=4)
    message = str(error.value)
    assert "num-supernodes=4" in message and "deploy/start.sh -n 4" in message
    assert '--run-config "num-clusters=3"' in message


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of clients of every partition plan computed during the test."""
    calls: list[int] = []
    plan = partition.plan_partition

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return plan(*args, **kwargs)

    monkeypatch.setattr(partition, "plan_partition", counted)
    partition._plan_or_problem.cache_clear()
    return calls


def test_a_plan_that_cannot_be_made_is_computed_once_and_refused_in_one_line(
    plans_made: list[int],
) -> None:
    calls = plans_made
    reasons = {}
    for client in range(3):
        with pytest.raises(ValueError, match="got no validation sample") as error:
            load_client_data("digits", None, client, 700, **TOO_FINE)
        reasons[client + 1] = str(error.value)
    assert calls == [700]
    assert len(set(reasons.values())) == 1
    # Every node says so at the handshake: the run stops before round 1.
    with pytest.raises(ConfigurationError) as stop:
        check_can_start(IFCA(num_clusters=2), [1, 2, 3],
                        NodeIdentities(startup_problems=reasons, partitions={1: 0, 2: 1, 3: 2}))
    assert _one_line(stop.value).startswith(
        "fl-clusters: no node can take part; partition 0 said: client ")


def test_a_federation_too_fine_for_its_splits_stops_after_one_node_answered(
    plans_made: list[int], tmp_path: Path
) -> None:
    # The same partition as a 700-node run config: the server asks one node,
    # which computes the plan once and says every node shares the reason.
    calls = plans_made

    class CountingGrid(LoopbackGrid):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.sent: list[str] = []

        def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
            messages = list(messages)
            self.sent += [m.metadata.message_type for m in messages]
            return super().push_messages(messages)

    settings = parse_run_config({
        "dataset": "digits", "copy-per-group": True, "cluster-structure": "rotation",
        "num-clusters": 4, "validation-fraction": 0.1, "min-nodes": 700,
        "results-dir": str(tmp_path),
    })
    grid = CountingGrid(build_client_app(settings), 700, settings)
    with in_process_server(), pytest.raises(ConfigurationError) as error:
        run_federation(grid, settings)
    assert calls == [700]
    assert grid.sent == [p.QUERY_IDENTITY]
    line = _one_line(error.value)
    assert line.startswith("fl-clusters: no node can take part; partition 0 said: client ")
    assert "got no validation sample" in line and "validation-fraction" in line
    assert not list(tmp_path.iterdir())

@pytest.mark.slow
def test_a_simulation_with_an_unwritable_results_dir_trains_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from flwr.simulation import run_simulation

    from fl_clusters.client_app import build_client_app
    from fl_clusters.server_app import build_server_app

    (tmp_path / "a-file").write_text("")
    settings = {"results-dir": str(tmp_path / "a-file" / "results"), "min-nodes": 2,
                "num-rounds": 2, "num-clusters": 2}
    with pytest.raises(ConfigurationError) as error:
        run_simulation(server_app=build_server_app(settings),
                       client_app=build_client_app(settings), num_supernodes=2,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    # `flwr run` logs it as this one line (run_simulation re-raises it instead).
    assert "a-file/results" in _one_line(error.value)
    messages = [record.getMessage() for record in caplog.records]
    assert any("Registered 2 nodes" in m for m in messages)  # the log is captured
    assert not any("configure_train" in m or "[ROUND 1/" in m for m in messages), messages
