"""A strategy is one file: added alone, the whole fast suite passes, its checks among it.

In a copy of the repository (what a clean clone holds), docs/adding-a-strategy.md's
worked example is written as ONE new file under fl_clusters/strategies/: a
strategy that declares a paper value, a run-config key no recorded run knew
(``fesem-init``) and a client query of its own, which its rounds ask a node that
joins late. Running docs/generate_strategies.py then lists it in every strategy
table, records its paper digest, and leaves every measured number and sweep table
of the published pages as it was; the whole fast suite (``make test``'s) then
passes in the copy, with no other file edited, and every conformance check of
the new strategy is among the tests it ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from fl_clusters.testing import CHECK_NAMES
from tests.conftest import ROOT, copy_app
from tests.test_adding_a_strategy import worked_example
from tests.test_measured_docs import RENDERER

GENERATED = ("README.md", "docs/plugin.md", "docs/config.md", "docs/strategies.md",
             "docs/paper-fidelity.md", "docs/paper-digests.json", "pyproject.toml")
# The fast suite, as `make test` runs it.
FAST_SUITE = ("-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-m", "not slow",
              "-p", "no:cacheprovider")


def measured(page: Path) -> list[str]:
    """Every measured number and sweep table of ``page``, as rendered."""
    text = page.read_text()
    return [match[0] for match in RENDERER.INLINE.finditer(text)] + [
        match[0] for match in RENDERER.TABLE.finditer(text)]


def run(app: Path, *command: str) -> str:
    """``command`` in the copy, importing the copy's fl_clusters; its output.

    The copy has no venv of its own: its deploy scripts take this one's (as a
    clone's would take the clone's ``.venv``).
    """
    venv = {"FLC_VENV": sys.prefix,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    done = subprocess.run(command, cwd=app, capture_output=True, text=True,
                          env={**os.environ, **venv, "PYTHONPATH": str(app)})
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return done.stdout


def clone(app: Path) -> Path:
    """A copy of the checkout that is a git repository of its files, as a clone is.

    Measured files record the commit they were made at, and the suite checks that a
    record made now has one; the deploy scripts run one another, so they keep their
    modes, as git keeps them.
    """
    app = copy_app(ROOT, app)
    for copied in app.rglob("*"):
        if copied.is_file():
            shutil.copymode(ROOT / copied.relative_to(app), copied)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout"]):
        subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
                        "-c", "commit.gpgsign=false", *command], cwd=app, check=True,
                       capture_output=True)
    return app


def passed_tests(report: Path) -> set[str]:
    """The names of the tests a JUnit XML report records as passed."""
    cases = ElementTree.parse(report).getroot().iter("testcase")
    return {case.get("name", "") for case in cases
            if not any(child.tag in ("failure", "error", "skipped") for child in case)}


@pytest.mark.slow
def test_a_strategy_added_as_one_file_needs_no_other_edit(tmp_path: Path) -> None:
    app = clone(tmp_path / "repo")
    pages = [app / "README.md", *sorted((app / "docs").glob("*.md"))]
    before = {page: page.read_text() for page in [*pages, app / "pyproject.toml",
                                                  app / "docs" / "paper-digests.json"]}
    (app / "fl_clusters" / "strategies" / "fesem.py").write_text(worked_example())

    run(app, sys.executable, "docs/generate_strategies.py")

    for name in GENERATED:
        assert "fesem" in (app / name).read_text().lower(), f"{name} does not list FeSEM"
    # The package exports it: the tables name it as they name the others.
    assert "| `fesem` | `fl_clusters.strategies.FeSEM` |" in (app / "README.md").read_text()
    assert "\nfesem-init = \"farthest\"" in (app / "pyproject.toml").read_text()
    digests = json.loads((app / "docs" / "paper-digests.json").read_text())
    assert digests["FeSEM"]["paper_revision"] == 1

    # The whole fast suite passes in the copy, every conformance check of FeSEM in it.
    report = tmp_path / "fast-suite.xml"
    run(app, sys.executable, *FAST_SUITE, f"--junitxml={report}")
    passed = passed_tests(report)
    missing = [check for check in CHECK_NAMES
               if not any(f"fesem-{check}]" in name for name in passed)]
    assert missing == [], f"conformance checks of fesem not run and passed: {missing}"
    assert any("[fesem]" in name for name in passed), "no test parametrised by name ran fesem"

    # A key no recorded run knew, whose default is what they ran, stales no number.
    originals = {page: tmp_path / "before" / page.name for page in pages}
    for page, original in originals.items():
        original.parent.mkdir(exist_ok=True)
        original.write_text(before[page])
    stale = sorted(page.name for page in pages if measured(page) != measured(originals[page]))
    assert not stale, f"measured numbers changed on {stale}"
    changed = sorted(str(page.relative_to(app)) for page, text in before.items()
                     if page.read_text() != text)
    assert set(changed) <= set(GENERATED), changed
