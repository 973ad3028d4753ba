"""Every run says what a wrong placement costs: placement regret and its warnings (issue 58)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.image
import numpy as np
import pytest
from flwr.app import MetricRecord

from fl_clusters import protocol as p
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.placement_regret import (
    MAX_NAMED,
    PERSISTENT_ROUNDS,
    REGRET_THRESHOLD,
    STABLE_ROUNDS,
    broken_clustering,
    broken_clusterings,
    partition_moves,
    placement_fields,
    placement_regret,
    warn_costly_placements,
    warn_if_clustering_broke,
)
from fl_clusters.plots import ASSIGNMENT_PLOT, plot_assignment_map
from fl_clusters.results import print_summary, write_plugin_results
from fl_clusters.server_app import initial_arrays, train_config
from fl_clusters.strategies import IFCA
from fl_clusters.strategies.local import LocalOnly
from fl_clusters.testing import NUM_CLIENTS, TINY_JOB, in_process_server, loopback_run


@pytest.fixture
def flwr_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="flwr")
    return caplog


def row(node: int, accuracy: list[float], assigned: int, **extra: Any) -> dict[str, Any]:
    """A final report row of partition ``node - 100``."""
    return {"node-id": node, "partition-id": node - 100, "test-accuracy": accuracy,
            "assigned": assigned, "num-test": 10, **extra}


# Client 2 (partition 2) sits in cluster 1 although cluster 0 scores 0.4 more on it.
ROWS = [row(100, [0.9, 0.2], 0), row(101, [0.3, 0.8], 1), row(102, [0.85, 0.45], 1)]
PERSONAL = [0.9, 0.8, 0.45]


def held_for(rounds: int, clusters: dict[int, int]) -> dict[int, dict[int, int]]:
    """An assignment history in which every node used the same cluster for ``rounds``."""
    return {r: dict(clusters) for r in range(1, rounds + 1)}


# ------------------------------------------------------------------ the regret itself
def test_regret_is_the_best_cluster_model_minus_the_assigned_one() -> None:
    fields = placement_fields(ROWS, PERSONAL, None)
    assert fields["best_cluster"] == [0, 1, 0]
    assert fields["placement_regret"] == pytest.approx([0.0, 0.0, 0.85 - 0.45])
    assert fields["max_placement_regret"] == pytest.approx(0.4)
    assert fields["placement_regret_threshold"] == REGRET_THRESHOLD == 0.1
    assert fields["clients_with_regret_above_threshold"] == [{"partition_id": 2, "node_id": 102}]
    assert fields["broken_clusterings"] == []


def test_a_model_of_the_clients_own_is_compared_with_the_best_cluster_model() -> None:
    # FedEM's mixture (or FedSoft's, local-only's own model) is what the client uses:
    # one that beats every cluster model costs nothing, a worse one costs the gap.
    accuracy = np.array([[0.6, 0.7], [0.6, 0.7]])
    best, regret = placement_regret(accuracy, [0.75, 0.5])
    assert best.tolist() == [1, 1]
    assert regret == pytest.approx([0.0, 0.2])


def test_a_single_model_strategy_has_no_regret() -> None:
    # FedAvg's one model, and local-only's untrained initial model beside the own models.
    accuracy = np.array([[0.3], [0.9]])
    assert placement_regret(accuracy, [0.3, 0.9])[1].tolist() == [0.0, 0.0]
    assert placement_regret(accuracy, [0.8, 0.5])[1].tolist() == [0.0, 0.0]


# ------------------------------------------------------- a wrong placement that held
def test_a_wrong_placement_that_held_is_warned_of_with_its_fix(flwr_warnings) -> None:
    history = held_for(PERSISTENT_ROUNDS + 1, {100: 0, 101: 1, 102: 1})
    placement_fields(ROWS, PERSONAL, (history, {}))
    lines = [r.getMessage() for r in flwr_warnings.records]
    assert len(lines) == 1
    assert "partition 2 sat in cluster 1" in lines[0]
    assert f"last {PERSISTENT_ROUNDS + 1} evaluated rounds" in lines[0]
    assert "cluster 0's model scores +0.40" in lines[0]
    assert "held-out data" in lines[0] and "num-clusters" in lines[0]


def test_one_line_per_cluster_names_every_client_it_holds(flwr_warnings) -> None:
    rows = [*ROWS, row(103, [0.95, 0.3], 1)]
    history = held_for(PERSISTENT_ROUNDS, {100: 0, 101: 1, 102: 1, 103: 1})
    best, regret = placement_regret(np.array([r["test-accuracy"] for r in rows]),
                                    [0.9, 0.8, 0.45, 0.3])
    lines = warn_costly_placements(rows, best, regret, history)
    assert len(lines) == 1
    assert "partition 2, partition 3 sat in cluster 1" in lines[0]
    assert "+0.40, +0.65" in lines[0]


def test_a_placement_that_changed_recently_is_named_as_recent(flwr_warnings) -> None:
    history = held_for(PERSISTENT_ROUNDS + 1, {100: 0, 101: 1, 102: 0})
    # Moved to cluster 1 only for the last rounds: it may still be settling.
    for r in range(PERSISTENT_ROUNDS, PERSISTENT_ROUNDS + 2):
        history[r] = {100: 0, 101: 1, 102: 1}
    placement_fields(ROWS, PERSONAL, (history, {}))
    (line,) = [r.getMessage() for r in flwr_warnings.records]
    assert "partition 2 ended in cluster 1, joined in their last 2 evaluated round(s)" in line
    assert "cluster 0's model scores +0.40" in line


def test_a_clients_own_model_trailing_its_cluster_is_named_with_its_fix(flwr_warnings) -> None:
    # A FedSoft client whose own model trails its own cluster's.
    rows = [row(100, [0.9, 0.2], 0), row(101, [0.3, 0.8], 1)]
    fields = placement_fields(rows, [0.9, 0.5], (held_for(5, {100: 0, 101: 1}), {}))
    assert fields["clients_with_regret_above_threshold"] == [{"partition_id": 1, "node_id": 101}]
    (line,) = [r.getMessage() for r in flwr_warnings.records]
    assert ("partition 1 use a model of their own that cluster 1's, their cluster's, "
            "beats by +0.30") in line
    assert "evaluate them on their cluster's model" in line


def test_every_client_above_the_threshold_is_named_in_a_warning(flwr_warnings) -> None:
    rng = np.random.default_rng(0)
    # More clients in one group than a log line usually names (MAX_NAMED).
    rows = [row(100 + i, rng.uniform(0, 1, 2).round(2).tolist(), int(rng.integers(2)))
            for i in range(60)]
    personal = [r["test-accuracy"][r["assigned"]] for r in rows]
    history = {r: {100 + i: int(rng.integers(2)) for i in range(60)} for r in range(1, 4)}
    history[4] = {r["node-id"]: r["assigned"] for r in rows}
    fields = placement_fields(rows, personal, (history, {}))
    text = " ".join(r.getMessage() for r in flwr_warnings.records)
    above = fields["clients_with_regret_above_threshold"]
    assert len(above) > MAX_NAMED
    for client in above:
        assert re.search(rf"partition {client['partition_id']}\b", text)


def test_no_warning_when_the_regret_is_below_the_threshold(flwr_warnings) -> None:
    rows = [row(100, [0.9, 0.2], 0), row(101, [0.3, 0.8], 1), row(102, [0.5, 0.45], 1)]
    fields = placement_fields(rows, [0.9, 0.8, 0.45], (held_for(5, {100: 0, 101: 1, 102: 1}), {}))
    assert fields["clients_with_regret_above_threshold"] == []
    assert not flwr_warnings.records


# --------------------------------------------------------- a clustering that held
STABLE = {1: 0, 2: 0, 3: 1, 4: 1}


def test_a_split_after_a_stable_clustering_names_the_clients_that_moved(flwr_warnings) -> None:
    history = held_for(STABLE_ROUNDS, STABLE)
    history[STABLE_ROUNDS + 1] = {1: 0, 2: 0, 3: 1, 4: 2}
    event = warn_if_clustering_broke(history, STABLE_ROUNDS + 1, lambda node: f"partition {node}")
    assert event is not None and event.change == "split" and event.moved == {4: (1, 2)}
    (line,) = [r.getMessage() for r in flwr_warnings.records]
    assert line.startswith(f"round {STABLE_ROUNDS + 1}: its moves undid a clustering that had "
                           f"held for the last {STABLE_ROUNDS} evaluated rounds (split)")
    assert "partition 4 1->2" in line and "num-clusters" in line


def test_a_merge_names_the_clients_of_the_cluster_that_went() -> None:
    history = held_for(STABLE_ROUNDS, STABLE)
    history[STABLE_ROUNDS + 1] = {1: 0, 2: 0, 3: 0, 4: 0}
    event = broken_clustering(history, STABLE_ROUNDS + 1)
    assert event is not None and event.change == "merge"
    assert event.moved == {3: (1, 0), 4: (1, 0)}


def test_a_pure_relabelling_is_no_break(flwr_warnings) -> None:
    history = held_for(STABLE_ROUNDS, STABLE)
    history[STABLE_ROUNDS + 1] = {1: 1, 2: 1, 3: 0, 4: 0}
    assert partition_moves(STABLE, history[STABLE_ROUNDS + 1]) == {}
    assert warn_if_clustering_broke(history, STABLE_ROUNDS + 1, str) is None
    assert not flwr_warnings.records


def test_no_break_before_the_clustering_held_long_enough() -> None:
    history = held_for(STABLE_ROUNDS - 1, STABLE)
    history[STABLE_ROUNDS] = {1: 0, 2: 0, 3: 1, 4: 2}
    assert broken_clustering(history, STABLE_ROUNDS) is None
    # Nor when the rounds before disagreed, nor when all shared one cluster (warm-up).
    wavering = {**held_for(STABLE_ROUNDS, STABLE), 2: {1: 0, 2: 1, 3: 1, 4: 1}}
    wavering[STABLE_ROUNDS + 1] = {1: 0, 2: 0, 3: 1, 4: 2}
    assert broken_clustering(wavering, STABLE_ROUNDS + 1) is None
    warm_up = held_for(STABLE_ROUNDS, {1: 0, 2: 0, 3: 0, 4: 0})
    warm_up[STABLE_ROUNDS + 1] = STABLE
    assert broken_clustering(warm_up, STABLE_ROUNDS + 1) is None


def test_only_clients_evaluated_in_both_rounds_are_compared() -> None:
    history = held_for(STABLE_ROUNDS, STABLE)
    history[STABLE_ROUNDS + 1] = {1: 0, 3: 1, 5: 2}  # 2 and 4 not sampled, 5 is new
    assert broken_clustering(history, STABLE_ROUNDS + 1) is None


def test_the_summary_lists_every_break_with_the_moved_clients() -> None:
    history = held_for(STABLE_ROUNDS, {100: 0, 101: 1, 102: 1})
    history[STABLE_ROUNDS + 1] = {100: 0, 101: 1, 102: 0, 999: 1}
    events = broken_clusterings(history, ROWS)
    assert events == [{"round": STABLE_ROUNDS + 1, "change": "regrouping", "moved": [
        {"partition_id": 2, "node_id": 102, "from": 1, "to": 0}]}]
    # A node that sent no final report is named by its node id.
    history[STABLE_ROUNDS + 1] = {100: 0, 101: 1, 102: 1, 999: 2}
    history.update({r: {**history[r], 999: 0} for r in range(1, STABLE_ROUNDS + 1)})
    (event,) = broken_clusterings(history, ROWS)
    assert event["moved"] == [{"partition_id": None, "node_id": 999, "from": 0, "to": 2}]


def test_the_strategy_warns_from_the_round_that_broke_the_clustering(flwr_warnings) -> None:
    strategy = LocalOnly()
    strategy.assignment_history = held_for(STABLE_ROUNDS, {10: 0, 11: 0, 12: 1, 13: 1})
    clusters = {10: 0, 11: 0, 12: 1, 13: 0}
    replies = [SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=node),
        content=SimpleNamespace(metric_records={p.METRICS: MetricRecord({
            p.M_ACCURACY: 0.5, p.M_LOSS: 1.0, p.M_NUM_EXAMPLES: 10, p.M_CLUSTER: cluster})}),
    ) for node, cluster in clusters.items()]
    strategy.check_replies = lambda *args, **kwargs: replies  # type: ignore[method-assign]
    strategy.aggregate_evaluate(STABLE_ROUNDS + 1, [])
    lines = [r.getMessage() for r in flwr_warnings.records]
    assert any("(regrouping)" in line and "node 13 1->0" in line for line in lines), lines


# ------------------------------------------------------------ table and plot
def test_the_closing_table_shows_the_regret(capsys) -> None:
    summary = {"strategy": "ifca", "cluster_accuracy": [0.9, 0.8], "personalized_accuracy": 0.7,
               "num_clusters_found": 2, "ari": 0.5, "nmi": 0.5, "bytes_sent": 0,
               "bytes_received": 0, "wall_time_s": 1.0,
               **placement_fields(ROWS, PERSONAL, None)}
    print_summary(summary, Path("results"))
    out = capsys.readouterr().out
    assert "max placement regret" in out and "0.4000" in out
    assert "placement regret > 0.1" in out and "partition 2" in out


def test_the_assignment_map_marks_clients_above_the_threshold(tmp_path: Path) -> None:
    history = [[0, 1, 1], [0, 1, 1]]
    plain = plot_assignment_map(history, [0, 1, 0], tmp_path / "plain.png")
    marked = plot_assignment_map(history, [0, 1, 0], tmp_path / ASSIGNMENT_PLOT,
                                 regret=[0.0, 0.0, 0.4])
    before, after = matplotlib.image.imread(plain), matplotlib.image.imread(marked)
    assert before.shape == after.shape and not np.array_equal(before, after)


# ------------------------------------------------------------------- a real run
def test_a_real_runs_summary_holds_the_regret_per_client(tmp_path: Path, capsys) -> None:
    with in_process_server():
        summary = loopback_run({"strategy": "ifca", "plots": True}, tmp_path)
    # The closing table `flwr run .` prints (the first-run output) shows it too.
    assert "max placement regret" in capsys.readouterr().out
    regret = summary["placement_regret"]
    assert len(regret) == len(summary["per_client_accuracy"]) == NUM_CLIENTS
    assert all(0.0 <= value <= 1.0 for value in regret)
    assert summary["max_placement_regret"] == max(regret)
    assert len(summary["best_cluster"]) == NUM_CLIENTS
    assert all(0 <= cluster < summary["num_cluster_models"] for cluster in summary["best_cluster"])
    above = summary["clients_with_regret_above_threshold"]
    assert len(above) == sum(value > summary["placement_regret_threshold"] for value in regret)
    assert isinstance(summary["broken_clusterings"], list)
    assert (summary["_folder"] / ASSIGNMENT_PLOT).is_file()


def test_a_plugin_runs_summary_holds_the_same_fields(tmp_path: Path) -> None:
    settings = parse_run_config({**TINY_JOB, "min-nodes": 4})
    grid = LoopbackGrid(build_client_app(settings), 4, settings)
    strategy = IFCA(num_clusters=2, min_available_nodes=4)
    with in_process_server():
        result = strategy.start(grid=grid, initial_arrays=initial_arrays(settings),
                                num_rounds=2, train_config=train_config(settings))
        summary = write_plugin_results(tmp_path, grid, strategy, result, 2)
    assert len(summary["placement_regret"]) == len(summary["best_cluster"]) == 4
    assert summary["placement_regret_threshold"] == REGRET_THRESHOLD
    for field in ("max_placement_regret", "clients_with_regret_above_threshold",
                  "broken_clusterings"):
        assert field in summary
