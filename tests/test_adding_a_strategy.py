"""docs/adding-a-strategy.md's worked example runs as printed and recovers the groups.

The guide's FeSEM block is executed here as it is printed, registered for the
test only, and run on the tiny in-process job of tests/loopback_runs.py.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.strategies.kit import ClusteredStrategy
from tests.loopback_runs import ChurnGrid, in_process_server, loopback_run

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "adding-a-strategy.md"
SECTION = "## A worked example"


def worked_example() -> str:
    """The first ``python`` block after the guide's worked-example heading."""
    text = GUIDE.read_text()
    found = re.search(r"```python\n(.*?)```", text[text.index(SECTION):], flags=re.S)
    assert found is not None, f"{GUIDE.name} has no python block after {SECTION!r}"
    return found[1]


@pytest.fixture
def fesem(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ClusteredStrategy]]:
    """The guide's strategy, registered for one test only."""
    monkeypatch.setattr(ClusteredStrategy, "registry", dict(ClusteredStrategy.registry))
    module = types.ModuleType("fesem_example")
    exec(compile(worked_example(), str(GUIDE), "exec"), module.__dict__)
    yield module.FeSEM


class ChurnOnly(ChurnGrid):
    """A node that leaves and one that joins late, no corrupted reply."""

    CORRUPTED = 0


def test_the_worked_example_recovers_the_groups(
    fesem: type[ClusteredStrategy], tmp_path: Path
) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "fesem"}, tmp_path)
    assert summary["strategy"] == "fesem"
    assert summary["ari"] == 1.0
    assert summary["num_clusters_found"] == 2
    assert len(summary["moved_per_round"]) == 3


def test_the_worked_example_places_a_late_node_by_its_nearest_centre(
    fesem: type[ClusteredStrategy], tmp_path: Path
) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "fesem", "min-nodes": 5}, tmp_path, ChurnOnly)
    assert summary["late_nodes"] == [ChurnGrid.LATE]
    assert list(summary["placed_nodes"]) == [str(ChurnGrid.LATE)]
    # Placed in its own group's cluster, like every other node.
    assert summary["ari"] == 1.0


def test_the_worked_example_declares_its_run_config_key(
    fesem: type[ClusteredStrategy],
) -> None:
    key = config_keys()["fesem-init"]
    assert key.default == "farthest"
    assert "fesem-num-clusters" not in config_keys()
    with pytest.raises(ValueError, match="run-config key 'fesem-init' must be one of "
                       "'farthest', 'random'; got 'kmeans'"):
        parse_run_config({"strategy": "fesem", "fesem-init": "kmeans"})
    problem = fesem(num_clusters=4).federation_problem(3)  # type: ignore[call-arg]
    assert problem is not None and problem.startswith("FeSEM takes its 4 first centres")
