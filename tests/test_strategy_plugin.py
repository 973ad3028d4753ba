"""A strategy in its own package: entry points, the listing command, the public checks.

The slow tests install examples/strategy-plugin (FedGroup) into a temporary folder
with pip, offline, and run everything with that folder on PYTHONPATH in
subprocesses, so the plug-in never enters this venv: ``fl-clusters strategies``
lists it, its own test file passes fl_clusters.testing's checks, ``flwr run``
and a sweep run it by name. The fast tests feed the registry broken entry points
and use fl_clusters.testing and the listing command on strategies defined here.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from flwr.supercore.task_identity import TaskIdentity

from fl_clusters import cli, server_app
from fl_clusters.config import parse_run_config
from fl_clusters.errors import ConfigurationError
from fl_clusters.strategies import IFCA
from fl_clusters.strategies.kit import ClusteredStrategy, HardClusteredStrategy, Param
from fl_clusters.strategies.kit import registry as strategy_registry
from fl_clusters.testing import (
    CHECK_NAMES,
    check_strategy,
    in_process_server,
    loopback_run,
    parametrize_with_checks,
)
from tests.conftest import ROOT, VENV_BIN

EXAMPLE = ROOT / "examples" / "strategy-plugin"
PLUGIN, DISTRIBUTION = "fedgroup", "fl-clusters-fedgroup"
FAKE_MODULE = "fake_strategy_plugin"


# ------------------------------------------------------------- broken plug-ins
class NotAStrategy:
    """What an entry point may wrongly name: a class that is no strategy."""


@pytest.fixture
def registry_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry and its broken plug-ins as they were, after the test."""
    monkeypatch.setattr(ClusteredStrategy, "registry", dict(ClusteredStrategy.registry))
    broken = dict(strategy_registry.broken_plugins)
    yield
    strategy_registry.broken_plugins.clear()
    strategy_registry.broken_plugins.update(broken)


def _misnamed() -> type:
    """A strategy whose ``name`` is not the name its entry point gives."""

    class Misnamed(HardClusteredStrategy):
        """Registers as ``misnamed-class``."""

        name = "misnamed-class"
        paper = "a test's strategy"

    return Misnamed


def _load(monkeypatch: pytest.MonkeyPatch, *entries: EntryPoint) -> None:
    """Load ``entries`` as the registry loads installed packages' entry points."""
    module = types.ModuleType(FAKE_MODULE)
    module.NotAStrategy = NotAStrategy  # type: ignore[attr-defined]
    module.Misnamed = _misnamed()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE_MODULE, module)
    monkeypatch.setattr(strategy_registry, "entry_points", lambda group: list(entries))
    strategy_registry._load_plugins()


BROKEN = {
    "missing-module": ("no_such_package.strategy:Thing",
                       "does not import: ModuleNotFoundError", "fix or uninstall the package"),
    "not-a-strategy": (f"{FAKE_MODULE}:NotAStrategy", "not a subclass of "
                       "fl_clusters.strategies.kit.ClusteredStrategy",
                       "point it at a strategy class (module:Class)"),
    "misnamed": (f"{FAKE_MODULE}:Misnamed", "the class's name is 'misnamed-class'",
                 "the entry point's name must be the class's `name` attribute"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_entry_point_is_named_logged_and_explained_when_asked_for(
    registry_kept: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    name: str,
) -> None:
    value, problem, fix = BROKEN[name]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _load(monkeypatch, EntryPoint(name, value, strategy_registry.ENTRY_POINT_GROUP))
    reason = strategy_registry.broken_plugins[name]
    for part in (f"entry point {name!r} = {value!r}", "'fl_clusters.strategies'", problem, fix):
        assert part in reason, reason
    assert [record.getMessage() for record in caplog.records
            if record.levelno == logging.WARNING] == [f"strategy plug-in not loaded: {reason}"]
    assert name not in strategy_registry.strategy_names()
    # A run config naming it says why it is unavailable, not only what is allowed.
    with pytest.raises(ConfigurationError) as refused:
        parse_run_config({"strategy": name})
    assert str(refused.value) == (f"strategy {name!r} is an installed plug-in that did not "
                                  f"load: {reason}")


def test_the_other_strategies_run_and_the_listing_names_broken_plug_ins(
    registry_kept: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    _load(monkeypatch, *(EntryPoint(name, value, strategy_registry.ENTRY_POINT_GROUP)
                         for name, (value, _, _) in BROKEN.items()))
    assert sorted(strategy_registry.broken_plugins) == sorted(BROKEN)
    with in_process_server():
        summary = loopback_run({"strategy": "ifca", "num-rounds": 1}, tmp_path)
    assert summary["strategy"] == "ifca" and summary["num_clients"] == 6
    out = io.StringIO()
    assert cli.strategies_command(cli.build_parser().parse_args(["strategies"]), out) == 0
    listed = out.getvalue().splitlines()
    for name in BROKEN:
        assert f"not loaded: {name}: {strategy_registry.broken_plugins[name]}" in listed
    assert "ifca\tfl_clusters.strategies.IFCA\tfl-clusters\tGhosh et al., NeurIPS 2020" in listed
    assert "fedprox\tflwr.serverapp.strategy.FedProx\tflwr\tLi et al., MLSys 2020 (baseline)" \
        in listed


# ------------------------------------------------ the listing command's --keys
@pytest.fixture
def own_key_strategy(registry_kept: None) -> type[ClusteredStrategy]:
    """A strategy with a run-config key of its own, registered for one test."""

    class Keyed(HardClusteredStrategy):
        """Declares ``keyed-depth`` and takes the shared ``fraction-train``."""

        name = "keyed"
        paper = "a test's strategy"
        params = (Param("depth", 0.5, "float", "keyed: a test's key", low=0.0),
                  Param("mode", "fast", "str", "keyed: another", choices=("fast", "slow")))

        def __init__(self, *, depth: float = 0.5, mode: str = "fast", **kwargs: Any) -> None:
            super().__init__(depth=depth, mode=mode, **kwargs)

    return Keyed


def test_keys_prints_the_lines_a_plug_ins_keys_need_in_pyproject(
    own_key_strategy: type[ClusteredStrategy],
) -> None:
    where = f"{own_key_strategy.__module__}.{own_key_strategy.__qualname__}"
    assert cli.key_lines("keyed") == [
        f"# strategy = \"keyed\" ({where}): under [tool.flwr.app.config], so that "
        "--run-config can set them",
        "keyed-depth = 0.5",
        'keyed-mode = "fast"',
    ]
    own = cli.key_lines("ifca")
    assert len(own) == 1 and "its keys are all in fl-clusters' table already" in own[0]
    assert "ifca-init" in own[0] and "num-clusters" in own[0]
    assert "proximal-mu" in cli.key_lines("fedprox")[0]
    with pytest.raises(ValueError, match="'nope', which is not available"):
        cli.key_lines("nope")


def test_keys_of_an_unknown_strategy_exits_2_naming_it(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["strategies", "--keys", "nope"]) == 2
    assert "'nope', which is not available in this build" in capsys.readouterr().err


# ------------------------------------------------------------ fl_clusters.testing
@pytest.fixture
def misbuilt(registry_kept: None) -> type[ClusteredStrategy]:
    """A strategy whose built object contradicts its declared default."""

    class Misbuilt(HardClusteredStrategy):
        """Declares ``depth`` 1 and sets 2."""

        name = "misbuilt"
        paper = "a test's strategy"
        params = (Param("depth", 1, "int", "misbuilt: a test's key", low=0),)

        def __init__(self, *, depth: int = 1, **kwargs: Any) -> None:
            super().__init__(depth=depth, **kwargs)
            self.depth = 2

    return Misbuilt


def test_check_strategy_names_the_check_that_fails(misbuilt: type[ClusteredStrategy]) -> None:
    with pytest.raises(AssertionError) as failed:
        check_strategy(misbuilt)
    assert str(failed.value).startswith(
        "Misbuilt ('misbuilt') fails the check builds_from_its_declarations: AssertionError: "
        "argument depth is 2 when built from the run config, not its declared default 1")


def test_parametrize_with_checks_makes_one_test_per_strategy_and_check(
    misbuilt: type[ClusteredStrategy],
) -> None:
    mark = parametrize_with_checks([IFCA, misbuilt])
    assert mark.args[0] == ("strategy", "check")
    params = mark.args[1]
    assert [param.id for param in params] == [
        f"{name}-{check}" for name in ("ifca", "misbuilt") for check in CHECK_NAMES]
    assert params[0].values[0] is IFCA and params[-1].values[0] is misbuilt
    # Every check of every strategy reads the same federations, made once.
    assert len({id(param.values[1].runs) for param in params}) == 1
    with pytest.raises(TypeError, match="pass classes derived from"):
        parametrize_with_checks({"ifca": IFCA})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no strategies"):
        parametrize_with_checks([])


def test_in_process_server_puts_the_identity_and_the_wait_back() -> None:
    before = (TaskIdentity._run_id, server_app.NODE_QUIET_S)
    with in_process_server():
        assert TaskIdentity.run_id == 1 and server_app.NODE_QUIET_S == 0.0
    assert (TaskIdentity._run_id, server_app.NODE_QUIET_S) == before


def test_fl_clusters_imports_no_pytest_at_run_time() -> None:
    code = ("import sys, fl_clusters.apps, fl_clusters.server_app, fl_clusters.cli, "
            "fl_clusters.testing; print('pytest' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


# ------------------------------------------------- the example, installed (slow)
@pytest.fixture(scope="module")
def example_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/strategy-plugin: pip builds in it, which leaves build/ behind."""
    return shutil.copytree(EXAMPLE, tmp_path_factory.mktemp("source") / "strategy-plugin",
                           ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))


@pytest.fixture(scope="module")
def plugin_path(example_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/strategy-plugin installed by pip, offline, into a folder of its own."""
    target = tmp_path_factory.mktemp("plugin")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(example_copy)], capture_output=True,
        text=True)
    assert done.returncode == 0, (
        "installing the example needs setuptools >= 70.1 in the venv (torch brings it): "
        + done.stderr[-3000:])
    return target


def _with_plugin(plugin: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with only the installed plug-in on PYTHONPATH."""
    return {**(os.environ if env is None else env), "PYTHONPATH": str(plugin)}


def _run(command: list[str], plugin: Path, cwd: Path) -> str:
    """``command`` with the plug-in importable; its output, checked to exit 0."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=_with_plugin(plugin))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_listing_names_the_installed_plug_in_and_its_keys(
    plugin_path: Path, tmp_path: Path,
) -> None:
    listed = _run([str(VENV_BIN / "fl-clusters"), "strategies"], plugin_path, tmp_path)
    rows = {line.split("\t")[0]: line.split("\t") for line in listed.splitlines()}
    assert rows[PLUGIN][1:3] == ["fl_clusters_fedgroup.fedgroup.FedGroup", DISTRIBUTION]
    assert "Duan et al." in rows[PLUGIN][3]
    assert "not loaded" not in listed
    keys = _run([str(VENV_BIN / "fl-clusters"), "strategies", "--keys", PLUGIN],
                plugin_path, tmp_path)
    assert keys.splitlines()[1:] == ["fedgroup-directions = 3"]


@pytest.mark.slow
def test_the_examples_own_tests_pass_the_public_checks(
    plugin_path: Path, example_copy: Path,
) -> None:
    report = _run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                   "tests/test_fedgroup.py"], plugin_path, example_copy)
    passed = [line for line in report.splitlines() if " PASSED" in line]
    checked = {check for check in CHECK_NAMES for line in passed if f"[{PLUGIN}-{check}]" in line}
    assert checked == set(CHECK_NAMES), report[-3000:]
    assert " failed" not in report and " error" not in report, report[-3000:]


def _flwr_run(app: Path, env: dict[str, str], run_config: str) -> subprocess.CompletedProcess:
    """``flwr run`` of ``app`` on 4 simulated nodes with ``run_config``."""
    return subprocess.run(
        [str(VENV_BIN / "flwr"), "run", ".", "--stream", "--federation-config",
         "num-supernodes=4 client-resources-num-cpus=1", "--run-config", run_config],
        cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=600)


def _run_config_of(output: str) -> dict[str, Any]:
    """The run config of the run whose output is ``output``, as its results folder holds it."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1].startswith("results: "), output[-3000:]
    folder = Path(lines[-1].removeprefix("results: "))
    assert json.loads((folder / "summary.json").read_text())["strategy"] == PLUGIN
    return json.loads((folder / "run_config.json").read_text())


@pytest.mark.slow
def test_flwr_run_runs_the_plug_in_by_name_and_its_pasted_keys_override(
    plugin_path: Path, fresh_checkout: tuple[Path, Path, dict[str, str]],
) -> None:
    app, _, env = fresh_checkout
    env = _with_plugin(plugin_path, env)
    small = f"strategy='{PLUGIN}' num-rounds=2 num-clusters=2 plots=false"
    # Named alone, it runs with its keys' declared defaults.
    default = _flwr_run(app, env, small)
    assert default.returncode == 0, default.stdout[-3000:]
    assert _run_config_of(default.stdout)["fedgroup-directions"] == 3
    # Flower refuses a key the app's pyproject.toml lacks...
    refused = _flwr_run(app, env, f"{small} fedgroup-directions=2")
    assert "Invalid run configuration" in refused.stdout, refused.stdout[-3000:]
    # ...and takes it once the lines `fl-clusters strategies --keys` prints are there.
    keys = _run([str(VENV_BIN / "fl-clusters"), "strategies", "--keys", PLUGIN],
                plugin_path, app)
    pyproject = app / "pyproject.toml"
    table = "[tool.flwr.app.config]\n"
    pyproject.write_text(pyproject.read_text().replace(table, table + keys, 1))
    overridden = _flwr_run(app, env, f"{small} fedgroup-directions=2")
    assert overridden.returncode == 0, overridden.stdout[-3000:]
    assert _run_config_of(overridden.stdout)["fedgroup-directions"] == 2


@pytest.mark.slow
def test_a_sweep_names_the_plug_in_and_sets_its_keys(plugin_path: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "plug-in.toml"
    sweep.write_text(
        "[base]\ndataset = \"digits\"\nnum-rounds = 2\nnum-clusters = 2\nplots = false\n"
        "fedgroup-directions = 2\n"
        f"[grid]\nstrategy = [\"{PLUGIN}\"]\n"
        "[federation]\nnum-supernodes = 4\nclient-resources-num-gpus = 0.0\n")
    _run([str(VENV_BIN / "fl-clusters"), "sweep", str(sweep), "--out", str(tmp_path / "out")],
         plugin_path, tmp_path)
    (line,) = [json.loads(text) for text in
               (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert line["status"] == "ok", line["error"]
    assert line["settings"]["strategy"] == PLUGIN
    assert line["settings"]["fedgroup-directions"] == 2
    assert line["summary"]["ari"] == 1.0
