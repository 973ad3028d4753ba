"""docs/adding-a-strategy.md's worked example runs as printed and recovers the groups.

The guide's FeSEM block is executed here as it is printed, registered for the
test only, and run on the tiny in-process job of fl_clusters.testing; its client
query places a node that joins late.
"""

from __future__ import annotations

import csv
import re
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message

from fl_clusters import protocol as p
from fl_clusters.config import config_keys, parse_run_config
from fl_clusters.strategies.kit import ClusteredStrategy
from fl_clusters.testing import ChurnGrid, in_process_server, loopback_run

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
    """A node that leaves and one that joins late, no corrupted reply; the client queries
    of the strategies' own it delivers, as (node, query name)."""

    CORRUPTED = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.strategy_queries: list[tuple[int, str]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Note every strategy query, then deliver as ChurnGrid does."""
        messages = list(messages)
        self.strategy_queries += [
            (message.metadata.dst_node_id, str(message.content[p.CONFIG][p.CFG_QUERY]))
            for message in messages if message.metadata.message_type == p.QUERY_STRATEGY]
        return super().push_messages(messages)


def test_the_worked_example_recovers_the_groups(
    fesem: type[ClusteredStrategy], tmp_path: Path
) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "fesem"}, tmp_path)
    assert summary["strategy"] == "fesem"
    assert summary["ari"] == 1.0
    assert summary["num_clusters_found"] == 2
    assert len(summary["moved_per_round"]) == 3
    # Its Scoring: round 1's clustering scored against the true groups too.
    assert 0.0 <= summary["first_round_ari"] <= 1.0
    # Its write_artifacts: one row per round.
    with (summary["_folder"] / "fesem_moves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["round"] for row in rows] == ["1", "2", "3"]
    assert [int(row["moved"]) for row in rows] == list(summary["moved_per_round"].values())


def test_the_worked_example_places_a_late_node_by_its_nearest_centre(
    fesem: type[ClusteredStrategy], tmp_path: Path
) -> None:
    grids: list[ChurnOnly] = []

    class Noted(ChurnOnly):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            grids.append(self)

    with in_process_server():
        summary = loopback_run({"strategy": "fesem", "min-nodes": 5}, tmp_path, Noted)
    assert summary["late_nodes"] == [ChurnGrid.LATE]
    assert list(summary["placed_nodes"]) == [str(ChurnGrid.LATE)]
    # Placed by its client query, asked of the late node alone, once.
    assert grids[0].strategy_queries == [(ChurnGrid.LATE, "fesem_centre_distances")]
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
