"""Every own strategy through the public conformance checks, with no test code of its own.

The checks are fl_clusters.testing's, parametrised over fl-clusters' own
strategies (the registry's ``own_strategies()``), so a strategy file added under
fl_clusters/strategies/ is collected and checked as it is; an installed plug-in
is not, and leaves this suite as it is. Each strategy builds from its
declarations and from ``preset='paper'``, repeats a run from the same seed,
resumes from a checkpoint exactly where the uninterrupted run goes, runs through
a node that leaves, one that joins late and malformed replies, and writes its
summary fields (test ids ``test_strategy_check[<name>-<check>]``). What only this
project asks of its own strategies is checked here: their rows in the generated
pages and pyproject.toml, and a docstring that documents their arguments.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from fl_clusters.strategies.kit import ClusteredStrategy
from fl_clusters.strategies.kit.registry import own_strategies
from fl_clusters.testing import parametrize_with_checks
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
OWN = own_strategies()


def _generator() -> ModuleType:
    return load_script(ROOT / "docs" / "generate_strategies.py")


@parametrize_with_checks(OWN.values())
def test_strategy_check(strategy, check) -> None:  # type: ignore[no-untyped-def]
    check(strategy)


@pytest.mark.parametrize("name", sorted(OWN))
def test_docstring_documents_its_arguments(name: str) -> None:
    cls = OWN[name]
    # The generator reads the docstring's arguments with the declared defaults.
    assert f"## {cls.__name__} (`{name}`)" in _generator().section(cls, name, cls.paper)


@pytest.mark.parametrize("name", sorted(OWN))
def test_docs_rows_present(name: str) -> None:
    cls: type[ClusteredStrategy] = OWN[name]
    generator = _generator()
    for page in generator.STRATEGY_TABLES:
        rows = generator.block(page.read_text(), generator.STRATEGIES_BLOCK)
        assert f"`{name}`" in rows or f"`{cls.__name__}(" in rows, page.name
    assert f"## {cls.__name__} (`{name}`)" in (ROOT / "docs" / "strategies.md").read_text()
    assert f"## {cls.__name__} (`{name}`," in (ROOT / "docs" / "paper-fidelity.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for param in cls.declared_params():
        if param.run_config:
            assert f"\n{param.key} = " in pyproject, param.key
