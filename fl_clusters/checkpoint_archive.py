"""The checkpoint file as a container: a zip archive of parts checked by a manifest.

``checkpoint.zip`` holds three parts and no code: ``manifest.json`` (the format's
name, its version and the SHA-256 of each other part), ``state.json`` (the typed
JSON tree of :mod:`fl_clusters.state_tree`) and ``arrays.npz``. This module writes
the parts with their manifest in one atomic replace, and reads them back only from
a file that passes every check: not empty, not a pickle, a readable zip with all
three parts, a manifest of this format and version, each part's SHA-256 the one
recorded. What the parts mean is :mod:`fl_clusters.checkpoint`'s.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path

from fl_clusters.files import atomic_output
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


def read_parts(path: Path) -> dict[str, bytes]:
    """The parts of the checkpoint file at ``path``, each checked against the manifest.

    Raises
    ------
    DamagedCheckpoint
        If the file is a pickle, not a zip archive, truncated, without a manifest
        of this format and version, or a part does not match its SHA-256.
    """
    _refuse_other_files(path)
    parts = _archive_parts(path)
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


def _archive_parts(path: Path) -> dict[str, bytes]:
    """The bytes of the manifest, state and arrays parts of the zip archive at ``path``."""
    parts: dict[str, bytes] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if MANIFEST not in names:
                raise DamagedCheckpoint(f"is not an fl-clusters checkpoint (no {MANIFEST})")
            for name in (MANIFEST, STATE, ARRAYS):
                if name not in names:
                    raise DamagedCheckpoint(f"is damaged: it lacks its part {name}")
                try:
                    parts[name] = archive.read(name)
                except ZIP_ERRORS as error:
                    raise DamagedCheckpoint(
                        f"is damaged: its part {name} cannot be read ({one_line(error)})"
                    ) from None
    except ZIP_ERRORS as error:
        raise DamagedCheckpoint(
            f"is truncated or damaged: its zip directory cannot be read ({one_line(error)})"
        ) from None
    return parts


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
