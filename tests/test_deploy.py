"""The deploy/ scripts: certificates, node keys, start-up checks, a real loopback run.

The slow test starts a real SuperLink and SuperNodes (TLS, SuperNode
authentication) on random loopback ports, submits an IFCA run with ``flwr run``
and stops everything again. :class:`Deployment` is reused by tests/test_example.py.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
# Flower's commands of the environment that runs the tests.
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(DEPLOY))

from check_node import NodeCheckError, validate_partition  # noqa: E402

from tests.conftest import copy_app  # noqa: E402

# Seconds the slow tests allow each step; generous for 2-core CI machines.
START_TIMEOUT = 240
RUN_TIMEOUT = 900


def free_port() -> int:
    """A random high loopback port that nothing listens on right now."""
    for _ in range(200):
        port = random.randint(20_000, 60_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found")


def free_port_block(size: int) -> int:
    """First of ``size`` consecutive free ports (SuperNode i listens on base + i)."""
    for _ in range(200):
        base = free_port()
        if base + size > 65_000:
            continue
        ok = True
        for port in range(base, base + size):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no block of {size} free ports found")


def script(name: str, *args: str, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess:
    """Run a deploy/ script and return its result (never raises on failure)."""
    return subprocess.run(
        ["bash", str(DEPLOY / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def pid_alive(pid: int) -> bool:
    """True for a live process; a zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def json_in(stdout: str) -> dict | None:
    """The JSON a ``flwr ... --format json`` printed after whatever Flower printed first
    (a config migration notice); None when it printed none."""
    return json.loads(stdout[stdout.index("{"):]) if "{" in stdout else None


class Deployment:
    """One loopback deployment driven through the deploy/ scripts.

    Parameters
    ----------
    state_dir : Path
        The deployment's state directory (certificates, keys, PIDs, logs).
    nodes : int
        SuperNodes to start.
    """

    def __init__(self, state_dir: Path, nodes: int) -> None:
        self.state_dir = state_dir
        self.nodes = nodes
        self.port = free_port()  # the Fleet gateway's: what SuperNodes connect to
        self.control_port = free_port()  # the SuperLink's own, on loopback
        self.node_port_base = free_port_block(nodes + 1)
        self.timings: dict[str, float] = {}

    def start(self, *extra: str) -> subprocess.CompletedProcess:
        """deploy/start.sh with this deployment's ports and state directory."""
        began = time.monotonic()
        result = script(
            "start.sh", "--nodes", str(self.nodes), "--state-dir", str(self.state_dir),
            "--port", str(self.port), "--control-port", str(self.control_port),
            "--node-port-base", str(self.node_port_base), *extra,
        )
        self.timings["start"] = time.monotonic() - began
        return result

    def recorded_pids(self) -> dict[str, int]:
        """Name -> PID of every process the scripts recorded."""
        return {
            f.stem: int(f.read_text().strip())
            for f in sorted((self.state_dir / "pids").glob("*.pid"))
        }

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """The flwr CLI with the deployment's private Flower config."""
        return script("flwr.sh", "--state-dir", str(self.state_dir), *args, timeout=timeout)

    def online_nodes(self) -> list[dict]:
        """``flwr supernode ls`` as JSON: the nodes the SuperLink knows."""
        result = self.flwr("supernode", "ls", "fl-clusters", "--format", "json")
        assert result.returncode == 0, result.stdout + result.stderr
        return json_in(result.stdout)["nodes"]  # type: ignore[index]

    def failed_runs(self) -> str:
        """The status details of this SuperLink's failed runs ("" when none failed)."""
        listed = json_in(self.flwr("ls", "fl-clusters", "--format", "json").stdout)
        if listed is None:
            return "flwr ls printed no JSON"
        return "; ".join(run["status-details"] for run in listed["runs"]
                         if run["status"] == "finished:failed")

    def run(self, app: Path, run_config: str, results_dir: Path) -> dict:
        """Submit ``app`` with ``flwr run``, wait for it, return its summary.json."""
        began = time.monotonic()
        app = copy_app(app, self.state_dir / f"app-{app.name}")
        result = self.flwr(
            "run", str(app), "fl-clusters", "--stream", "--run-config", run_config,
            timeout=RUN_TIMEOUT,
        )
        deadline = time.monotonic() + 60
        summaries: list[Path] = []
        while time.monotonic() < deadline:
            summaries = sorted(results_dir.glob("*/summary.json"))
            if summaries:
                break
            time.sleep(0.5)
        self.timings["run"] = time.monotonic() - began
        assert len(summaries) == 1, (
            f"no summary.json under {results_dir}; flwr run exited {result.returncode}; "
            f"failed runs: {self.failed_runs()!r}\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-2000:]}\n{self.log_tails()}"
        )
        assert "results: " in result.stdout, result.stdout[-2000:]
        return json.loads(summaries[0].read_text())

    def stop(self) -> list[int]:
        """deploy/stop.sh; returns every PID (recorded or descendant) that must be gone."""
        pids = list(self.recorded_pids().values())
        everything = pids + [d for pid in pids if pid_alive(pid) for d in descendants(pid)]
        began = time.monotonic()
        result = script("stop.sh", "--state-dir", str(self.state_dir), timeout=120)
        self.timings["stop"] = time.monotonic() - began
        assert result.returncode == 0, result.stdout + result.stderr
        return everything

    def log_tails(self, lines: int = 30) -> str:
        """The end of every log, for assertion messages."""
        out = []
        for log in sorted((self.state_dir / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name} ---\n" + "\n".join(tail))
        return "\n".join(out)


@contextlib.contextmanager
def deployments(root: Path) -> Iterator[Callable[[int], Deployment]]:
    """Build :class:`Deployment` objects under ``root``; stop every one on exit.

    The stop runs even when the test failed, and checks that nothing it had
    started (or their descendants) outlives it.
    """
    made: list[Deployment] = []

    def make(nodes: int) -> Deployment:
        deployment = Deployment(root / f"state{len(made)}", nodes)
        made.append(deployment)
        return deployment

    try:
        yield make
    finally:
        for deployment in made:
            if list((deployment.state_dir / "pids").glob("*.pid")):
                gone = deployment.stop()
                assert not [pid for pid in gone if pid_alive(pid)]


@pytest.fixture
def deployment_factory(tmp_path: Path) -> Iterator[Callable[[int], Deployment]]:
    """Make loopback deployments that are stopped at teardown."""
    with deployments(tmp_path) as make:
        yield make


def report_timings(name: str, timings: dict[str, float]) -> None:
    """Print the measured phases (visible with ``pytest -s``; kept in the report)."""
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    print(f"\n[timing] {name}: {phases}")


# ---------------------------------------------------------------- fast tests
def test_make_certs_names_every_host(tmp_path: Path) -> None:
    result = script("make-certs.sh", str(tmp_path), "node.example.org", "10.1.2.3")
    assert result.returncode == 0, result.stderr
    for name in ("ca.crt", "ca.key", "server.pem", "server.key"):
        assert (tmp_path / name).is_file()
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0, "key readable by others"
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "server.pem"), "-noout", "-text"],
        capture_output=True, text=True, check=True,
    ).stdout
    for san in ("DNS:node.example.org", "IP Address:10.1.2.3", "IP Address:127.0.0.1",
                "DNS:localhost"):
        assert san in text
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "server.pem")],
        capture_output=True, text=True,
    )
    assert verify.returncode == 0, verify.stderr
    # A second call keeps the existing CA (nodes already trust it).
    before = (tmp_path / "ca.crt").read_bytes()
    assert script("make-certs.sh", str(tmp_path), "localhost").returncode == 0
    assert (tmp_path / "ca.crt").read_bytes() == before


def test_make_node_keys_are_flower_ecdsa_keys(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    assert script("make-node-keys.sh", str(tmp_path), "2").returncode == 0
    for i in range(2):
        private = load_ssh_private_key((tmp_path / f"node-{i}").read_bytes(), None)
        public = load_ssh_public_key((tmp_path / f"node-{i}.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert private.public_key().public_numbers() == public.public_numbers()
    first = (tmp_path / "node-0").read_bytes()
    assert script("make-node-keys.sh", str(tmp_path), "3").returncode == 0
    assert (tmp_path / "node-0").read_bytes() == first, "existing keys must be kept"
    assert (tmp_path / "node-2.pub").is_file()
    assert script("make-node-keys.sh", str(tmp_path), "zero").returncode != 0


@pytest.mark.parametrize(
    ("partition_id", "num_partitions", "message"),
    [
        (3, 3, "'partition-id'=3 is outside [0, 2]"),
        (-1, 3, "'partition-id'=-1 is outside [0, 2]"),
        ("x", 3, "must both be integers"),
        (0, 0, "'num-partitions'=0 must be at least 1"),
    ],
)
def test_validate_partition_rejects(partition_id: object, num_partitions: object,
                                    message: str) -> None:
    with pytest.raises(NodeCheckError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_partition(partition_id, num_partitions)


def test_bad_partition_id_fails_at_start_up(tmp_path: Path) -> None:
    """start-node.sh refuses a wrong partition id before any process starts."""
    result = script(
        "start-node.sh", "--state-dir", str(tmp_path), "--partition-id", "5",
        "--num-partitions", "3", "--insecure", "--port", str(free_port()),
    )
    assert result.returncode != 0
    assert "node config 'partition-id=5 num-partitions=3' cannot start" in result.stderr
    assert "'partition-id'=5 is outside [0, 2]" in result.stderr
    assert "not started" in result.stderr
    assert not list(tmp_path.glob("pids/*.pid")), "a SuperNode was started anyway"


def test_partition_without_data_fails_at_start_up(tmp_path: Path) -> None:
    """More partitions than the data set can fill: the node has no data, so no start."""
    result = script(
        "start-node.sh", "--state-dir", str(tmp_path), "--partition-id", "1999",
        "--num-partitions", "2000", "--insecure", "--port", str(free_port()),
    )
    assert result.returncode != 0
    assert ("node config 'partition-id=1999 num-partitions=2000' cannot start: "
            "loading its data failed") in result.stderr
    assert not list(tmp_path.glob("pids/*.pid"))


def test_missing_data_fails_at_start_up_and_starts_nothing(tmp_path: Path) -> None:
    """start.sh checks every partition first; a data set that is absent starts nothing."""
    deployment = Deployment(tmp_path, nodes=2)
    result = deployment.start(
        "--insecure",
        "--run-config", f"dataset='fashion-mnist' data-root='{tmp_path / 'no-such-dir'}'",
    )
    assert result.returncode != 0
    assert "cannot start: loading its data failed" in result.stderr
    assert "nothing started" in result.stderr
    assert not list(tmp_path.glob("pids/*.pid"))


def test_unknown_run_config_key_fails_at_start_up(tmp_path: Path) -> None:
    result = script(
        "start-node.sh", "--state-dir", str(tmp_path), "--partition-id", "0",
        "--num-partitions", "2", "--run-config", "no-such-key=1",
    )
    assert result.returncode != 0
    assert "no-such-key" in result.stderr


def test_a_supernode_that_does_not_connect_is_stopped_with_the_reason(tmp_path: Path) -> None:
    """start-node.sh gives up on a SuperLink address nothing listens on, and stops the
    SuperNode it started (it would otherwise retry in the background)."""
    address = f"127.0.0.1:{free_port()}"
    result = script(
        "start-node.sh", "--state-dir", str(tmp_path), "--partition-id", "0",
        "--num-partitions", "1", "--insecure", "--superlink", address,
        "--port", str(free_port()), "--skip-check", "--connect-timeout", "5",
    )
    assert result.returncode != 0
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"did not connect to {address}: nothing accepted a connection at {address}" in line
    pid = int(line.split("(PID ")[1].split(",")[0])
    assert not pid_alive(pid), "the SuperNode outlived start-node.sh"
    assert not list(tmp_path.glob("pids/*.pid"))


def test_stop_without_deployment_is_a_no_op(tmp_path: Path) -> None:
    result = script("stop.sh", "--state-dir", str(tmp_path))
    assert result.returncode == 0
    assert "nothing to stop" in result.stdout


def stop_local_superlink(port: int) -> subprocess.CompletedProcess:
    """deploy/stop-local-superlink.sh, pointed at ``port`` instead of 39091."""
    return subprocess.run(
        ["bash", str(DEPLOY / "stop-local-superlink.sh")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port)},
    )


def wait_listening(process: subprocess.Popen, port: int, timeout: float = START_TIMEOUT) -> None:
    """Wait until ``process`` accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode} before listening"
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


def test_stop_local_superlink_stops_a_simulation_superlink_by_pid(tmp_path: Path) -> None:
    """What `make run` does before and after `flwr run`: that SuperLink and its children go."""
    port = free_port()
    assert "no local SuperLink" in stop_local_superlink(port).stdout
    superlink = subprocess.Popen(
        [str(VENV_BIN / "flower-superlink"), "--insecure", "--simulation",
         "--host", "127.0.0.1", "--port", str(port), "--database", ":flwr-in-memory:"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        # Its SuperExec child is found on PATH.
        env={**os.environ, "FLWR_HOME": str(tmp_path),
             "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    try:
        wait_listening(superlink, port)
        tree = [superlink.pid, *descendants(superlink.pid)]
        result = stop_local_superlink(port)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"stopping local-superlink (PID {superlink.pid})" in result.stdout
        superlink.wait(timeout=30)
        assert not [pid for pid in tree if pid_alive(pid)]
    finally:
        if superlink.poll() is None:
            superlink.kill()


def test_stop_local_superlink_leaves_other_listeners_alone() -> None:
    port = free_port()
    other = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(other, port)
        result = stop_local_superlink(port)
        assert result.returncode != 0
        assert f"port {port} belongs to PID {other.pid}" in result.stderr
        assert "not a local simulation SuperLink; not touching it" in result.stderr
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------- slow tests
@pytest.mark.slow
def test_secure_loopback_deployment_runs_ifca(tmp_path: Path, deployment_factory) -> None:
    """TLS + SuperNode auth: 1 SuperLink, 3 SuperNodes, IFCA via ``flwr run``, clean stop.

    A fourth SuperNode whose key was never registered must be refused, and the
    run must see the three registered nodes only.
    """
    deployment: Deployment = deployment_factory(3)
    # The start-up check loads the partitions with the data keys of the run below.
    result = deployment.start("--run-config", "num-clusters=2")
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log_tails()
    recorded = deployment.recorded_pids()
    assert set(recorded) == {"superlink", "gateway", "supernode-0", "supernode-1",
                             "supernode-2"}
    assert all(pid_alive(pid) for pid in recorded.values())
    assert "WARNING" not in result.stderr, "secure start must not warn about --insecure"
    superlink_args = Path(f"/proc/{recorded['superlink']}/cmdline").read_text().split("\0")
    assert "--enable-supernode-auth" in superlink_args
    assert "--insecure" not in superlink_args
    assert "running on https://" in (deployment.state_dir / "logs/superlink.log").read_text()

    # A SuperNode with a valid key that is not on the allowed list.
    rogue_keys = tmp_path / "rogue-keys"
    assert script("make-node-keys.sh", str(rogue_keys), "1").returncode == 0
    rogue = script(
        "start-node.sh", "--state-dir", str(deployment.state_dir), "--name", "rogue",
        "--partition-id", "0", "--num-partitions", "3", "--key", str(rogue_keys / "node-0"),
        "--port", str(deployment.node_port_base + 3), "--skip-check",
    )
    assert rogue.returncode != 0
    rogue_log = (deployment.state_dir / "logs" / "rogue.log").read_text()
    assert "Failed to activate SuperNode" in rogue_log
    superlink_log = (deployment.state_dir / "logs" / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log
    # start-node.sh names the reason Flower's SuperNode does not give, and the fix.
    assert ('the SuperLink refused its key (its log: "No SuperNode found with the given '
            f'public key"); register {rogue_keys / "node-0"}.pub with '
            "deploy/register-nodes.sh") in rogue.stderr, rogue.stderr
    assert not (deployment.state_dir / "pids" / "rogue.pid").exists()
    # A SuperNode without TLS is told the SuperLink speaks TLS, and is not started.
    plain = script(
        "start-node.sh", "--state-dir", str(deployment.state_dir), "--name", "plain",
        "--partition-id", "0", "--num-partitions", "3", "--insecure",
        "--port", str(free_port()), "--skip-check",
    )
    assert plain.returncode != 0
    assert (f"plain not started: the SuperLink at 127.0.0.1:{deployment.port} speaks TLS; "
            "pass --root-certificates") in plain.stderr, plain.stderr
    assert not (deployment.state_dir / "pids" / "plain.pid").exists()
    nodes = deployment.online_nodes()
    assert len(nodes) == 3
    assert all(node["status"] == "online" for node in nodes)

    results_dir = tmp_path / "results"
    # One initialization: every extra one is a query round, and on loopback each
    # round starts a ClientApp process per node (this test is about deployment).
    summary = deployment.run(
        REPO,
        f"strategy='ifca' num-rounds=3 min-nodes=3 num-clusters=2 ifca-restarts=1 "
        f"results-dir='{results_dir}'",
        results_dir,
    )
    assert summary["strategy"] == "ifca"
    assert summary["num_clients"] == 3
    assert summary["num_cluster_models"] == 2
    assert summary["num_rounds"] == 3
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    assert len(summary["per_client_accuracy"]) == 3

    gone = deployment.stop()
    assert set(recorded.values()) <= set(gone)
    assert not [pid for pid in gone if pid_alive(pid)], "processes outlived deploy/stop.sh"
    assert not list((deployment.state_dir / "pids").glob("*.pid"))
    report_timings("secure loopback IFCA (3 nodes, 3 rounds)", deployment.timings)


@pytest.mark.slow
def test_insecure_deployment_warns_and_refuses_a_second_start(
    tmp_path: Path, deployment_factory
) -> None:
    """``--insecure`` works when asked for, and says loudly what it gives up."""
    deployment: Deployment = deployment_factory(2)
    result = deployment.start("--insecure", "--skip-check")
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log_tails()
    assert "WARNING: starting the SuperLink with --insecure" in result.stderr
    assert "insecure = true" in (deployment.state_dir / "flwr-home/config.toml").read_text()
    assert len(deployment.online_nodes()) == 2
    # A second start on the same state directory refuses and leaves this one up.
    again = script("start.sh", "--state-dir", str(deployment.state_dir), "--insecure",
                   "--skip-check")
    assert again.returncode != 0
    assert "is running" in again.stderr
    assert all(pid_alive(pid) for pid in deployment.recorded_pids().values())
    gone = deployment.stop()
    assert not [pid for pid in gone if pid_alive(pid)]
    report_timings("insecure loopback start/stop (2 nodes)", deployment.timings)


def listening_addresses(pid: int) -> list[str]:
    """The local addresses the process ``pid`` listens on (TCP), from ``ss``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def outsider(tmp_path: Path, deployment: Deployment) -> dict[str, str]:
    """The environment of a host that has ``ca.crt`` and reaches the SuperNodes' port."""
    home = tmp_path / "outsider-home"
    home.mkdir()
    ca = tmp_path / "ca.crt"
    ca.write_bytes((deployment.state_dir / "certs/ca.crt").read_bytes())
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "target"\n\n[superlink.target]\n'
        f'address = "127.0.0.1:{deployment.port}"\nroot-certificates = "{ca}"\n'
    )
    return {**os.environ, "FLWR_HOME": str(home),
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}


def flwr_as(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "flwr"), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=env["FLWR_HOME"])


@pytest.mark.slow
def test_a_host_holding_only_ca_crt_can_neither_register_join_list_nor_submit(
    tmp_path: Path
) -> None:
    """docs/deploy.md's secured deployment, from a host with ``ca.crt`` and a key of its own.

    Its state folder has a space in its name (superlink.env is sourced by the node
    scripts), and a second SuperNode given an admitted node's key is told so.
    """
    with deployments(tmp_path / "state folder") as make:
        outsider_tries(tmp_path, make(2))


def outsider_tries(tmp_path: Path, deployment: Deployment) -> None:
    """Everything :func:`test_a_host_holding_only_ca_crt_...` tries on ``deployment``."""
    result = deployment.start("--run-config", "num-clusters=2")
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log_tails()
    pids = deployment.recorded_pids()
    # The SuperLink (Control, Runtime and Fleet API) is on loopback only; the one
    # port another host can reach is the gateway's.
    assert listening_addresses(pids["superlink"]) == [f"127.0.0.1:{deployment.control_port}"]
    assert listening_addresses(pids["gateway"]) == [f"127.0.0.1:{deployment.port}"]

    env = outsider(tmp_path, deployment)
    keys = tmp_path / "outsider-keys"
    assert script("make-node-keys.sh", str(keys), "1").returncode == 0
    # A copy: `flwr run` under a new FLWR_HOME rewrites the app's pyproject.toml first.
    app = copy_app(REPO, tmp_path / "outsider-app")
    attempts = {
        "register a key": ("supernode", "register", str(keys / "node-0.pub"), "target"),
        "list nodes": ("supernode", "ls", "target"),
        "list runs": ("ls", "target"),
        "submit a run": ("run", str(app), "target"),
    }
    for what, args in attempts.items():
        tried = flwr_as(env, *args)
        said = tried.stdout + tried.stderr
        assert tried.returncode != 0, f"{what}: {said}"
        assert "403 Forbidden" in said, f"{what}: {said}"

    # Joining with its own (unregistered) key through the gateway is refused too.
    joined = script(
        "start-node.sh", "--state-dir", str(deployment.state_dir), "--name", "outsider",
        "--partition-id", "0", "--num-partitions", "2", "--key", str(keys / "node-0"),
        "--root-certificates", str(tmp_path / "ca.crt"),
        "--port", str(deployment.node_port_base + 2), "--skip-check",
        "--connect-timeout", "30",
    )
    assert joined.returncode != 0
    assert "the SuperLink refused its key" in joined.stderr, joined.stderr
    # An admitted key on a second SuperNode is named as a key in use, not an unknown one.
    twin = script(
        "start-node.sh", "--state-dir", str(deployment.state_dir), "--name", "twin",
        "--partition-id", "1", "--num-partitions", "2",
        "--key", str(deployment.state_dir / "keys/node-0"),
        "--port", str(deployment.node_port_base + 2), "--skip-check", "--connect-timeout", "30",
    )
    assert twin.returncode != 0
    assert "its key is registered but already in use by a connected SuperNode" in twin.stderr, \
        twin.stderr
    # The operator, on the SuperLink's machine, still sees the two nodes it admitted
    # and no run.
    nodes = deployment.online_nodes()
    assert len(nodes) == 2
    assert all(node["status"] == "online" for node in nodes)
    listed = json_in(deployment.flwr("ls", "fl-clusters", "--format", "json").stdout)
    assert listed is not None and listed["runs"] == []


def stream_run(deployment: Deployment, run_config: str,
               *at_rounds: tuple[int, Callable[[], None]]) -> tuple[str, float]:
    """``flwr run --stream`` on the deployment; call each action when its round starts.

    Returns the streamed output and the seconds the run took.
    """
    env = {**os.environ, "FLWR_HOME": str(deployment.state_dir / "flwr-home"),
           "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    app = copy_app(REPO, deployment.state_dir / "app")
    began = time.monotonic()
    run = subprocess.Popen(
        [str(VENV_BIN / "flwr"), "run", str(app), "fl-clusters", "--stream",
         "--run-config", run_config],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=app,
    )
    output: list[str] = []
    waiting = dict(at_rounds)
    assert run.stdout is not None
    for line in run.stdout:
        output.append(line)
        for round_number in list(waiting):
            if f"[ROUND {round_number}/" in line:
                waiting.pop(round_number)()
        if time.monotonic() - began > RUN_TIMEOUT:
            run.kill()
            break
    run.wait(timeout=60)
    text = "".join(output)
    assert not waiting, f"rounds {sorted(waiting)} never started\n{text[-3000:]}"
    return text, time.monotonic() - began


def only_summary(results_dir: Path, text: str, deployment: Deployment) -> dict:
    """The run's one summary.json (its absence fails with the run's status and the logs)."""
    summaries = sorted(results_dir.glob("*/summary.json"))
    assert len(summaries) == 1, (f"failed runs: {deployment.failed_runs()!r}\n"
                                 + text[-4000:] + deployment.log_tails())
    return json.loads(summaries[0].read_text())


# What Flower's SuperLink writes in a run's status when it stops hearing from the
# ServerApp process: on a loaded 2-core machine (CI's other test worker busy) a run
# can end so, with `flwr run` exiting 0 (../shared/FLOWER_NOTES.md). Not the library's
# behaviour under test, so the scenario gets one more try on a fresh deployment.
FLOWER_HEARTBEAT_FAILURE = "No heartbeat received"


def kill_one_and_add_one(deployment: Deployment, results_dir: Path) -> tuple[str, float]:
    """Run IFCA on ``deployment``'s four nodes, SIGKILL one when round 2 starts and
    start a fifth when round 3 starts; the streamed output and the run's seconds."""
    victim = deployment.recorded_pids()["supernode-3"]
    # verbose: stream_run acts on Flower's "[ROUND n/" lines. The timeout is what
    # round 2 waits for the killed node; a shorter one cuts off the newcomer's first
    # replies (it installs the app and starts a ClientApp process) on a loaded machine.
    run_config = (f"strategy='ifca' num-rounds=4 min-nodes=3 num-clusters=2 verbose=true "
                  f"ifca-init='random' ifca-restarts=1 round-timeout=60.0 "
                  f"results-dir='{results_dir}'")

    def join() -> None:
        # Partition 4 of 5: the first four nodes hold partitions of 4, so the
        # newcomer's data are a real, different slice of the same data set.
        joined = script("start-node.sh", "--state-dir", str(deployment.state_dir),
                        "--partition-id", "4", "--num-partitions", "5", "--insecure",
                        "--skip-check", "--port", str(free_port()), "--name", "supernode-late")
        assert joined.returncode == 0, joined.stdout + joined.stderr

    return stream_run(deployment, run_config, (2, lambda: os.kill(victim, 9)), (3, join))


def killed_and_joined(tmp_path: Path, deployment_factory
                      ) -> tuple[dict, Path, Deployment, float]:
    """:func:`kill_one_and_add_one` on a fresh 4-node deployment, once more on another
    when Flower failed the first run for lack of ServerApp heartbeats; the summary,
    the results folder, the deployment and the run's seconds."""
    for attempt in (1, 2):
        deployment: Deployment = deployment_factory(4)
        result = deployment.start("--insecure", "--skip-check")
        assert result.returncode == 0, result.stdout + result.stderr + deployment.log_tails()
        results_dir = tmp_path / f"results-{attempt}"
        text, seconds = kill_one_and_add_one(deployment, results_dir)
        if attempt == 2 or list(results_dir.glob("*/summary.json")):
            break
        failure = deployment.failed_runs()
        if FLOWER_HEARTBEAT_FAILURE not in failure:
            break
        print(f"attempt 1: Flower failed the run ({failure}); a fresh deployment tries again")
        deployment.stop()
    return only_summary(results_dir, text, deployment), results_dir, deployment, seconds


@pytest.mark.slow
def test_a_supernode_killed_in_round_2_and_one_joining_in_round_3(
    tmp_path: Path, deployment_factory
) -> None:
    """Four SuperNodes; one is killed (SIGKILL) when round 2 starts, and a fifth starts
    when round 3 begins. The run goes on with the other three within the round
    timeout and lists the lost node; the newcomer is trained and evaluated in round
    4, gets a cluster by IFCA's rule (loss) and is reported as late. One deployment
    and one run for both events: on loopback every message starts a ClientApp
    process per node, so each run costs minutes on 2 cores."""
    summary, results_dir, deployment, seconds = killed_and_joined(tmp_path, deployment_factory)
    assert summary["num_rounds"] == 4
    # The three that stayed and the newcomer report; the killed node does not.
    assert summary["num_clients"] == 4, summary
    assert len(summary["lost_nodes"]) == 1, summary
    # The killed node's round-2 message: no reply within the round timeout, or the
    # SuperLink's error reply once it has missed the node's heartbeats.
    assert summary["unanswered_messages"] + summary["rejected_replies"] >= 1, summary
    assert len(summary["late_nodes"]) == 1, summary
    assert set(summary["lost_nodes"]).isdisjoint(summary["late_nodes"]), summary
    with next(results_dir.glob("*/assignments.csv")).open() as table:
        rows = list(csv.DictReader(table))
    late = [row for row in rows if row["late"] == "1"]
    assert len(late) == 1, rows
    row = late[0]
    assert int(row["node_id"]) == summary["late_nodes"][0]
    # A SuperNode runs no Ray: placement says so.
    assert row["ray_node"] == "none" and row["device"] == "cpu", row
    # Evaluated with a cluster in the last round.
    assert row["assigned_cluster"] in {"0", "1"}, row
    assert 0.0 <= float(row["personal_accuracy"]) <= 1.0, row
    report_timings("kill one of 4 SuperNodes in round 2, a 5th joins in round 3 (4 rounds)",
                   {**deployment.timings, "run": seconds})
