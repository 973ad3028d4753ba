"""Hand-made checkpoints with a correct manifest: each is refused whole, in one line.

Each hostile checkpoint starts as a valid one written by fl-clusters' own writer;
it is then edited, and the manifest's SHA-256 recomputed, as an attacker would.
Its refusal must be one line naming the file, raise nothing else (no MemoryError,
no RecursionError), and leave the folder read from as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import struct
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fl_clusters import protocol as p
from fl_clusters.checkpoint import CHECKPOINT_FILE, Checkpoint
from fl_clusters.checkpoint_archive import ARRAYS, MANIFEST, STATE
from fl_clusters.checkpoint_limits import CheckpointLimits
from fl_clusters.config import parse_run_config
from fl_clusters.strategies.kit.interface import ServerStrategy
from fl_clusters.strategy_builder import build_strategy
from tests.conftest import dead_pid

SETTINGS = parse_run_config({"num-rounds": 4, "num-clusters": 2, "seed": 1})


def _models(first: np.ndarray | None = None) -> ArrayRecord:
    """Two clusters' models, packed as a clustered strategy passes them on."""
    weights = np.arange(6, dtype=np.float32).reshape(2, 3) if first is None else first
    return p.pack_clusters([ArrayRecord({"w": Array(weights)}),
                            ArrayRecord({"w": Array(np.ones((2, 3), np.float32))})])


def _write(folder: Path, server_round: Any = 2, arrays: ArrayRecord | None = None,
           strategy: ServerStrategy | None = None, client_states: Any = None) -> Path:
    """A checkpoint of a tiny IFCA run, written by fl-clusters' writer; its path."""
    return Checkpoint(
        server_round=server_round, settings=SETTINGS,
        strategy=strategy or build_strategy(SETTINGS), arrays=arrays or _models(),
        train_metrics={1: MetricRecord({"loss": 0.5})}, evaluate_metrics={},
        client_states=client_states or {}, start_nodes=[7], nodes_seen={7},
        sent={1: 10}, received={1: 20}, unanswered=0,
    ).write(folder)


def _parts(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _forge(path: Path, replace: dict[str, bytes], compressed: Sequence[str] = (),
           extra: Sequence[tuple[str, bytes]] = ()) -> None:
    """Rewrite the checkpoint with ``replace``d parts and a manifest that matches them."""
    parts = {**_parts(path), **replace}
    manifest = json.loads(parts[MANIFEST])
    manifest["sha256"] = {name: hashlib.sha256(parts[name]).hexdigest() for name in (STATE, ARRAYS)}
    parts[MANIFEST] = json.dumps(manifest).encode()
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate names forged here
        for name, data in [*parts.items(), *extra]:
            method = zipfile.ZIP_DEFLATED if name in compressed else zipfile.ZIP_STORED
            archive.writestr(name, data, compress_type=method)


def _edit_state(path: Path, old: bytes, new: bytes) -> None:
    state = _parts(path)[STATE]
    assert old in state, old
    _forge(path, {STATE: state.replace(old, new)})


def _snapshot(folder: Path) -> list[tuple[str, int, int, int]]:
    """The folder's entries with their sizes, modes and times, and the folder's own."""
    entries = [folder, *sorted(folder.iterdir())]
    return [(entry.name, entry.stat().st_size, entry.stat().st_mode, entry.stat().st_mtime_ns)
            for entry in entries]


def _refusal(path: Path, settings: Any = SETTINGS, limits: CheckpointLimits | None = None
             ) -> str:
    """The one-line message that refuses the checkpoint at ``path``; the folder is untouched."""
    before = _snapshot(path.parent)
    with pytest.raises(ValueError) as refused:
        Checkpoint.load(path, settings, limits)
    assert _snapshot(path.parent) == before
    message = str(refused.value)
    assert "\n" not in message and str(path) in message, message
    # Raised on its own: nothing chained for a traceback to show.
    error = refused.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    return message


# ------------------------------------------------------------------ 1. the zip
def test_a_compressed_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    path = _write(tmp_path)
    bomb = io.BytesIO()
    np.savez(bomb, a0=np.zeros(8 << 20, np.float32))  # 32 MB of zeros
    _forge(path, {ARRAYS: bomb.getvalue()}, compressed=[ARRAYS])
    assert path.stat().st_size < 1 << 20
    assert f"member '{ARRAYS}' is compressed" in _refusal(path)


def test_a_compressed_npz_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    npz = io.BytesIO()
    np.savez_compressed(npz, a0=np.zeros(1000, np.float32))
    _forge(path, {ARRAYS: npz.getvalue()})
    assert f"{ARRAYS} member 'a0.npy' is compressed" in _refusal(path)


def test_sizes_above_the_limits_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, arrays=_models(np.zeros((256, 1024), np.float32)))
    size = path.stat().st_size
    assert f"{size} bytes, more than the {size - 1}" in _refusal(
        path, limits=CheckpointLimits(max_bytes=size - 1))
    state = len(_parts(path)[STATE])
    assert f"part {STATE} declares {state} bytes, more than the 100" in _refusal(
        path, limits=CheckpointLimits(max_state_bytes=100))
    # The defaults hold it, and say why in their docstring.
    assert Checkpoint.load(path, SETTINGS).server_round == 2


def _central_entry(data: bytes, name: str) -> int:
    """Where ``name``'s entry starts in the zip's central directory."""
    entry = data.index(b"PK\x01\x02")
    while data[entry + 46:entry + 46 + len(name)] != name.encode():
        entry = data.index(b"PK\x01\x02", entry + 4)
    return entry


@pytest.mark.parametrize("fields", [(24,), (20, 24)], ids=["size", "both sizes"])
def test_a_size_declared_otherwise_than_stored_is_refused(
    tmp_path: Path, fields: tuple[int, ...]
) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    entry = _central_entry(bytes(data), STATE)
    for field in fields:  # 20: compressed size, 24: size
        declared, = struct.unpack_from("<I", data, entry + field)
        struct.pack_into("<I", data, entry + field, declared + 1000)
    path.write_bytes(bytes(data))
    assert STATE in _refusal(path)


def test_duplicate_and_unexpected_members_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    state = _parts(path)[STATE]
    _forge(path, {}, extra=[(STATE, state.replace(b'["server_round", 2]', b'["server_round", 1]'))])
    assert f"member '{STATE}' appears twice" in _refusal(path)
    path = _write(tmp_path)
    _forge(path, {}, extra=[("run_me.py", b"print('hello')")])
    assert "holds ['run_me.py']" in _refusal(path)


# ------------------------------------------------------------- 2. array headers
def _npy(descr: str, shape: tuple[int, ...], payload: bytes) -> bytes:
    """A ``.npy`` file whose header declares ``descr`` and ``shape``, holding ``payload``."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue() + payload


@pytest.mark.parametrize(("descr", "shape", "refusal"), [
    ("<f4", (10**12,), "declares shape (1000000000000,) of float32, 4000000000000 bytes"),
    ("<f8", (4, -1), "declares shape (4, -1)"),
    ("<f4", (100,), "declares shape (100,) of float32, 400 bytes, but holds 16"),
    ("|O", (2,), "holds Python objects"),
], ids=["10**12 values", "negative", "short", "objects"])
def test_an_array_header_that_does_not_fit_its_bytes_is_refused_unallocated(
    tmp_path: Path, descr: str, shape: tuple[int, ...], refusal: str
) -> None:
    path = _write(tmp_path)
    with zipfile.ZipFile(io.BytesIO(_parts(path)[ARRAYS])) as npz:
        members = {name: npz.read(name) for name in npz.namelist()}
    members["a0.npy"] = _npy(descr, shape, bytes(16))
    npz_bytes = io.BytesIO()
    with zipfile.ZipFile(npz_bytes, "w") as npz:
        for name, data in members.items():
            npz.writestr(name, data)
    _forge(path, {ARRAYS: npz_bytes.getvalue()})
    assert f"array 'a0.npy' {refusal}" in _refusal(path)


# ------------------------------------------------------- 3. and 9. model arrays
@pytest.mark.parametrize("dtype", [np.complex64, np.int64, np.bool_])
def test_a_model_array_of_another_dtype_is_refused_naming_it(
    tmp_path: Path, dtype: type
) -> None:
    path = _write(tmp_path, arrays=_models(np.ones((2, 3), dtype)))
    assert f"model array 'cluster-0/w' is of dtype {np.dtype(dtype)}" in _refusal(path)
    kept = RecordDict({"own": ArrayRecord({"head": Array(np.ones(3, dtype))})})
    path = _write(tmp_path, client_states={5: kept})
    assert "model array 'head'" in _refusal(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_cluster_model_that_is_not_finite_is_refused_naming_the_array(
    tmp_path: Path, bad: float
) -> None:
    weights = np.zeros((2, 3), np.float32)
    weights[1, 2] = bad
    path = _write(tmp_path, arrays=_models(weights))
    assert "cluster model array 'cluster-0/w' (in arrays) holds NaN" in _refusal(path)
    strategy = build_strategy(SETTINGS)
    strategy._current = _models(weights)  # type: ignore[attr-defined]
    path = _write(tmp_path, strategy=strategy)
    assert "'cluster-0/w' (in strategy attribute _current)" in _refusal(path)


# ------------------------------------------------------------------- 4. depth
def test_a_tree_nested_too_deep_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    _edit_state(path, b'["unanswered", 0]',
                b'["unanswered", ' + b'{"$tuple": [' * 400 + b"1" + b"]}" * 400 + b"]")
    assert "nests deeper than 64 levels" in _refusal(path)
    path = _write(tmp_path)
    _edit_state(path, b'["unanswered", 0]',
                b'["unanswered", ' + b"[" * 100_000 + b"]" * 100_000 + b"]")
    assert "RecursionError" in _refusal(path)


def test_the_depth_limit_leaves_room_above_every_checkpoint_written(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert Checkpoint.load(path, SETTINGS, CheckpointLimits(max_depth=8)).server_round == 2


# --------------------------------------------------------- 5. and 7. attributes
def _strategy_with(**attributes: Any) -> ServerStrategy:
    strategy = build_strategy(SETTINGS)
    vars(strategy).update(attributes)
    return strategy


@pytest.mark.parametrize(("attributes", "refusal"), [
    ({"configure_train": 3}, "'configure_train' would replace the method"),
    ({"summary": [1]}, "'summary' would replace the method"),
    ({"assignments": [1, 2]}, "'assignments' is of type list, where the strategy holds one "
                              "of type dict"),
    ({"_idle_rounds": [0, 0]}, "'_idle_rounds' is of type list, where the strategy holds one "
                               "of type ndarray"),
    ({"nodes": {}}, "'nodes' is of type dict, where the strategy holds one of type NodeRegistry"),
    ({"rng": 5}, "'rng' is of type int, where the strategy holds one of type Generator"),
    ({"failed_rounds": "0"}, "'failed_rounds' is of type str, where the strategy holds one "
                             "of type int"),
], ids=lambda value: str(value)[:20])
def test_an_attribute_that_does_not_fit_the_strategy_is_refused_naming_it(
    tmp_path: Path, attributes: dict[str, Any], refusal: str
) -> None:
    path = _write(tmp_path, strategy=_strategy_with(**attributes))
    assert refusal in _refusal(path)


def test_attributes_that_fit_load(tmp_path: Path) -> None:
    # A number stays a number (numpy's too), a class default set later loads.
    strategy = _strategy_with(failed_rounds=np.int64(1), round_timeout=60, final_round=4)
    loaded = Checkpoint.load(_write(tmp_path, strategy=strategy), SETTINGS).strategy
    assert loaded.failed_rounds == 1 and loaded.final_round == 4  # type: ignore[attr-defined]


def test_a_setting_flower_holds_is_not_hidden(tmp_path: Path) -> None:
    settings = parse_run_config({"strategy": "fedavg", "num-rounds": 4})
    strategy = build_strategy(settings)
    vars(strategy)["fraction_train"] = 0.01
    path = Checkpoint(2, settings, strategy, ArrayRecord(), {}, {}, {}, [], set(), {}, {}, 0
                      ).write(tmp_path)
    assert "'fraction_train' would hide the setting" in _refusal(path, settings)


def test_a_state_of_another_strategy_is_refused_before_the_federation(tmp_path: Path) -> None:
    cfl = build_strategy(parse_run_config({"strategy": "cfl", "num-rounds": 4}))
    path = _write(tmp_path, strategy=cfl)
    assert "holds a 'fl_clusters.strategies.cfl:CFL' strategy, but its run config builds a " \
        "'fl_clusters.strategies.ifca:IFCA'" in _refusal(path)
    # The class it names forged to the one the run config builds: the state still tells.
    _edit_state(path, b'"fl_clusters.strategies.cfl:CFL"', b'"fl_clusters.strategies.ifca:IFCA"')
    assert "its state lacks the attributes ['_current'" in _refusal(path)


# -------------------------------------------------------------------- 6. round
@pytest.mark.parametrize(("server_round", "refusal"), [
    (-5, "its server_round is -5"),
    (2.5, "field server_round is of type float, not int"),
    (True, "field server_round is of type bool, not int"),
])
def test_a_round_that_is_not_a_round_is_refused(
    tmp_path: Path, server_round: Any, refusal: str
) -> None:
    assert refusal in _refusal(_write(tmp_path, server_round=server_round))


def test_a_round_past_num_rounds_names_the_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, server_round=7)
    assert "set num-rounds >= 7" in _refusal(path)


def test_a_field_of_another_type_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    _edit_state(path, b'["start_nodes", [7]]', b'["start_nodes", {"$set": [7]}]')
    assert "field start_nodes is of type set, not list" in _refusal(path)
    path = _write(tmp_path)
    _edit_state(path, b'["sent", {"$dict": [[1, 10]]}]', b'["sent", {"$dict": [[1, "x"]]}]')
    assert "field sent does not map int to int" in _refusal(path)
    path = _write(tmp_path)
    _edit_state(path, b'["seed", 1]', b'["seed", {"$array": "a0"}]')
    assert "field settings is not a run config" in _refusal(path)


# ------------------------------------------------------- 8. reading writes nothing
def test_reading_a_read_only_folder_with_a_stale_partial_changes_nothing(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "run"
    _write(folder)
    stale = folder / f".{CHECKPOINT_FILE}.{dead_pid()}.partial"
    stale.write_bytes(b"half a checkpoint")
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = _snapshot(folder)
        # As root a mode stops nothing: that the listing and times are the same does.
        assert Checkpoint.load(folder, SETTINGS).server_round == 2
        assert _snapshot(folder) == before and stale.exists()
    finally:
        folder.chmod(stat.S_IRWXU)
    # The run's own next write there removes what the dead writer left.
    _write(folder)
    assert sorted(os.listdir(folder)) == [CHECKPOINT_FILE]
