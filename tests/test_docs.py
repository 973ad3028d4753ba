"""The docs agree with the code: the generated pages, and every path a page names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fl_clusters.strategies import IFCA, ClusteredStrategy
from tests.conftest import load_script

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _generator():  # type: ignore[no-untyped-def]
    return load_script(DOCS / "generate_strategies.py")


def test_the_strategies_page_matches_the_classes() -> None:
    current = (DOCS / "strategies.md").read_text()
    assert _generator().render(current) == current, (
        "docs/strategies.md is out of date; run: python docs/generate_strategies.py"
    )


def test_the_paper_fidelity_page_lists_every_declared_departure() -> None:
    current = (DOCS / "paper-fidelity.md").read_text()
    assert _generator().fidelity() == current, (
        "docs/paper-fidelity.md is out of date; run: python docs/generate_strategies.py"
    )
    assert "`threshold` (`flhc-threshold`) | `'gap'` | `'absolute'`" in current
    # A value the paper does not give is said so, with the library's reason.
    assert ("- `mean_norm_max` (`acfl-mean-norm-max`): not given by the paper; this library "
            "uses `0.4` because") in current
    # A rule is listed with the paper's, the robust one and what each preset runs.
    assert "| `round0_average` | round 0 only clusters:" in current
    assert "| the paper's | round 0 is a full round" in current


def test_a_strategy_without_paper_declarations_is_not_called_faithful(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Undeclared(ClusteredStrategy):
        paper = "a paper nobody checked"

    generator = _generator()
    monkeypatch.setattr(generator, "strategies", lambda: [Undeclared])
    section = generator.fidelity().partition("## ")[2]
    assert "a paper nobody checked" in section
    assert "Every default is the paper's" not in section
    assert "No parameter or rule declares a departure from the paper" in section
    # A class that names what its defaults were checked against says so, with the source.
    monkeypatch.setattr(Undeclared, "defaults_checked_against", "section 3", raising=False)
    assert "Every default is the paper's (checked against section 3)." in generator.fidelity()


def test_pyproject_lists_the_declared_run_config_keys() -> None:
    # Flower's CLI refuses a --run-config key that [tool.flwr.app.config] lacks.
    current = (DOCS.parent / "pyproject.toml").read_text()
    assert _generator().render_pyproject(current) == current, (
        "pyproject.toml's [tool.flwr.app.config] is out of date with the strategies' "
        "declarations; run: python docs/generate_strategies.py"
    )


@pytest.mark.parametrize("page", list(_generator().STRATEGY_TABLES), ids=lambda page: page.name)
def test_every_strategy_table_is_generated_from_the_registry(page: Path) -> None:
    current = page.read_text()
    assert _generator().render_blocks(page, current) == current, (
        f"{page.name}'s strategy table is out of date; run: python docs/generate_strategies.py"
    )


def test_a_strategy_table_without_its_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks the block <!-- strategies: generated"):
        _generator().block("| strategy | class |\n", "strategies")


def test_a_docstring_default_that_differs_from_the_signature_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generator = _generator()
    monkeypatch.setattr(IFCA, "__doc__", IFCA.__doc__.replace(  # type: ignore[union-attr]
        "restarts : int (default: 1)", "restarts : int (default: 10)"))
    with pytest.raises(ValueError, match=r"IFCA.restarts: the docstring says default 10"):
        generator.section(IFCA, "ifca", "paper")


def test_the_run_config_keys_are_those_the_builder_reads() -> None:
    keys = _generator().run_config_keys("cfl")
    assert "cfl-min-silhouette" in keys and "cfl-eps1" in keys
    assert "seed" not in keys  # shared keys are listed once, under ClusteredStrategy


ROOT = DOCS.parent
# A path into the repository, as the docs write one in prose or in code spans.
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|benchmarks|tests|examples|fl_clusters|deploy)/[\w./*-]*\w)")
TEST_FILE = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def missing_targets(page: Path) -> list[str]:
    """The paths ``page`` names (links, repository paths, test files) that do not exist."""
    text = page.read_text()
    missing = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            missing.append(target)
    for target in REPO_PATH.findall(text):
        if "/." in target:  # a folder the scripts create at run time (deploy/.state)
            continue
        if not (next(ROOT.glob(target), None) if "*" in target else (ROOT / target).exists()):
            missing.append(target)
    missing += [name for name in TEST_FILE.findall(text)
                if not (ROOT / "tests" / name).exists()]
    return missing


@pytest.mark.parametrize("page", documents(), ids=lambda page: page.name)
def test_every_path_a_page_names_exists(page: Path) -> None:
    assert missing_targets(page) == []
