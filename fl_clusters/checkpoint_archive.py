"""The checkpoint file as a container: a zip archive of parts checked by a manifest.

``checkpoint.zip`` holds three parts and no code: ``manifest.json`` (the format's
name, its version and the SHA-256 of each other part), ``state.json`` (the typed
JSON tree of :mod:`fl_clusters.state_tree`) and ``arrays.npz``. This module writes
the parts with their manifest in one atomic replace, and reads them back only from
a file that passes every check: not empty, not a pickle, a readable zip with these
three parts and nothing else, each stored uncompressed within the sizes
:class:`~fl_clusters.checkpoint_limits.CheckpointLimits` allows, a manifest of this
format and version, each part's SHA-256 the one recorded. ``arrays.npz`` is read
the same way, each array's header checked against the bytes it holds before the
array is allocated. What the parts mean is :mod:`fl_clusters.checkpoint`'s.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from zipfile import ZipInfo

import numpy as np
from numpy.lib import format as npy

from fl_clusters.checkpoint_limits import CheckpointLimits
from fl_clusters.files import atomic_output
from fl_clusters.protocol import read_npy_header
from fl_clusters.state_tree import DamagedCheckpoint

CHECKPOINT_FILE = "checkpoint.zip"
FORMAT_NAME = "fl-clusters checkpoint"
# Changes whenever what a checkpoint holds changes: another version is refused.
CHECKPOINT_VERSION = 3
MANIFEST, STATE, ARRAYS = "manifest.json", "state.json", "arrays.npz"
# The first bytes of the files a checkpoint path may hold instead of a checkpoint.
ZIP_MAGIC = b"PK\x03\x04"
PICKLE_PROTOCOLS = range(2, 6)
# What a damaged zip raises while it is read (a flipped byte in a header can make
# zipfile ask for a password or a compression method it lacks, or read past the end).
# The manifest names a format, a version and two checksums: a few hundred bytes.
MAX_MANIFEST_BYTES = 1 << 16
# A zip member's flag that says it is encrypted.
ENCRYPTED = 0x1
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, KeyError,
              ValueError, NotImplementedError, RuntimeError, struct.error, OverflowError)


def write_parts(path: Path, parts: Mapping[str, bytes]) -> None:
    """Write ``parts`` and their manifest to ``path``, replacing the file atomically.

    A process killed while writing leaves the previous file intact.
    """
    manifest = {
        "format": FORMAT_NAME,
        "version": CHECKPOINT_VERSION,
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in parts.items()},
    }
    with atomic_output(path) as out, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(MANIFEST, json.dumps(manifest, indent=2))
        for name, data in parts.items():
            archive.writestr(name, data)


def one_line(error: BaseException) -> str:
    """``error``'s message on one line."""
    return " ".join(str(error).split())


def read_parts(path: Path, limits: CheckpointLimits) -> dict[str, bytes]:
    """The parts of the checkpoint file at ``path``, each checked against the manifest.

    Raises
    ------
    DamagedCheckpoint
        If the file is a pickle, not a zip archive, truncated, larger than
        ``limits`` allow, holds other members or compressed ones, lacks a manifest
        of this format and version, or a part does not match its SHA-256.
    """
    _refuse_other_files(path)
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise DamagedCheckpoint(
            f"is refused: it is {size} bytes, more than the {limits.max_bytes} a checkpoint "
            "may be (CheckpointLimits.max_bytes); raise that limit only for a checkpoint "
            "you wrote"
        )
    parts = _archive_parts(path, limits)
    _check_manifest(parts)
    return parts


def _refuse_other_files(path: Path) -> None:
    """Refuse a file that is empty, a pickle or no zip archive, from its first bytes."""
    with path.open("rb") as source:
        head = source.read(len(ZIP_MAGIC))
    if not head:
        raise DamagedCheckpoint("is empty")
    if head[0] == 0x80 and len(head) > 1 and head[1] in PICKLE_PROTOCOLS:
        raise DamagedCheckpoint(
            "is a pickle file, which fl-clusters does not load (loading a pickle can run "
            f"any code); resume only from a {CHECKPOINT_FILE} written by fl-clusters"
        )
    if head != ZIP_MAGIC:
        raise DamagedCheckpoint("is not an fl-clusters checkpoint (not a zip archive)")


def _archive_parts(path: Path, limits: CheckpointLimits) -> dict[str, bytes]:
    """The bytes of the manifest, state and arrays parts of the zip archive at ``path``."""
    most = {MANIFEST: MAX_MANIFEST_BYTES, STATE: limits.max_state_bytes,
            ARRAYS: limits.max_bytes}
    try:
        with zipfile.ZipFile(path) as archive:
            members = _stored_members(archive, "", limits.max_bytes)
            names = set(members)
            if MANIFEST not in names:
                raise DamagedCheckpoint(f"is not an fl-clusters checkpoint (no {MANIFEST})")
            for name in (STATE, ARRAYS):
                if name not in names:
                    raise DamagedCheckpoint(f"is damaged: it lacks its part {name}")
            if names != set(most):
                raise DamagedCheckpoint(
                    f"is refused: it holds {sorted(names - set(most))}, which no fl-clusters "
                    f"checkpoint holds (only {sorted(most)})"
                )
            for name, info in members.items():
                _check_size(f"its part {name} declares", info.file_size, most[name])
            return {name: _read_member(archive, info, name) for name, info in members.items()}
    except ZIP_ERRORS as error:
        raise DamagedCheckpoint(
            f"is truncated or damaged: its zip directory cannot be read ({one_line(error)})"
        ) from None


def _stored_members(archive: zipfile.ZipFile, where: str, most: int) -> dict[str, ZipInfo]:
    """``archive``'s members by name, each once, stored, declaring ``most`` bytes in all.

    ``where`` names the archive in errors: ``""`` for the checkpoint file, the
    part's name for an archive inside it.

    Raises
    ------
    DamagedCheckpoint
        If a name repeats, a member is compressed or encrypted, or the sizes
        declared are inconsistent or more than ``most`` together.
    """
    inside = f"{where} " if where else ""
    members: dict[str, ZipInfo] = {}
    for info in archive.infolist():
        label = f"{inside}member {info.filename!r}"
        if info.filename in members:
            raise DamagedCheckpoint(f"is refused: its {label} appears twice; fl-clusters "
                                    "writes each part once")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & ENCRYPTED:
            raise DamagedCheckpoint(
                f"is refused: its {label} is compressed or encrypted; fl-clusters writes "
                "every part stored as it is, so this file is not one it wrote"
            )
        if info.compress_size != info.file_size:
            raise DamagedCheckpoint(f"is damaged: its {label} declares {info.file_size} "
                                    f"bytes but stores {info.compress_size}")
        members[info.filename] = info
    _check_size(f"its {inside}members declare", sum(i.file_size for i in members.values()), most)
    return members


def _check_size(declares: str, size: int, most: int) -> None:
    """Refuse ``size`` bytes, more than ``most``; ``declares`` says what declares them."""
    if size > most:
        raise DamagedCheckpoint(
            f"is refused: {declares} {size} bytes, more than the {most} a "
            "checkpoint may hold (CheckpointLimits); raise the limit only for a checkpoint "
            "you wrote"
        )


def _read_member(archive: zipfile.ZipFile, info: ZipInfo, name: str) -> bytes:
    """The bytes of ``archive``'s member ``info``: exactly as many as it declares."""
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except ZIP_ERRORS as error:
        raise DamagedCheckpoint(
            f"is damaged: its part {name} cannot be read ({one_line(error)})"
        ) from None
    if len(data) != info.file_size:
        raise DamagedCheckpoint(f"is damaged: its part {name} holds {len(data)} bytes, not "
                                f"the {info.file_size} it declares")
    return data


def read_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of the ``arrays.npz`` part ``data``, by key, read without pickles.

    Each array's header is read first: an array whose dtype holds Python objects,
    or whose shape needs other than the bytes it holds, is refused before any
    memory is set aside for it.

    Raises
    ------
    DamagedCheckpoint
        If ``data`` is not an npz archive fl-clusters writes, or an array in it
        is refused.
    """
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as npz:
            for name, info in _stored_members(npz, ARRAYS, len(data)).items():
                if not name.endswith(".npy"):
                    raise DamagedCheckpoint(f"is refused: its {ARRAYS} holds {name!r}, not an "
                                            "array (.npy)")
                raw = _read_member(npz, info, f"{ARRAYS} {name}")
                arrays[name.removesuffix(".npy")] = _npy_array(raw, name)
    except (*ZIP_ERRORS, TypeError) as error:
        raise DamagedCheckpoint(f"is damaged: its {ARRAYS} cannot be read "
                                f"({one_line(error)})") from None
    return arrays


def _npy_array(raw: bytes, name: str) -> np.ndarray:
    """The array of the ``.npy`` bytes ``raw``, once its header fits what ``raw`` holds."""
    source = io.BytesIO(raw)
    try:
        shape, dtype = read_npy_header(source)
    except ValueError as error:
        raise DamagedCheckpoint(f"is refused: its array {name!r}: {one_line(error)}") from error
    if dtype.hasobject:
        raise DamagedCheckpoint(f"is refused: its array {name!r} holds Python objects "
                                f"({dtype}), which a checkpoint keeps in {STATE} only")
    count = math.prod(shape)
    held = len(raw) - source.tell()
    if min(shape, default=0) < 0 or count * dtype.itemsize != held or (
            dtype.itemsize == 0 and count):
        raise DamagedCheckpoint(
            f"is refused: its array {name!r} declares shape {shape} of {dtype}, "
            f"{count * dtype.itemsize} bytes, but holds {held}"
        )
    source.seek(0)
    return npy.read_array(source, allow_pickle=False)


def _check_manifest(parts: Mapping[str, bytes]) -> None:
    """Check the manifest names this format and version and the parts' SHA-256."""
    try:
        manifest = json.loads(parts[MANIFEST])
        found_format, version = manifest["format"], manifest["version"]
        sha256 = {name: str(manifest["sha256"][name]) for name in (STATE, ARRAYS)}
    except (ValueError, KeyError, TypeError) as error:
        raise DamagedCheckpoint(
            f"is not an fl-clusters checkpoint (its {MANIFEST} is unreadable: {one_line(error)})"
        ) from None
    if found_format != FORMAT_NAME:
        raise DamagedCheckpoint(f"is not an fl-clusters checkpoint (its format is "
                                f"{found_format!r})")
    if version != CHECKPOINT_VERSION:
        raise DamagedCheckpoint(
            f"is a version-{version} fl-clusters checkpoint, and this fl-clusters reads "
            f"version {CHECKPOINT_VERSION} only; finish that run with the fl-clusters that "
            "wrote it"
        )
    for name, expected in sha256.items():
        if hashlib.sha256(parts[name]).hexdigest() != expected:
            raise DamagedCheckpoint(
                f"is damaged: checksum mismatch of its part {name} (its SHA-256 is not the "
                f"one {MANIFEST} records)"
            )
