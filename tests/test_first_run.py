"""A Flower user's first run: `flwr run .` in a fresh home, what it prints, how it fails."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tomllib
from io import StringIO
from pathlib import Path

import pytest
from flwr.app import Message, MetricRecord, RecordDict
from rich.console import Console

from fl_clusters import protocol as p
from fl_clusters.config import parse_run_config
from fl_clusters.errors import ConfigurationError, OneLineConfigurationErrors
from fl_clusters.flower_log import ACTOR_SHUTDOWN_NOTICE, ActorShutdownNotices
from fl_clusters.handshake import NodeIdentities, client_error_message
from fl_clusters.progress import RoundProgress, round_ari
from fl_clusters.server_app import check_can_start
from fl_clusters.strategies import IFCA, FedEM, FedSoft

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


# ------------------------------------------------------------------ progress lines
def test_progress_line_shows_round_time_left_accuracy_ari_and_clusters() -> None:
    out = StringIO()
    progress = RoundProgress(10, {1: 0, 2: 0, 3: 1, 4: 1},
                             console=Console(file=out, width=120))
    progress.round_done(1, 2.0, 0.5, {1: 0, 2: 0, 3: 1, 4: 1}, 2)
    progress.round_done(2, 1.0, None, None, 1)
    first, second = out.getvalue().splitlines()
    assert first.startswith("round  1/10 ██░░")
    # Two rounds took 3 s: 8 rounds to go at 1.5 s each.
    assert "0:12 left" in second
    assert "accuracy 0.5000" in first and "ARI 1.000" in first and "clusters 2" in first
    assert "accuracy -" in second and "ARI -" in second and "clusters 1" in second


def test_round_ari_scores_only_nodes_with_a_known_group() -> None:
    assert round_ari({1: 0, 2: 1}, {1: 0, 2: 1, 3: 0}) == 1.0
    assert round_ari({1: 0, 2: 1}, {1: 0, 2: 0}) == 0.0
    assert round_ari({1: 0}, {1: 0, 2: 1}) is None  # one known node: no score


# ------------------------------------------------------------ one-line failures
def _record(exc: BaseException | None, msg: str = "Simulation raised an exception",
            level: int = logging.ERROR) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("flwr", level, __file__, 1, msg, (), exc_info)


def test_a_configuration_error_is_logged_as_one_line_without_traceback() -> None:
    try:
        try:
            raise ConfigurationError("IFCA needs at least 4 nodes. Fix: run more nodes")
        except ConfigurationError as inner:
            raise RuntimeError("An error was encountered. Ending simulation.") from inner
    except RuntimeError as outer:
        record = _record(outer)
    assert OneLineConfigurationErrors().filter(record)
    assert record.exc_info is None
    assert record.getMessage() == "fl-clusters: IFCA needs at least 4 nodes. Fix: run more nodes"


def test_other_errors_keep_their_traceback_and_client_tracebacks_are_dropped() -> None:
    try:
        raise KeyError("arrays")
    except KeyError as error:
        record = _record(error)
    assert OneLineConfigurationErrors().filter(record)
    assert record.exc_info is not None
    client_traceback = _record(
        None, "Traceback ...\nfl_clusters.errors.ConfigurationError: fashion-mnist not found"
    )
    assert not OneLineConfigurationErrors().filter(client_traceback)
    warning = _record(None, "fl_clusters.errors.ConfigurationError", logging.WARNING)
    assert OneLineConfigurationErrors().filter(warning)


def test_actor_shutdown_notice_is_dropped_and_nothing_else() -> None:
    notice = logging.LogRecord("flwr", logging.WARNING, __file__, 1, ACTOR_SHUTDOWN_NOTICE,
                               ("ClientAppActor",), None)
    other = logging.LogRecord("flwr", logging.WARNING, __file__, 1, "Manually stopped", (),
                              None)
    assert not ActorShutdownNotices().filter(notice)
    assert ActorShutdownNotices().filter(other)


def test_unknown_key_names_the_closest_key_and_the_doc() -> None:
    with pytest.raises(ConfigurationError) as error:
        parse_run_config({"num-round": 3})
    assert "'num-round' (did you mean 'num-rounds'?)" in str(error.value)
    assert "docs/config.md" in str(error.value)


def test_client_error_message_is_the_apps_own_message() -> None:
    reason = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()"
        "\n  File ...\nException ClientAppException occurred. Message: fashion-mnist: "
        "train-images-idx3-ubyte[.gz] not found in /nowhere'>"
    )
    assert client_error_message(reason) == (
        "fashion-mnist: train-images-idx3-ubyte[.gz] not found in /nowhere"
    )


@pytest.mark.parametrize(
    ("strategy", "fix"),
    [(IFCA(num_clusters=4), "ifca-init='random'"),
     (FedSoft(num_clusters=4, init="local-kmeans"), "fedsoft-init='random'"),
     (FedEM(num_clusters=4), "fedem-init='random'")],
    ids=["ifca", "fedsoft", "fedem"],
)
def test_fewer_nodes_than_warm_start_clusters_stop_with_the_fix(strategy, fix: str) -> None:
    with pytest.raises(ConfigurationError, match=f"needs at least 4 nodes.*{fix}"):
        check_can_start(strategy, [1, 2], NodeIdentities(keys={1: 0, 2: 1}))
    check_can_start(strategy, [1, 2, 3, 4], NodeIdentities(keys=dict.fromkeys(range(1, 5))))


def test_random_start_runs_on_fewer_nodes_than_clusters() -> None:
    check_can_start(IFCA(num_clusters=4, init="random"), [1, 2], NodeIdentities())


def test_every_node_that_cannot_take_part_stops_the_run_with_its_message() -> None:
    identities = NodeIdentities(
        keys={1: 0, 2: 1}, startup_problems={1: "data set missing", 2: "data set missing"}
    )
    with pytest.raises(ConfigurationError, match="node 1 said: data set missing"):
        check_can_start(IFCA(num_clusters=2, init="random"), [1, 2], identities)
    # One node that cannot take part is that node's problem, not the run's; and an
    # app without the identity handler (a client error) still trains.
    identities.startup_problems.pop(2)
    check_can_start(IFCA(num_clusters=2, init="random"), [1, 2], identities)
    unkeyed = NodeIdentities(keys={1: None, 2: None},
                             problems={1: "client error (no handler)", 2: "client error"})
    check_can_start(IFCA(num_clusters=2, init="random"), [1, 2], unkeyed)


def test_built_in_client_reports_its_group_or_why_it_cannot_take_part(monkeypatch) -> None:
    from flwr.app import Context
    from flwr.supercore.task_identity import TaskIdentity

    from fl_clusters.client_app import build_client_app

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    app = build_client_app({"num-clusters": 2})
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 3,
                      "num-partitions": 4}, state=RecordDict(), run_config={})
    query = Message(RecordDict(), dst_node_id=1, message_type=p.QUERY_IDENTITY)
    reply = app(query, context)
    metrics: MetricRecord = reply.content.metric_records[p.METRICS]
    assert metrics[p.M_NODE_KEY] == 3
    # Four clients in two rotation groups: clients 2 and 3 hold group 1.
    assert metrics[p.M_TRUE_GROUP] == 1
    assert p.STARTUP_PROBLEM not in reply.content.config_records
    missing = build_client_app({"dataset": "fashion-mnist", "data-root": "/nonexistent"})
    reply = missing(query, context)
    assert not reply.has_error()
    assert "not found in /nonexistent" in str(
        reply.content.config_records[p.STARTUP_PROBLEM]["message"])


# ------------------------------------------------------------ federations
def test_pyproject_declares_the_default_and_gpu_federations() -> None:
    federations = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"][
        "federations"]
    assert federations["default"] == "local-simulation"
    local = federations["local-simulation"]["options"]
    assert local["num-supernodes"] == 20
    assert local["backend"]["client-resources"] == {"num-cpus": 1}
    gpu = federations["gpu"]["options"]
    assert gpu["num-supernodes"] == 20
    assert 0 < gpu["backend"]["client-resources"]["num-gpus"] < 1


# ------------------------------------------------------------ `flwr run .` itself
def flwr(app: Path, env: dict[str, str], *args: str) -> str:
    """``flwr ARGS`` in ``app``: its output as a terminal shows it (both streams, in order)."""
    result = subprocess.run(
        [str(VENV_BIN / "flwr"), *args], cwd=app, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout
    return result.stdout


def the_problem_line(output: str) -> str:
    """The one line a run that cannot start prints, checked to be alone and early."""
    problem = [line for line in output.splitlines() if "fl-clusters: " in line]
    assert len(problem) == 1, output
    assert "Traceback" not in output
    assert "round 1/" not in output
    return problem[0]


@pytest.mark.slow
def test_flwr_run_in_a_fresh_home_runs_the_default_job(fresh_checkout) -> None:
    app, home, env = fresh_checkout
    output = flwr(app, env, "run", ".", "--stream")
    # Flower moved the project's federations into the fresh home's config.
    config = tomllib.loads((home / ".flwr" / "config.toml").read_text())["superlink"]
    assert config["default"] == "local-simulation"
    assert config["local-simulation"]["options"]["num-supernodes"] == 20
    assert config["gpu"]["options"]["backend"]["client-resources"]["num-gpus"] == 0.25
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1].startswith("results: "), lines[-5:]
    folder = Path(lines[-1].removeprefix("results: "))
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["num_clients"] == 20
    assert summary["ari"] == 1.0
    # The closing table says what a wrong placement costs (issue 58).
    assert len(summary["placement_regret"]) == 20
    assert "max placement regret" in output and "placement regret > 0.1" in output
    # One progress line per round instead of Flower's metric records.
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == 15 and rounds[-1].startswith("round 15/15")
    assert "ARI 1.000" in rounds[-1]
    assert "{'accuracy'" not in output
    assert ACTOR_SHUTDOWN_NOTICE.split(" %")[0] not in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_two_nodes_for_four_clusters_stop_before_round_1_as_a_failed_run(
    fresh_checkout,
) -> None:
    app, _, env = fresh_checkout
    # `flwr run` exits 0 on a failed run: the run's status says it failed.
    output = flwr(app, env, "run", ".", "--stream", "--federation-config",
                  "num-supernodes=2 client-resources-num-cpus=1")
    problem = the_problem_line(output)
    assert "IFCA needs at least 4 nodes" in problem
    assert "num-supernodes=4" in problem and "ifca-init='random'" in problem
    runs = json.loads(flwr(app, env, "ls", "--format", "json"))["runs"]
    assert [run["status"] for run in runs] == ["finished:failed"]
    assert "IFCA needs at least 4 nodes" in runs[0]["status-details"]


@pytest.mark.slow
def test_a_missing_data_set_stops_before_round_1_with_the_loaders_fix(fresh_checkout) -> None:
    app, _, env = fresh_checkout
    output = flwr(app, env, "run", ".", "--stream", "--run-config",
                  "dataset='fashion-mnist' data-root='/nonexistent'")
    problem = the_problem_line(output)
    assert "not found in /nonexistent" in problem
    assert "apt-get install -y dataset-fashion-mnist" in problem


@pytest.mark.parametrize(("run_config", "level"), [({}, logging.WARNING),
                                                   ({"verbose": True}, logging.NOTSET)])
def test_flwr_run_shows_flowers_info_log_only_when_verbose(
    monkeypatch, run_config: dict, level: int
) -> None:
    from flwr.app import Context
    from flwr.common.logger import FLOWER_LOGGER

    import fl_clusters.apps
    import fl_clusters.server_app

    monkeypatch.setattr(fl_clusters.server_app, "app", lambda grid, context: None)
    monkeypatch.setattr(FLOWER_LOGGER, "level", logging.NOTSET)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    fl_clusters.apps._run_server(None, context)  # type: ignore[arg-type]
    assert FLOWER_LOGGER.level == level


def test_a_run_starts_its_own_loopback_ray_unless_a_cluster_is_named(monkeypatch) -> None:
    from fl_clusters.ray_env import start_own_ray_unless_a_cluster_is_named

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    start_own_ray_unless_a_cluster_is_named()
    assert os.environ["RAY_ADDRESS"] == "local"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.9:6379")
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    start_own_ray_unless_a_cluster_is_named()
    assert os.environ["RAY_ADDRESS"] == "127.0.0.9:6379"
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ


def _make_run_filter() -> str:
    """The Makefile's RUN_OUTPUT_FILTER, as the shell gets it."""
    text = (ROOT / "Makefile").read_text()
    start = text.index("RUN_OUTPUT_FILTER := ") + len("RUN_OUTPUT_FILTER := ")
    end = text.index("\n\n", start)
    return text[start:end].replace("\\\n", "").replace("$$", "$")


@pytest.mark.parametrize(("output", "status"), [
    ("INFO :      Starting run\nround  1/2 ...\nresults: results/x\n", 0),
    # The ServerApp raised (or Flower lost it): no results line.
    ("INFO :      Starting run\nround  1/2 ...\nERROR :     ServerApp raised\n", 1),
])
def test_make_run_fails_without_the_results_line(output: str, status: int) -> None:
    result = subprocess.run(["bash", "-c", _make_run_filter()], input=output, text=True,
                            capture_output=True)
    assert result.returncode == status
    assert ("make run: the run failed" in result.stderr) == (status == 1)
    assert result.stdout == output


def test_the_machine_tests_run_in_one_xdist_group(request: pytest.FixtureRequest) -> None:
    """Under `make test` (pytest-xdist, --dist loadgroup) this module's tests share one
    worker with every other test of the local SuperLink (tests/conftest.py)."""
    # pytest-xdist's worker option; absent when the suite runs without it.
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under --dist loadgroup (make test, make test-all)")
    assert request.node.nodeid.endswith("@machine"), request.node.nodeid
