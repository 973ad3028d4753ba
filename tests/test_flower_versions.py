"""The supported Flower releases: pyproject.toml's range, the Makefile that tests them,
CI, docs/flower-versions.md and the Flower this suite runs on agree."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import flwr
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import VENV_BIN

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "flower-versions.md"


def flwr_dependency(pyproject: Path) -> str | None:
    """The one ``flwr`` requirement of ``pyproject``'s dependencies, as written."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    found = [d for d in dependencies if Requirement(d).name == "flwr"]
    assert len(found) <= 1, f"{pyproject} names flwr more than once: {found}"
    return found[0] if found else None


def supported_dependency() -> Requirement:
    """pyproject.toml's ``flwr`` requirement."""
    written = flwr_dependency(ROOT / "pyproject.toml")
    assert written is not None, "pyproject.toml's dependencies lack flwr"
    return Requirement(written)


def minor(version: str) -> str:
    """``1.42`` for ``1.42.0``."""
    return ".".join(version.split(".")[:2])


def makefile_releases() -> tuple[str, str]:
    """The Makefile's (FLWR_PINNED, FLWR_NEWER): the release `.venv` holds and the one
    `make test-flwr-X.Y` runs the fast suite on."""
    found = dict(re.findall(r"^(FLWR_PINNED|FLWR_NEWER) := (\S+)$",
                            (ROOT / "Makefile").read_text(), re.MULTILINE))
    return found["FLWR_PINNED"], found["FLWR_NEWER"]


def test_the_range_admits_exactly_the_two_tested_minor_releases() -> None:
    requirement = supported_dependency()
    assert requirement.extras == {"simulation"}
    pinned, newer = makefile_releases()
    assert Version(pinned) < Version(newer)
    admitted = {f"1.{m}" for m in range(100) if requirement.specifier.contains(f"1.{m}.0")}
    # A minor release the range admits and no run tests would be support claimed unchecked.
    assert admitted == {minor(pinned), minor(newer)}, (
        f"pyproject.toml's {requirement} admits {sorted(admitted)}; the Makefile tests "
        f"{pinned} (.venv) and {newer} (test-flwr-{minor(newer)})"
    )


def test_every_example_app_requires_the_same_range() -> None:
    written = flwr_dependency(ROOT / "pyproject.toml")
    examples = {path.parent.name: flwr_dependency(path)
                for path in sorted(ROOT.glob("examples/*/pyproject.toml"))}
    assert examples["quickstart-pytorch-clustered"] == written
    # An app that leaves flwr to fl-clusters' own requirement names none.
    assert {name: dep for name, dep in examples.items() if dep not in (None, written)} == {}


def test_make_and_ci_run_the_suite_on_the_newer_release() -> None:
    _, newer = makefile_releases()
    target = f"test-flwr-{minor(newer)}"
    assert re.search(rf"^{re.escape(target)}: ", (ROOT / "Makefile").read_text(), re.MULTILINE)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test-all" in ci and f"make {target}" in ci


def test_the_page_states_the_range_and_the_releases_the_makefile_tests() -> None:
    page = PAGE.read_text().replace("**", "")
    pinned, newer = makefile_releases()
    assert f"`{flwr_dependency(ROOT / 'pyproject.toml')}`" in page
    assert f"Flower {minor(pinned)} and {minor(newer)}" in page
    assert f"make setup` installs flwr {pinned}" in page
    assert f"make test-flwr-{minor(newer)}`: the fast suite" in page
    assert f"Flower {newer}" in page
    assert "docs/flower-versions.md" in (ROOT / "README.md").read_text()


def test_the_suite_runs_on_a_supported_flower_and_starts_the_same_one(tmp_path: Path) -> None:
    """The `flwr` beside this python (what the tests start: `flwr run`, SuperLinks) is
    the Flower this process imports, and that Flower lies in the supported range."""
    assert supported_dependency().specifier.contains(flwr.__version__)
    env = {**os.environ, "FLWR_HOME": str(tmp_path), "FLWR_DISABLE_UPDATE_CHECK": "1"}
    for command in ("flwr", "flower-superlink"):
        shown = subprocess.run([str(VENV_BIN / command), "--version"], capture_output=True,
                               text=True, env=env, timeout=120, check=True)
        assert shown.stdout.strip() == f"Flower version: {flwr.__version__}", command
