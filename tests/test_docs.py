"""docs/strategies.md is what docs/generate_strategies.py makes of the classes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fl_clusters.strategies import IFCA

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("generate_strategies",
                                                  DOCS / "generate_strategies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_strategies_page_matches_the_classes() -> None:
    current = (DOCS / "strategies.md").read_text()
    assert _generator().render(current) == current, (
        "docs/strategies.md is out of date; run: python docs/generate_strategies.py"
    )


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
