"""Shared fixtures and fakes.

A real Flower simulation (Ray backend) and its summary, on one Ray session and one
pool of ClientApp actors kept for the whole test session (as a sweep keeps them), a
fresh checkout for `flwr run`, the run identity Flower gives an app process, and
the grid stand-ins and hand-made models that drive a strategy's glue without Ray.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.simulation import run_simulation
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import protocol as p
from fl_clusters.client_app import build_client_app
from fl_clusters.ray_env import (
    RAY_ADDRESS_ENV,
    RAY_LOOPBACK_ENV,
    start_own_ray_unless_a_cluster_is_named,
)
from fl_clusters.ray_pool import actors_kept_between_runs
from fl_clusters.server_app import build_server_app
from fl_clusters.sweep.simulation import RaySession

Federation = Callable[..., dict[str, Any]]
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


# Test modules that use what a machine has one of: the local SuperLink on
# 127.0.0.1:39091 (`flwr run`), a Ray cluster started with `ray start` (its
# ray_current_cluster file), loopback deployments sized for the machine's cores.
MACHINE_MODULES = {"test_deploy", "test_example", "test_first_run", "test_ray_cluster"}
# Ray in this process starts its own session on loopback, as the app's does: under
# pytest-xdist a plain ``ray.init()`` would join a cluster that another worker's
# test started with `ray start`.
start_own_ray_unless_a_cluster_is_named()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of the machine's one SuperLink, Ray cluster and deployments in one
    xdist group, so that ``--dist loadgroup`` runs them one after another.

    First among the hooks: pytest-xdist reads the groups in its own.
    """
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module in MACHINE_MODULES or "fresh_checkout" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("machine"))


def stop_local_superlink() -> None:
    """Stop the local SuperLink `flwr run` leaves running (deploy/stop-local-superlink.sh)."""
    subprocess.run([str(ROOT / "deploy" / "stop-local-superlink.sh"), "--quiet"], check=False)



def worker_import_paths() -> set[str]:
    """Where Ray's workers started now would import from: ``sys.path`` and ``PYTHONPATH``."""
    return {*sys.path, *os.environ.get("PYTHONPATH", "").split(os.pathsep)} - {""}


class SharedRay:
    """One Ray session and one pool of ClientApp actors for many simulations in this process.

    Starting Ray and its actors (each imports torch, Flower and the ClientApp) costs
    a federation of the test suite more than its rounds. Ray's workers read their
    import path once, when Ray starts, so a test that adds a folder its ClientApp
    is imported from (an example's) gets a session started anew. Tests that need
    Ray not running in this process (a sweep starts its own; `flwr run` and the
    deployments run on a machine with no other Ray) close it first.
    """

    def __init__(self) -> None:
        self._session: contextlib.ExitStack | None = None
        self._paths: set[str] = set()

    def open(self) -> None:
        """Have Ray running for the next simulation, with workers that see today's path."""
        if self._session is not None and worker_import_paths() <= self._paths:
            return
        self.close()
        session = contextlib.ExitStack()
        session.enter_context(RaySession())
        session.enter_context(actors_kept_between_runs())
        self._session, self._paths = session, worker_import_paths()

    def close(self) -> None:
        """End the actors and Ray, if running."""
        if self._session is not None:
            self._session.close()
            self._session = None


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[SharedRay]:
    """The test session's Ray (started on first use, see :class:`SharedRay`)."""
    shared = SharedRay()
    yield shared
    shared.close()


@pytest.fixture
def ray_session(shared_ray: SharedRay) -> None:
    """The shared Ray running, for a test that calls ``run_simulation`` itself."""
    shared_ray.open()


@pytest.fixture
def no_ray_in_this_process(shared_ray: SharedRay) -> None:
    """Ray not running in this process when the test starts (it starts its own)."""
    shared_ray.close()


def federation_in(folder: Path, shared_ray: SharedRay) -> Federation:
    """A function that runs one simulated federation under ``folder``; its summary.json.

    The returned dict also holds ``_folder``, the results folder of the run.
    """

    def run(
        overrides: Mapping[str, Any],
        num_clients: int = 20,
        client_app: ClientApp | None = None,
    ) -> dict[str, Any]:
        results = folder / f"run{len(list(folder.iterdir()))}"
        settings = {"results-dir": str(results), "min-nodes": num_clients, **overrides}
        shared_ray.open()
        run_simulation(
            server_app=build_server_app(settings),
            client_app=client_app or build_client_app(settings),
            num_supernodes=num_clients,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        folders = list(results.glob("*")) if results.exists() else []
        assert len(folders) == 1, f"the run wrote no results folder under {results}"
        summary = json.loads((folders[0] / "summary.json").read_text())
        summary["_folder"] = folders[0]
        return summary

    return run


@pytest.fixture
def federation(tmp_path: Path, shared_ray: SharedRay) -> Federation:
    """Return a function that runs one simulated federation and returns summary.json.

    The returned dict also holds ``_folder``, the results folder of the run.
    """
    return federation_in(tmp_path, shared_ray)


def load_script(path: Path) -> ModuleType:
    """The script ``path`` (a docs/ generator, a benchmark) as a module, registered under
    its file's stem: dataclasses look their module up by name."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def copy_app(source: Path, destination: Path) -> Path:
    """Copy the files git lists in ``source`` (what a clean clone holds) to ``destination``.

    `flwr run` 1.41 moves an app's ``[tool.flwr.federations]`` table to the Flower
    config and comments it out in the app's pyproject.toml: tests run `flwr run`
    on such a copy, never on the checkout.
    """
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "."], cwd=source, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, files):
        if (source / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            (destination / name).write_bytes((source / name).read_bytes())
    return destination


@pytest.fixture
def fresh_checkout(
    tmp_path: Path, no_ray_in_this_process: None
) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A copy of the checkout's files (what a clean clone holds) and an empty home.

    `flwr run` rewrites the app's pyproject.toml on its first run (it moves the
    federations table to the Flower config), so it runs on a copy, never on the
    checkout itself. The local SuperLink `flwr run` starts is stopped before
    (one left by an earlier run has another home) and after.
    """
    app = copy_app(ROOT, tmp_path / "app")
    home = tmp_path / "home"
    home.mkdir()
    # As a user's shell has them: no Flower home, no Ray settings (set above).
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLWR_HOME", RAY_ADDRESS_ENV, RAY_LOOPBACK_ENV)}
    env.update(
        HOME=str(home),
        PATH=f"{VENV_BIN}{os.pathsep}{env['PATH']}",
        # The venv holds every dependency; Flower would otherwise install them
        # again into a runtime environment per run.
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
    )
    stop_local_superlink()
    yield app, home, env
    stop_local_superlink()


@pytest.fixture
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run identity Flower gives an app process; Message() needs it."""
    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


# ----------------------------------------------------------- grid stand-ins
class NodesOnly:
    """Just enough of a Grid for configure_train: a fixed list of nodes."""

    def __init__(self, nodes: list[int]) -> None:
        self.nodes = nodes

    def get_node_ids(self) -> list[int]:
        return self.nodes


class SilentNodes(NodesOnly):
    """NodesOnly whose nodes never answer a strategy-internal message."""

    def __init__(self, nodes: list[int]) -> None:
        super().__init__(nodes)
        self.placements: list[int] = []

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        self.placements += [m.metadata.dst_node_id for m in messages]
        return []


class StubGrid:
    """Just enough of a Grid for configure_* calls: fixed nodes, canned query replies."""

    def __init__(self, nodes: list[int], features: dict[int, list[float]] | None = None) -> None:
        self.nodes = nodes
        self.features = features or {}
        self._pushed: list[Message] = []  # pushed, reply not pulled yet
        self._ids = itertools.count()

    def get_node_ids(self) -> list[int]:
        return self.nodes

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        # What a grid does on push: give every message a new id (MeteredGrid pulls by id)
        # and keep it until its reply is pulled.
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            self._pushed.append(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        wanted = set(message_ids)
        pushed = [msg for msg in self._pushed if msg.metadata.message_id in wanted]
        self._pushed = [msg for msg in self._pushed if msg not in pushed]
        return self.send_and_receive(pushed) if pushed else []

    def send_and_receive(self, messages: Iterable[Message], **_: object) -> list[Message]:
        replies = []
        for msg in messages:
            if msg.metadata.message_type == p.QUERY_IDENTITY:
                # Keys in the reverse order of the ids: ordering must follow the keys.
                key = 1000 - msg.metadata.dst_node_id
                replies.append(Message(RecordDict({p.METRICS: MetricRecord(
                    {p.M_NODE_KEY: key})}), reply_to=msg))
                continue
            assert msg.metadata.message_type == p.QUERY_FEATURES
            metrics = MetricRecord(
                {
                    p.M_FEATURE_MEAN: self.features[msg.metadata.dst_node_id],
                    p.M_NUM_EXAMPLES: 10,
                }
            )
            replies.append(Message(RecordDict({p.METRICS: metrics}), reply_to=msg))
        return replies


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


class FailingGrid(TimedGrid):
    """Every node answers every query with an error."""

    def send_and_receive(  # type: ignore[override]
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        self.timeouts.append(timeout)
        return [Message(Error(code=0, reason="simulated crash"), reply_to=m) for m in messages]


# ------------------------------------------------------------ hand-made models
# The 3x4 linear model the CFL glue tests start from.
START = p.numpy_to_record(
    ["layer.weight", "layer.bias"], [np.zeros((3, 4), np.float32), np.zeros(3, np.float32)]
)
# A body and a head layer: what IFCA's weight sharing and warm start tell apart.
TWO_LAYER_NAMES = ["body.weight", "head.weight"]


def two_layer_model(body: float, head: np.ndarray | float) -> ArrayRecord:
    """A body filled with ``body`` and a 4-value head ``head`` (broadcast)."""
    return p.numpy_to_record(
        TWO_LAYER_NAMES,
        [np.full((2, 3), body, np.float32), np.broadcast_to(head, (4,)).astype(np.float32)],
    )


def train_reply(
    request: Message, arrays: ArrayRecord, examples: int, cluster: int | None
) -> Message:
    """A node's train reply to ``request``: ``arrays``, its example count and cluster."""
    metrics = MetricRecord({p.M_NUM_EXAMPLES: examples, p.M_TRAIN_LOSS: 0.5})
    if cluster is not None:
        metrics[p.M_CLUSTER] = cluster
    return Message(RecordDict({p.ARRAYS: arrays, p.METRICS: metrics}), reply_to=request)


def dead_pid() -> int:
    """The process id of a process that has exited and been reaped."""
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return child
