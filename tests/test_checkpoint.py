"""Checkpoint and resume: a resumed run ends exactly where the uninterrupted run ends."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import pickle
import random
import signal
import struct
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_clusters.checkpoint import CHECKPOINT_FILE, Checkpoint, remap_node_ids
from fl_clusters.checkpoint_archive import ARRAYS, CHECKPOINT_VERSION, MANIFEST, STATE
from fl_clusters.client_app import build_client_app
from fl_clusters.config import parse_run_config
from fl_clusters.loopback import LoopbackGrid
from fl_clusters.results import load_models
from fl_clusters.server_app import run_federation
from fl_clusters.strategies.ifca import IFCA
from fl_clusters.strategies.kit.registry import strategy_names
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import Federation, dead_pid

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
        server_round=server_round, settings=settings, strategy=build_strategy(settings),
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
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not an fl-clusters checkpoint"):
        Checkpoint.load(tmp_path, parse_run_config({}))


# ------------------------------------------------------------ format and damage
def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: types, array bits, generator states, attributes."""
    if type(a) is not type(b):
        return [f"{where}: {type(a).__name__} != {type(b).__name__}"]
    if isinstance(a, np.ndarray):
        same = a.dtype == b.dtype and a.shape == b.shape and (
            a.tolist() == b.tolist() if a.dtype.kind == "O"
            else np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        return [] if same else [f"{where}: arrays differ"]
    if isinstance(a, np.random.Generator):
        return _differences(a.bit_generator.state, b.bit_generator.state, f"{where}.state")
    if isinstance(a, random.Random):
        return [] if a.getstate() == b.getstate() else [f"{where}: random states differ"]
    if isinstance(a, ArrayRecord):
        return _differences({k: v.numpy() for k, v in a.items()},
                            {k: v.numpy() for k, v in b.items()}, where)
    if isinstance(a, Mapping):
        if list(a) != list(b):
            return [f"{where}: keys {list(a)} != {list(b)}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and math.isnan(a):
        return [] if math.isnan(b) else [f"{where}: nan != {b!r}"]
    if hasattr(a, "__dict__") and not callable(a):
        return _differences(vars(a), vars(b), where)
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def _checkpoint_differences(written: Checkpoint, loaded: Checkpoint) -> list[str]:
    """What ``loaded`` lacks or has otherwise than ``written``, its strategy included."""
    found = [d for f in dataclasses.fields(Checkpoint) if f.name != "strategy"
             for d in _differences(getattr(written, f.name), getattr(loaded, f.name), f.name)]
    if type(written.strategy) is not type(loaded.strategy):
        return [*found, f"strategy: {type(loaded.strategy).__name__}"]
    if set(vars(written.strategy)) != set(vars(loaded.strategy)):
        found.append(f"strategy attributes: {sorted(vars(loaded.strategy))}")
    kept = written.strategy.checkpoint_state()
    found += _differences(kept, {k: vars(loaded.strategy)[k] for k in kept}, "strategy")
    # What is not kept (Flower's own strategy) is rebuilt from the run config.
    return found + [d for name in set(vars(written.strategy)) - set(kept)
                    for d in _differences(vars(written.strategy)[name],
                                          vars(loaded.strategy)[name], f"strategy.{name}")]


def test_differences_sees_a_changed_value_anywhere() -> None:
    state = {"rng": np.random.default_rng(1), "ids": {OLD_A: np.arange(3.0)}, "x": float("nan")}
    assert _differences(state, {**state}) == []
    assert _differences(state, {**state, "rng": np.random.default_rng(2)}) != []
    assert _differences(state, {**state, "ids": {OLD_A: np.array([0.0, 1.0, 2.5])}}) != []
    assert _differences(state, {**state, "x": 1.0}) != []


def _rich_checkpoint(server_round: int = 2) -> Checkpoint:
    """A checkpoint with every kind of value: records, nan, bytes, 64-bit node ids."""
    settings = parse_run_config({"num-rounds": 9, "num-clusters": 2, "seed": 1})
    strategy = build_strategy(settings)
    strategy.rng.random(3)  # type: ignore[attr-defined]
    # What a strategy may hold beyond IFCA's own state.
    strategy.extras = {  # type: ignore[attr-defined]
        "scalars": (np.float64("nan"), np.int64(-3), np.uint64(2**64 - 1), np.bool_(True)),
        "ids": np.array([OLD_A, 7], dtype=object), "float_ids": {0.5: {OLD_B}},
        "frozen": frozenset({1, 2}), "inf": float("-inf"), "text": np.array(["a", "bc"]),
    }
    model = ArrayRecord({"w": Array(np.arange(12, dtype=np.float32).reshape(3, 4)),
                         "b": Array(np.array([np.nan, np.inf, -1.0]))})
    return Checkpoint(
        server_round=server_round, settings=settings, strategy=strategy, arrays=model,
        train_metrics={1: MetricRecord({"train-loss": 0.5, "sizes": [3, 1]})},
        evaluate_metrics={1: MetricRecord({"accuracy": float("nan")})},
        client_states={OLD_A: RecordDict({"own": model, "kept": ConfigRecord(
            {"note": "ok", "raw": b"\x00\x80", "flags": [True, False]})})},
        start_nodes=[OLD_A, OLD_B], nodes_seen={OLD_A, OLD_B, NEW_A},
        sent={1: 100}, received={1: 250}, unanswered=1,
    )


def _part_offset(path: Path, name: str) -> tuple[int, int]:
    """Where part ``name``'s bytes start in the checkpoint file, and how many there are."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    header = path.read_bytes()[info.header_offset:info.header_offset + 30]
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_length + extra_length, info.compress_size


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite(path: Path, replace: dict[str, bytes]) -> None:
    """Put the checkpoint back together with some parts replaced, as an editor would."""
    with zipfile.ZipFile(path) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {**parts, **replace}.items():
            archive.writestr(name, data)


def _refusal(path: Path, settings: dict[str, Any]) -> str:
    """The one-line message that refuses the checkpoint at ``path``."""
    with pytest.raises(ValueError) as refused:
        Checkpoint.load(path, settings)
    message = str(refused.value)
    assert "\n" not in message and str(path) in message, message
    return message


@pytest.mark.parametrize("part", [MANIFEST, STATE, ARRAYS])
def test_a_flipped_byte_in_any_part_is_refused_naming_the_part(tmp_path: Path, part: str) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    start, size = _part_offset(path, part)
    _flip(path, start + size // 2)
    assert part in _refusal(path, written.settings)


def test_a_part_edited_without_its_checksum_is_refused(tmp_path: Path) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    with zipfile.ZipFile(path) as archive:
        state = archive.read(STATE)
    # A valid state with another round: only the manifest's SHA-256 tells.
    edited = state.replace(b'["server_round", 2]', b'["server_round", 1]')
    assert edited != state
    _rewrite(path, {STATE: edited})
    assert f"checksum mismatch of its part {STATE}" in _refusal(path, written.settings)


def test_every_flipped_byte_is_refused_or_changes_nothing(tmp_path: Path) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    original = path.read_bytes()
    refused = 0
    # Every 29th byte: ~200 loads, headers and every part included.
    for offset in range(0, len(original), 29):
        _flip(path, offset)
        try:
            loaded = Checkpoint.load(path, written.settings)
        except ValueError as error:
            assert "\n" not in str(error) and str(path) in str(error), (offset, error)
            refused += 1
        else:
            # A byte no check covers (a time stamp in a zip header) changes no value.
            assert _checkpoint_differences(written, loaded) == [], offset
        path.write_bytes(original)
    assert refused > 0.9 * len(range(0, len(original), 29))


@pytest.mark.parametrize("size", [0, 0.5, -1])
def test_a_truncated_checkpoint_is_refused(tmp_path: Path, size: float) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:int(size * len(data)) if size >= 0 else len(data) - 1])
    assert ("is empty" if size == 0 else "truncated") in _refusal(path, written.settings)


class _Trap:
    """A pickle that, if loaded, leaves a file behind: the code a pickle can run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("name", [CHECKPOINT_FILE, "checkpoint.pkl"])
def test_a_pickle_where_the_checkpoint_is_is_refused_unopened(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "code-ran"
    (tmp_path / name).write_bytes(pickle.dumps(_Trap(marker)))
    with pytest.raises(ValueError, match=f"{name} is a pickle file") as refused:
        Checkpoint.load(tmp_path, parse_run_config({}))
    assert "\n" not in str(refused.value)
    assert not marker.exists()


def test_a_checkpoint_of_another_format_version_is_refused(tmp_path: Path) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read(MANIFEST))
    _rewrite(path, {MANIFEST: json.dumps({**manifest, "version": CHECKPOINT_VERSION - 1})
                    .encode()})
    assert f"version-{CHECKPOINT_VERSION - 1}" in _refusal(path, written.settings)
    _rewrite(path, {MANIFEST: json.dumps({**manifest, "format": "other"}).encode()})
    assert "not an fl-clusters checkpoint" in _refusal(path, written.settings)


@pytest.mark.parametrize("forged", ["antigravity:geohash", "fl_clusters.sweep.__main__:main"])
def test_a_state_naming_a_class_outside_fl_clusters_is_refused_unimported(
    tmp_path: Path, forged: str
) -> None:
    written = _rich_checkpoint()
    path = written.write(tmp_path)
    with zipfile.ZipFile(path) as archive:
        manifest, state = json.loads(archive.read(MANIFEST)), archive.read(STATE)
    # A file whose checksums were recomputed: the classes it names are still checked,
    # and a module it names is not imported (importing either one runs code).
    edited = state.replace(b'"fl_clusters.handshake:NodeRegistry"', f'"{forged}"'.encode())
    assert edited != state
    manifest["sha256"][STATE] = hashlib.sha256(edited).hexdigest()
    _rewrite(path, {MANIFEST: json.dumps(manifest).encode(), STATE: edited})
    assert f"{forged!r}, not one of fl-clusters'" in _refusal(path, written.settings)
    assert forged.partition(":")[0] not in sys.modules


def test_a_checkpoint_loads_back_equal(tmp_path: Path) -> None:
    written = _rich_checkpoint()
    loaded = Checkpoint.load(written.write(tmp_path), written.settings)
    assert _checkpoint_differences(written, loaded) == []
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]


def test_a_write_that_fails_midway_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rich_checkpoint(server_round=1).write(tmp_path)
    writestr = zipfile.ZipFile.writestr
    written: list[str] = []

    def fail_after_the_first_part(archive: zipfile.ZipFile, name: Any, data: Any) -> None:
        if written:
            raise OSError("No space left on device")
        written.append(name)
        writestr(archive, name, data)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", fail_after_the_first_part)
    with pytest.raises(OSError, match="No space left"):
        _rich_checkpoint(server_round=2).write(tmp_path)
    monkeypatch.undo()
    assert written and Checkpoint.load(tmp_path, _rich_checkpoint().settings).server_round == 1
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]


def test_a_strategy_attribute_a_checkpoint_cannot_keep_fails_the_write_naming_it(
    tmp_path: Path,
) -> None:
    _rich_checkpoint(server_round=1).write(tmp_path)
    written = _rich_checkpoint()
    written.strategy.score = lambda node: node  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"\['state'\]\['score'\] is a builtins.function"):
        written.write(tmp_path)
    assert Checkpoint.load(tmp_path, written.settings).server_round == 1


def _write_rounds_forever(folder: Path, ready: int) -> None:
    """Write checkpoints of rounds 1, 2, ... to ``folder``, saying each round on ``ready``."""
    settings = parse_run_config({"num-rounds": 1000})
    strategy = build_strategy(settings)
    for server_round in itertools.count(1):
        arrays = ArrayRecord({"w": Array(np.full(1_000_000, server_round, np.float32))})
        os.write(ready, f"{server_round}\n".encode())
        Checkpoint(server_round, settings, strategy, arrays, {}, {}, {}, [], set(), {}, {}, 0
                   ).write(folder)


def test_a_process_killed_while_writing_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    ready, told = os.pipe()
    # A forked writer: it starts at once, with everything already imported.
    writer = os.fork()
    if writer == 0:
        try:
            os.close(ready)
            _write_rounds_forever(tmp_path, told)
        finally:
            os._exit(1)
    os.close(told)
    with os.fdopen(ready) as lines:
        # "3": round 2 is on disk and round 3 is being written.
        while (line := lines.readline().strip()) != "3":
            assert line, "the writer stopped before its third checkpoint"
        os.kill(writer, signal.SIGKILL)
    os.waitpid(writer, 0)
    loaded = Checkpoint.load(tmp_path, parse_run_config({"num-rounds": 1000}))
    assert loaded.server_round in (2, 3)
    assert (loaded.arrays["w"].numpy() == loaded.server_round).all()
    # Reading leaves the folder alone; the next write removes what the killed writer left.
    assert CHECKPOINT_FILE in os.listdir(tmp_path)
    loaded.write(tmp_path)
    assert os.listdir(tmp_path) == [CHECKPOINT_FILE]


def test_a_write_removes_what_a_dead_writer_left_and_keeps_a_live_ones(tmp_path: Path) -> None:
    dead = tmp_path / f".{CHECKPOINT_FILE}.{dead_pid()}.partial"
    live = tmp_path / f".{CHECKPOINT_FILE}.{os.getppid()}.partial"
    other_file = tmp_path / f".models.npz.{dead_pid()}.partial"
    for partial in (dead, live, other_file):
        partial.write_bytes(b"half a checkpoint")
    _rich_checkpoint().write(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([CHECKPOINT_FILE, live.name, other_file.name])


@pytest.mark.parametrize("name", strategy_names())
def test_every_strategy_as_built_loads_back_equal(tmp_path: Path, name: str) -> None:
    written = _rich_checkpoint()
    written.settings = parse_run_config({"strategy": name, "num-rounds": 9})
    written.strategy = build_strategy(written.settings)
    loaded = Checkpoint.load(written.write(tmp_path), written.settings)
    assert _checkpoint_differences(written, loaded) == []


@pytest.mark.slow
@pytest.mark.usefixtures("server_identity")
@pytest.mark.parametrize("name", strategy_names())
def test_every_strategy_loads_back_equal_after_two_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    differences: list[list[str]] = []
    write = Checkpoint.write

    def write_and_compare(checkpoint: Checkpoint, folder: Path) -> Path:
        path = write(checkpoint, folder)
        differences.append(_checkpoint_differences(
            checkpoint, Checkpoint.load(path, checkpoint.settings)))
        return path

    monkeypatch.setattr(Checkpoint, "write", write_and_compare)
    settings = parse_run_config({
        "strategy": name, "dataset": "digits", "num-clusters": 2, "num-rounds": 2,
        "checkpoint-every": 2, "local-steps": 2, "plots": False, "seed": 0, "min-nodes": 4,
        # ACFL's phase 1 must end within the run (its start refuses otherwise): round 2
        # clusters, so its checkpoint holds the clusters too.
        "acfl-phase1-rounds": 1, "results-dir": str(tmp_path),
    })
    run_federation(LoopbackGrid(build_client_app(settings), 4, settings), settings)
    assert differences == [[]]


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
    models = [load_models(run["_folder"]) for run in (resumed, whole)]
    assert sorted(models[0]) == sorted(models[1])
    for key in models[0]:
        np.testing.assert_array_equal(models[0][key], models[1][key], err_msg=key)
