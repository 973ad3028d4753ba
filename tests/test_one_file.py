"""A strategy is one file: added alone, it is documented, measured pages stay, checks run.

In a copy of the repository (what a clean clone holds), docs/adding-a-strategy.md's
worked example is written as ONE new file under fl_clusters/strategies/, declaring
a run-config key no recorded run knew (``fesem-init``). Running
docs/generate_strategies.py then lists it in every strategy table, leaves every
measured number and sweep table of the published pages as it was, and
tests/test_conformance.py collects and passes its checks, with no other file edited.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import test_conformance as conformance
from tests.conftest import ROOT, copy_app
from tests.test_adding_a_strategy import worked_example
from tests.test_measured_docs import RENDERER

CONFORMANCE_CHECKS = [name for name in dir(conformance) if name.startswith("test_")]
GENERATED = ("README.md", "docs/plugin.md", "docs/config.md", "docs/strategies.md",
             "docs/paper-fidelity.md", "pyproject.toml")


def measured(page: Path) -> list[str]:
    """Every measured number and sweep table of ``page``, as rendered."""
    text = page.read_text()
    return [match[0] for match in RENDERER.INLINE.finditer(text)] + [
        match[0] for match in RENDERER.TABLE.finditer(text)]


def run(app: Path, *command: str) -> str:
    """``command`` in the copy, importing the copy's fl_clusters; its output."""
    done = subprocess.run(command, cwd=app, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(app)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_strategy_added_as_one_file_is_documented_and_checked(tmp_path: Path) -> None:
    app = copy_app(ROOT, tmp_path / "repo")
    pages = [app / "README.md", *sorted((app / "docs").glob("*.md"))]
    before = {page: page.read_text() for page in [*pages, app / "pyproject.toml"]}
    (app / "fl_clusters" / "strategies" / "fesem.py").write_text(worked_example())

    run(app, sys.executable, "docs/generate_strategies.py")

    for name in GENERATED:
        assert "fesem" in (app / name).read_text().lower(), f"{name} does not list FeSEM"
    assert "\nfesem-init = \"farthest\"" in (app / "pyproject.toml").read_text()
    # Every conformance check is collected for it and passes, the generated pages too.
    report = run(app, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                 "tests/test_conformance.py", "tests/test_docs.py",
                 "-k", "fesem or generated_from_the_registry or strategies_page")
    passed = [line for line in report.splitlines() if "[fesem] PASSED" in line]
    assert len(passed) == len(CONFORMANCE_CHECKS), report[-3000:]

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
