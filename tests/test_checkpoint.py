"""Checkpoint and resume: a resumed run ends exactly where the uninterrupted run ends."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fl_clusters.checkpoint import CHECKPOINT_FILE, Checkpoint, remap_node_ids
from fl_clusters.config import parse_run_config
from fl_clusters.strategies.ifca import IFCA
from tests.conftest import Federation

OLD_A, OLD_B, NEW_A, NEW_B = 2**63 + 11, 2**62 + 7, 2**61 + 5, 2**60 + 3
COMPARED = ("ari", "personalized_accuracy", "per_client_accuracy", "cluster_accuracy",
            "num_clusters_found", "assignment_history", "cluster_accuracy_history")


@dataclasses.dataclass
class _Split:
    members: list[int]
    cluster: int


def test_remap_node_ids_moves_ids_everywhere_and_leaves_small_numbers() -> None:
    mapping = {OLD_A: NEW_A, OLD_B: NEW_B}
    state = {
        "assignments": {OLD_A: 1, OLD_B: 0},
        "history": {3: {OLD_A: 2}},
        "asked": {OLD_A},
        "order": [OLD_B, OLD_A, 5],
        "split": _Split([OLD_A, OLD_B], 1),
        "ids": np.array([OLD_A, 3], dtype=object),
        "labels": np.array([0, 1, 1]),
        "flag": True,
    }
    moved = remap_node_ids(state, mapping)
    assert moved["assignments"] == {NEW_A: 1, NEW_B: 0}
    assert moved["history"] == {3: {NEW_A: 2}}
    assert moved["asked"] == {NEW_A}
    assert moved["order"] == [NEW_B, NEW_A, 5]
    assert moved["split"] == _Split([NEW_A, NEW_B], 1)
    assert moved["ids"].tolist() == [NEW_A, 3]
    assert moved["labels"].tolist() == [0, 1, 1]
    assert moved["flag"] is True


def _checkpoint(settings: dict[str, Any], server_round: int = 2) -> Checkpoint:
    return Checkpoint(
        server_round=server_round, settings=settings, strategy=IFCA(num_clusters=2),
        arrays=ArrayRecord(), train_metrics={}, evaluate_metrics={},
        client_states={}, start_nodes=[], nodes_seen=set(), sent={}, received={}, unanswered=0,
    )


def test_resume_from_a_folder_without_checkpoint_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint-every > 0"):
        Checkpoint.load(tmp_path, parse_run_config({"num-rounds": 4}))


def test_resume_with_other_settings_is_refused_but_more_rounds_are_allowed(
    tmp_path: Path,
) -> None:
    _checkpoint(parse_run_config({"num-rounds": 2, "seed": 1})).write(tmp_path)
    with pytest.raises(ValueError, match=r"seed=1 \(now 2\)"):
        Checkpoint.load(tmp_path, parse_run_config({"num-rounds": 4, "seed": 2}))
    with pytest.raises(ValueError, match="num-rounds >= 2"):
        Checkpoint.load(tmp_path / CHECKPOINT_FILE, parse_run_config({"num-rounds": 1, "seed": 1}))
    loaded = Checkpoint.load(tmp_path, parse_run_config({"num-rounds": 9, "seed": 1}))
    assert loaded.server_round == 2 and isinstance(loaded.strategy, IFCA)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        Checkpoint.load(tmp_path, parse_run_config({}))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [
    {"strategy": "ifca", "num-clusters": 4},
    # CFL's split tree must survive: it splits in round 3 here, after the checkpoint.
    {"strategy": "cfl"},
    # FedSoft's clients keep their own model between rounds: it travels in the
    # checkpoint and goes back to them on resume.
    {"strategy": "fedsoft", "num-clusters": 2},
    {"strategy": "fedavg"},
], ids=lambda strategy: strategy["strategy"])
def test_a_resumed_run_ends_exactly_like_the_uninterrupted_one(
    federation: Federation, strategy: dict[str, Any]
) -> None:
    settings = {**strategy, "seed": 3, "fraction-train": 0.5}
    # The interrupted run: its last checkpoint is round 2 (a later crash loses nothing
    # more than the rounds after it).
    stopped = federation({**settings, "num-rounds": 2, "checkpoint-every": 2}, num_clients=8)
    assert (stopped["_folder"] / CHECKPOINT_FILE).is_file()
    resumed = federation(
        {**settings, "num-rounds": 4, "resume-from": str(stopped["_folder"])}, num_clients=8
    )
    whole = federation({**settings, "num-rounds": 4}, num_clients=8)
    assert resumed["resumed_after_round"] == 2 and whole["resumed_after_round"] is None
    for field in COMPARED:
        assert resumed.get(field) == whole.get(field), field
    # Every round's metrics, those before the interruption included (bytes differ:
    # the resumed run also asked for keys and gave the clients their state back).
    rounds = [
        [{k: line[k] for k in ("round", "train", "evaluate")} for line in map(
            json.loads, (run["_folder"] / "rounds.jsonl").read_text().splitlines())]
        for run in (resumed, whole)
    ]
    assert len(rounds[0]) == 4 and all(line["evaluate"] for line in rounds[0])
    assert rounds[0] == rounds[1]
    # Round times are known for the rounds this process ran, not those before the resume.
    seconds = [json.loads(line)["seconds"] for line in
               (resumed["_folder"] / "rounds.jsonl").read_text().splitlines()]
    assert seconds[:2] == [None, None] and all(s > 0 for s in seconds[2:])
    models = [np.load(run["_folder"] / "models.npz") for run in (resumed, whole)]
    assert sorted(models[0].files) == sorted(models[1].files)
    for key in models[0].files:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)
