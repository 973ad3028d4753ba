"""The simulation on a Ray cluster of two nodes (head + worker), on loopback only.

The recipe of docs/cluster.md on one machine: a cluster is started, ``flwr run .``
joins it through ``RAY_ADDRESS``, and the run's placement says where each client
trained. Every Ray process and the driver use 127.0.0.1
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, see deploy/loopback_ray_cluster.py); the
cluster's files live in a folder of the test's own (``RAY_TMPDIR``), and the test
stops exactly the processes it started.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploy.loopback_ray_cluster import LOOPBACK, LoopbackCluster
from fl_clusters.checkpoint import CHECKPOINT_FILE
from tests.conftest import VENV_BIN, stop_local_superlink

pytestmark = pytest.mark.slow

ROUNDS = 4
RUN_CONFIG = f"num-rounds={ROUNDS} torch-threads=1"
FEDERATION = "num-supernodes=20 client-resources-num-cpus=1"


@pytest.fixture
def cluster() -> Iterator[LoopbackCluster]:
    # A short folder: Ray's socket paths must stay under the 107 characters of AF_UNIX.
    folder = Path(tempfile.mkdtemp(prefix="flc-ray-"))
    started = LoopbackCluster(folder)
    try:
        yield started
    finally:
        started.stop()
        assert not started.processes(), "a Ray process of the test's cluster is still running"
        assert not (Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster").exists() or (
            started.address not in (Path(tempfile.gettempdir()) / "ray"
                                    / "ray_current_cluster").read_text()
        ), "the cluster's address was left in Ray's default temp folder"
        shutil.rmtree(folder, ignore_errors=True)


def flwr_run(
    app: Path, env: dict[str, str], ray_address: str | None, federation: str = FEDERATION,
    run_config: str = RUN_CONFIG,
) -> subprocess.Popen[str]:
    """``flwr run . --stream`` as docs/cluster.md gives it, its output streamed.

    The simulation inherits ``RAY_ADDRESS`` from the local SuperLink that `flwr run`
    starts, so none may be running from before.
    """
    stop_local_superlink()
    env = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    if ray_address is not None:
        env.update(LOOPBACK, RAY_ADDRESS=ray_address)
    return subprocess.Popen(
        [str(VENV_BIN / "flwr"), "run", ".", "--stream", "--run-config", run_config,
         "--federation-config", federation],
        cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(
    run: subprocess.Popen[str], on_line: Callable[[str], None] | None = None,
    results_last: bool = True,
) -> tuple[list[str], Path]:
    """Read the run's output to its end; return it and its results folder.

    ``results_last``: the results line must be the last one (after a node was
    lost, Ray's driver prints the dead raylet's last log lines at shutdown).
    """
    lines = []
    assert run.stdout is not None
    for line in run.stdout:
        lines.append(line.rstrip("\n"))
        if on_line is not None:
            on_line(line)
    assert run.wait(timeout=600) == 0, "\n".join(lines)
    found = [line for line in lines if line.startswith("results: ")]
    assert len(found) == 1, "\n".join(lines[-40:])
    if results_last:
        assert [line for line in lines if line.strip()][-1] == found[0], "\n".join(lines[-40:])
    return lines, Path(found[0].removeprefix("results: "))


def placement(folder: Path) -> list[dict[str, str]]:
    with (folder / "assignments.csv").open() as rows:
        return list(csv.DictReader(rows))


COMPARED = ("ari", "nmi", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "num_clusters_found", "assignment_history")


def test_ray_cluster_of_two_nodes_runs_the_app_unchanged(cluster, fresh_checkout) -> None:
    app, _, env = fresh_checkout
    _, folder = finish(flwr_run(app, env, cluster.address))
    summary = json.loads((folder / "summary.json").read_text())
    rows = placement(folder)
    # Each client's row names the node of its last task; the summary counts every
    # task, and both nodes trained.
    assert {row["ray_node"] for row in rows} <= {cluster.head, cluster.worker}
    assert {row["device"] for row in rows} == {"cpu"}
    assert set(summary["placement"]["ray_nodes"]) == {cluster.head, cluster.worker}
    assert sum(summary["placement"]["devices"].values()) == 20 * ROUNDS
    # The same seed on one machine's own Ray gives the same run.
    _, alone = finish(flwr_run(app, env, None))
    single = json.loads((alone / "summary.json").read_text())
    assert {key: summary[key] for key in COMPARED} == {key: single[key] for key in COMPARED}
    assert len({row["ray_node"] for row in placement(alone)}) == 1


def test_ray_cluster_losing_its_worker_in_round_2_goes_on(
    cluster, fresh_checkout, tmp_path
) -> None:
    app, _, env = fresh_checkout
    # The worker dies when round 1's checkpoint lands: the streamed "round 1/" line
    # can trail the ServerApp by several rounds on a loaded machine.
    results = tmp_path / "results"
    killed = threading.Event()
    finished = threading.Event()

    def kill_after_round_1() -> None:
        while not finished.wait(0.05):
            if any(results.glob(f"*/{CHECKPOINT_FILE}")):
                cluster.kill_worker()
                killed.set()
                return

    killer = threading.Thread(target=kill_after_round_1, daemon=True)
    killer.start()
    run_config = f'{RUN_CONFIG} checkpoint-every=1 results-dir="{results}"'
    try:
        lines, folder = finish(flwr_run(app, env, cluster.address, run_config=run_config),
                               results_last=False)
    finally:
        finished.set()
        killer.join()
    assert killed.is_set(), "round 1 never ended"
    summary = json.loads((folder / "summary.json").read_text())
    rounds = [line for line in lines if line.startswith("round ")]
    assert len(rounds) == ROUNDS, "\n".join(lines[-40:])
    # Every cluster model survived and trained on; the clients score as before.
    assert summary["num_cluster_models"] == 4
    assert summary["ari"] == 1.0
    # Until Ray declares the lost node's actor dead, a message that lands on it fails
    # and is logged (a client's score can be missing: the summary names it). Once
    # declared dead, the actor leaves Flower's pool (fl_clusters.ray_pool).
    if any("ActorDiedError" in line for line in lines):
        assert any("died with its node" in line for line in lines), "\n".join(lines)
    assert summary["num_clients"] + len(summary["unreported_nodes"]) == 20, "\n".join(lines)
    assert summary["num_clients"] >= 18, "\n".join(lines)
    assert {row["ray_node"] for row in placement(folder)} >= {cluster.head}
    assert summary["placement"]["ray_nodes"][cluster.head] > summary["placement"][
        "ray_nodes"].get(cluster.worker, 0)


def test_ray_cluster_refuses_init_args_num_cpus_in_one_line(cluster, fresh_checkout) -> None:
    app, _, env = fresh_checkout
    run = flwr_run(app, env, cluster.address, FEDERATION + " init-args-num-cpus=2")
    output, _ = run.communicate(timeout=600)
    problem = [line for line in output.splitlines() if "fl-clusters: " in line]
    assert len(problem) == 1, output
    assert "init-args-num-cpus" in problem[0] and "ray start --num-cpus" in problem[0]
    assert "Traceback" not in output


def test_ray_cluster_file_left_behind_does_not_hang_flwr_run(fresh_checkout) -> None:
    """A stopped cluster's ``ray_current_cluster`` file in Ray's temp folder: a run that
    names no cluster ignores it and starts its own Ray on loopback."""
    app, _, env = fresh_checkout
    stale = Path(tempfile.mkdtemp(prefix="flc-stale-"))
    try:
        (stale / "ray").mkdir()
        # Nothing listens on port 1: joining it would wait until Ray gives up.
        (stale / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")
        env = {k: v for k, v in env.items()
               if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
        _, folder = finish(flwr_run(app, {**env, "RAY_TMPDIR": str(stale)}, None))
        assert json.loads((folder / "summary.json").read_text())["ari"] == 1.0
        # The run's own Ray wrote its session under that folder, on 127.0.0.1.
        raylets = list((stale / "ray").glob("session_*/logs/raylet.out"))
        assert raylets, "the run's Ray kept no session in RAY_TMPDIR"
        text = raylets[0].read_text(errors="replace")
        assert set(re.findall(r"node:(\d+\.\d+\.\d+\.\d+)", text)) == {"127.0.0.1"}
    finally:
        shutil.rmtree(stale, ignore_errors=True)
