"""Shared fixtures: run a real Flower simulation (Ray backend) and read its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from flwr.clientapp import ClientApp
from flwr.simulation import run_simulation

from fl_clusters.client_app import build_client_app
from fl_clusters.server_app import build_server_app

Federation = Callable[..., dict[str, Any]]
ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def stop_local_superlink() -> None:
    """Stop the local SuperLink `flwr run` leaves running (deploy/stop-local-superlink.sh)."""
    subprocess.run([str(ROOT / "deploy" / "stop-local-superlink.sh"), "--quiet"], check=False)




@pytest.fixture
def federation(tmp_path: Path) -> Federation:
    """Return a function that runs one simulated federation and returns summary.json.

    The returned dict also holds ``_folder``, the results folder of the run.
    """

    def run(
        overrides: Mapping[str, Any],
        num_clients: int = 20,
        client_app: ClientApp | None = None,
    ) -> dict[str, Any]:
        results = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        settings = {"results-dir": str(results), "min-nodes": num_clients, **overrides}
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
def fresh_checkout(tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """A copy of the checkout's files (what a clean clone holds) and an empty home.

    `flwr run` rewrites the app's pyproject.toml on its first run (it moves the
    federations table to the Flower config), so it runs on a copy, never on the
    checkout itself. The local SuperLink `flwr run` starts is stopped before
    (one left by an earlier run has another home) and after.
    """
    app = copy_app(ROOT, tmp_path / "app")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
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
