"""The pickle-free tree a checkpoint stores a strategy's state as.

:class:`StateWriter` turns a strategy's attributes (and the rest of a
:class:`~fl_clusters.checkpoint.Checkpoint`) into a typed JSON tree, with its
numpy arrays collected apart for ``arrays.npz``; :class:`StateReader` rebuilds
the values from that tree and those arrays. Every JSON object in the tree has one
key naming the type it stands for (``$dict``, ``$tuple``, ``$array``...): tuples,
sets, dicts with any keys, non-finite floats, bytes, numpy scalars and arrays,
Flower's records, numpy and Python random generators, fl-clusters' own objects.

Reading rebuilds those types and no other. A nested object is created only for a
class of an ``fl_clusters.`` module already imported, found in that module's
namespace, and gets back its attributes without its constructor running: the
names a file holds are data, so reading one imports no module and runs no code
it names (the reason the checkpoint holds no pickle). A tree that names anything
else is refused as a damaged checkpoint. The file around the tree (zip parts,
manifest, checksums) is :mod:`fl_clusters.checkpoint_archive`'s.
"""

from __future__ import annotations

import base64
import math
import random
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_clusters.checkpoint_limits import CheckpointLimits

# Kinds of numpy scalars the tree keeps (bool, int, uint, float). Arrays of any
# dtype but object go to arrays.npz; object arrays go to the tree item by item.
SCALAR_KINDS = "biuf"
# Numpy's bit generators, by the name their state records.
BIT_GENERATORS: dict[str, Callable[[], np.random.BitGenerator]] = {
    "PCG64": np.random.PCG64, "PCG64DXSM": np.random.PCG64DXSM,
    "MT19937": np.random.MT19937, "Philox": np.random.Philox, "SFC64": np.random.SFC64,
}
# What a malformed tree raises while it is rebuilt.
TREE_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError)


class DamagedCheckpoint(Exception):
    """What is wrong with a checkpoint file, without the file's name."""


def qualified_name(cls: type) -> str:
    """``module:qualname`` of ``cls``, as the state tree names a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def own_class(name: str) -> type:
    """The fl-clusters class ``name`` (``module:qualname``) names.

    Only modules of the ``fl_clusters`` package already imported are searched, by
    their namespace: reading a file imports nothing and runs no module code.

    Raises
    ------
    DamagedCheckpoint
        If ``name`` is not a class of an imported fl-clusters module.
    """
    module_name, _, qualname = name.partition(":")
    found: Any = sys.modules.get(module_name) if module_name.startswith("fl_clusters.") else None
    for part in qualname.split("."):
        found = vars(found).get(part) if hasattr(found, "__dict__") else None
    if not isinstance(found, type) or found.__module__ != module_name:
        raise DamagedCheckpoint(f"its state names class {name!r}, not one of fl-clusters'")
    return found


def is_own_object(value: Any) -> bool:
    """Whether ``value`` is an instance of an fl-clusters class with attributes."""
    return (type(value).__module__.startswith("fl_clusters.") and hasattr(value, "__dict__")
            and not isinstance(value, type))


class StateWriter:
    """Turns a Python value into a JSON tree, collecting its numpy arrays apart.

    Every JSON object in the tree has one key naming the type it stands for
    (``$dict``, ``$tuple``, ``$array``...); JSON lists, strings, numbers, booleans
    and null stand for themselves.
    """

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, value: np.ndarray) -> str:
        """Keep ``value`` for ``arrays.npz``; its key there."""
        key = f"a{len(self.arrays)}"
        self.arrays[key] = value
        return key

    def tree(self, value: Any, where: str) -> Any:
        """The JSON tree of ``value``; ``where`` names it in errors.

        Raises
        ------
        TypeError
            If ``value`` holds something a checkpoint cannot keep (a function, an
            object of another library).
        """
        kind = type(value)
        if value is None or kind in (bool, str, int):
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if kind is list:
            return [self.tree(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if kind in (tuple, set, frozenset):
            items = sorted(value, key=repr) if kind is not tuple else value
            return {f"${kind.__name__}": [self.tree(item, f"{where}[]") for item in items]}
        if kind is dict:
            return {"$dict": [[self.tree(k, f"{where} key"), self.tree(v, f"{where}[{k!r}]")]
                              for k, v in value.items()]}
        if kind is bytes:
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        if isinstance(value, np.generic) and value.dtype.kind in SCALAR_KINDS:
            return {"$scalar": [value.dtype.str, self.tree(value.item(), where)]}
        if kind is np.ndarray:
            if value.dtype.kind == "O":
                return {"$objects": [list(value.shape),
                                     self.tree(value.ravel().tolist(), f"{where} items")]}
            return {"$array": self.array(value)}
        if kind is ArrayRecord:
            return {"$ArrayRecord": [[name, self.array(array.numpy())]
                                     for name, array in value.items()]}
        if kind in (MetricRecord, ConfigRecord):
            return {f"${kind.__name__}": self.tree(dict(value), where)}
        if kind is RecordDict:
            return {"$RecordDict": [[name, self.tree(record, f"{where}[{name!r}]")]
                                    for name, record in value.items()]}
        if kind is np.random.Generator:
            return {"$Generator": self.tree(value.bit_generator.state, f"{where} state")}
        if kind is random.Random:
            return {"$Random": self.tree(value.getstate(), f"{where} state")}
        if is_own_object(value):
            return {"$object": [qualified_name(kind), self.tree(dict(vars(value)), where)]}
        raise TypeError(
            f"checkpoint: {where} is a {kind.__module__}.{kind.__qualname__}, which a "
            "checkpoint cannot keep (it keeps numbers, strings, bytes, containers of them, "
            "numpy arrays and generators, Flower's records and fl-clusters' own objects)"
        )


class StateReader:
    """Rebuilds the values a :class:`StateWriter` turned into a JSON tree.

    Parameters
    ----------
    arrays : Mapping[str, np.ndarray]
        The arrays of ``arrays.npz``, by key.
    max_depth : int
        How many containers deep the tree may nest: a deeper one is refused
        before Python's recursion limit is reached (default: that of
        :class:`~fl_clusters.checkpoint_limits.CheckpointLimits`).
    """

    def __init__(self, arrays: Mapping[str, np.ndarray],
                 max_depth: int = CheckpointLimits.max_depth) -> None:
        self.arrays = arrays
        self.max_depth = max_depth
        self._depth = 0
        # What each tag's body is read as; a tag not here is refused.
        self._readers: dict[str, Callable[[Any], Any]] = {
            "$float": self._float,
            "$tuple": partial(self._collection, tuple),
            "$set": partial(self._collection, set),
            "$frozenset": partial(self._collection, frozenset),
            "$dict": self._dict,
            "$bytes": self._bytes,
            "$scalar": self._scalar,
            "$array": self._array,
            "$objects": self._objects,
            "$ArrayRecord": self._array_record,
            "$MetricRecord": self._metric_record,
            "$ConfigRecord": self._config_record,
            "$RecordDict": self._record_dict,
            "$Generator": self._generator,
            "$Random": self._random,
            "$object": self._object,
        }

    def value(self, tree: Any) -> Any:
        """The value ``tree`` stands for.

        Raises
        ------
        DamagedCheckpoint
            If ``tree`` is not a tree :class:`StateWriter` writes, or nests deeper
            than ``max_depth``.
        """
        if tree is None or type(tree) in (bool, str, int, float):
            return tree
        if self._depth >= self.max_depth:
            raise DamagedCheckpoint(
                f"is refused: its state nests deeper than {self.max_depth} levels, which no "
                "strategy's state does (CheckpointLimits.max_depth)"
            )
        self._depth += 1
        try:
            return self._node(tree)
        finally:
            self._depth -= 1

    def _node(self, tree: Any) -> Any:
        """The value of ``tree``, a list or a tagged object."""
        if type(tree) is list:
            return [self.value(item) for item in tree]
        if type(tree) is not dict or len(tree) != 1:
            raise DamagedCheckpoint(f"its state holds an unknown node {str(tree)[:60]!r}")
        (tag, body), = tree.items()
        reader = self._readers.get(tag)
        if reader is None:
            raise DamagedCheckpoint(f"its state holds an unknown node type {tag!r}")
        return reader(body)

    def _float(self, body: Any) -> float:
        if body not in ("nan", "inf", "-inf"):
            raise DamagedCheckpoint(f"its state holds a float {body!r}")
        return float(body)

    def _collection(self, kind: type, body: Any) -> Any:
        items = [self.value(item) for item in body]
        return kind(items)

    def _dict(self, body: Any) -> dict[Any, Any]:
        return {self.value(k): self.value(v) for k, v in body}

    def _bytes(self, body: Any) -> bytes:
        return base64.b64decode(body, validate=True)

    def _scalar(self, body: Any) -> np.generic:
        dtype = np.dtype(body[0])
        if dtype.kind not in SCALAR_KINDS:
            raise DamagedCheckpoint(f"its state holds a numpy scalar of dtype {body[0]!r}")
        return dtype.type(self.value(body[1]))

    def _array(self, body: Any) -> np.ndarray:
        return self.arrays[body]

    def _objects(self, body: Any) -> np.ndarray:
        values = self.value(body[1])
        items = np.empty(len(values), dtype=object)
        # One by one: numpy would make an item that is a list into a new axis.
        for i, item in enumerate(values):
            items[i] = item
        return items.reshape(body[0])

    def _array_record(self, body: Any) -> ArrayRecord:
        record = ArrayRecord()
        for name, key in body:
            array = self.arrays[key]
            # A model's weights: torch would cast another dtype into them silently.
            if array.dtype.kind != "f":
                raise DamagedCheckpoint(
                    f"is refused: its model array {name!r} is of dtype {array.dtype}, not "
                    "the floating point fl-clusters' models hold"
                )
            record[name] = Array(array)
        return record

    def _metric_record(self, body: Any) -> MetricRecord:
        return MetricRecord(self.value(body))

    def _config_record(self, body: Any) -> ConfigRecord:
        return ConfigRecord(self.value(body))

    def _record_dict(self, body: Any) -> RecordDict:
        return RecordDict({name: self.value(record) for name, record in body})

    def _generator(self, body: Any) -> np.random.Generator:
        state = self.value(body)
        if state.get("bit_generator") not in BIT_GENERATORS:
            raise DamagedCheckpoint(f"its state names bit generator "
                                    f"{state.get('bit_generator')!r}")
        bit_generator = BIT_GENERATORS[state["bit_generator"]]()
        bit_generator.state = state
        return np.random.Generator(bit_generator)

    def _random(self, body: Any) -> random.Random:
        generator = random.Random()
        generator.setstate(self.value(body))
        return generator

    def _object(self, body: Any) -> Any:
        name, attributes = body
        # No constructor runs: the object gets back the attributes it had.
        found = object.__new__(own_class(name))
        vars(found).update(self.value(attributes))
        return found
