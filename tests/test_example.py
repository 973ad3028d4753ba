"""examples/clustered-quickstart: the plug-in path, in simulation and deployed.

The example is a plain Flower app whose ServerApp swaps FedAvg for IFCA and whose
ClientApp calls ``register_handlers``. On its two conflicting client groups IFCA
must find the groups and beat FedAvg clearly.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import SharedRay

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "clustered-quickstart"
sys.path.insert(0, str(EXAMPLE))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clustered_quickstart.task import DEFAULTS, load_partition, settings  # noqa: E402
from test_deploy import (  # noqa: E402
    Deployment,
    deployments,
    free_port,
    pid_alive,
    report_timings,
    script,
)

SIM_CLIENTS = 6


def test_pyproject_config_matches_code_defaults() -> None:
    """run_simulation passes no run config, so the code's defaults must equal pyproject's."""
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert config["tool"]["flwr"]["app"]["config"] == DEFAULTS
    assert config["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "clustered_quickstart.server_app:app",
        "clientapp": "clustered_quickstart.client_app:app",
    }


def test_pyproject_has_no_federations_table() -> None:
    """The example runs on a deployment it is pointed at (a named SuperLink
    connection), so it declares no federation: `flwr run` 1.41 would move such a
    table to ~/.flwr and comment it out in place. fl-clusters itself declares its
    local federations (tests/test_first_run.py)."""
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    assert "federations" not in config["tool"]["flwr"]


def test_settings_reject_unknown_keys_and_strategies() -> None:
    with pytest.raises(ValueError, match="unknown run-config keys"):
        settings({"no-such-key": 1})
    with pytest.raises(ValueError, match="'strategy' is 'cfl'"):
        settings({}, {"strategy": "cfl"})


def test_groups_share_inputs_distribution_but_conflict_on_labels() -> None:
    """Group 1 labels are group 0's shifted by one class: no label ever agrees."""
    train0, _ = load_partition(0, 4, 400, 0)
    train1, _ = load_partition(1, 4, 400, 0)
    x0, y0 = train0.tensors
    assert len(train0) == 320
    # The same teacher, shifted: relabel group 1's inputs with group 0's rule.
    teacher = np.random.default_rng(0).normal(size=(x0.shape[1], 4))
    x1, y1 = train1.tensors
    assert np.array_equal(((x1.numpy() @ teacher).argmax(axis=1) + 1) % 4, y1.numpy())
    assert np.array_equal((x0.numpy() @ teacher).argmax(axis=1), y0.numpy())


def simulate(strategy: str, results_dir: Path, overrides: Mapping[str, Any] | None = None) -> dict:
    """Run the example with ``run_simulation`` and return its summary.json."""
    from clustered_quickstart.client_app import build_client_app
    from clustered_quickstart.server_app import build_server_app
    from flwr.simulation import run_simulation

    config = {"strategy": strategy, "results-dir": str(results_dir),
              "min-nodes": SIM_CLIENTS, **(overrides or {})}
    run_simulation(
        server_app=build_server_app(config),
        client_app=build_client_app(config),
        num_supernodes=SIM_CLIENTS,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    summaries = list(results_dir.glob("*/summary.json"))
    assert len(summaries) == 1, f"no summary.json under {results_dir}"
    return json.loads(summaries[0].read_text())


@pytest.fixture
def example_on_pythonpath(monkeypatch: pytest.MonkeyPatch, shared_ray: SharedRay) -> None:
    """Ray's worker processes import the example too: give them its folder."""
    paths = [str(EXAMPLE), str(EXAMPLE.parent.parent)]
    current = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + ([current] if current else [])))
    shared_ray.open()


def test_ifca_finds_the_groups_and_beats_fedavg(tmp_path: Path, example_on_pythonpath) -> None:
    fedavg = simulate("fedavg", tmp_path / "fedavg")
    ifca = simulate("ifca", tmp_path / "ifca")

    assert fedavg["num_models"] == 1
    assert fedavg["num_clients"] == ifca["num_clients"] == SIM_CLIENTS
    assert ifca["num_models"] == 2
    assert ifca["groups_recovered"], ifca["per_client"]
    assert ifca["accuracy"] >= 0.85, ifca
    # One model for two conflicting labelings cannot do much better than half right.
    assert fedavg["accuracy"] <= 0.7, fedavg
    assert ifca["accuracy"] - fedavg["accuracy"] >= 0.2


@pytest.fixture
def deployment_factory(tmp_path: Path) -> Iterator[Callable[[int], Deployment]]:
    """Loopback deployments (deploy/ scripts) that are stopped at teardown."""
    with deployments(tmp_path) as make:
        yield make


@pytest.mark.slow
def test_example_runs_on_a_secure_loopback_deployment(tmp_path: Path,
                                                      deployment_factory) -> None:
    """The same example, submitted with ``flwr run`` to 1 SuperLink + 4 SuperNodes."""
    deployment: Deployment = deployment_factory(4)
    result = deployment.start(
        "--app", str(EXAMPLE), "--loader", "clustered_quickstart.client_app:make_learner",
    )
    assert result.returncode == 0, result.stdout + result.stderr + deployment.log_tails()
    recorded = deployment.recorded_pids()
    results_dir = tmp_path / "results"
    summary = deployment.run(
        EXAMPLE,
        f"strategy='ifca' min-nodes=4 num-rounds=4 results-dir='{results_dir}'",
        results_dir,
    )
    assert summary["num_clients"] == 4
    assert summary["groups_recovered"], summary["per_client"]
    assert summary["accuracy"] >= 0.85, summary
    gone = deployment.stop()
    assert set(recorded.values()) <= set(gone)
    assert not [pid for pid in gone if pid_alive(pid)]
    report_timings("example IFCA on secure loopback (4 nodes, 4 rounds)", deployment.timings)


def test_example_start_up_check_rejects_a_bad_partition(tmp_path: Path) -> None:
    """The example's loader plugs into the same start-up check."""
    result = script(
        "start-node.sh", "--state-dir", str(tmp_path), "--partition-id", "4",
        "--num-partitions", "4", "--app", str(EXAMPLE),
        "--loader", "clustered_quickstart.client_app:make_learner",
        "--port", str(free_port()),
    )
    assert result.returncode != 0
    assert "'partition-id'=4 is outside [0, 3]" in result.stderr
    assert not list(tmp_path.glob("pids/*.pid"))
