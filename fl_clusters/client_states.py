"""What logical clients keep between rounds, by client id: in memory up to a budget.

In the logical-clients mode (:mod:`fl_clusters.logical_grid`) the server keeps
what a device would keep in its ``context.state``: FedSoft's and local-only's
own model, FedEM's mixture weights, the losses a client already computed. At
100,000 clients with a model each that is far more than memory, so
:class:`ClientStates` keeps the clients used last in memory up to a budget and
writes the others to a temporary folder (Flower's own protobuf serialization, no
pickle), reading a client's back when its next message is sent. The folder goes
with the store.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict


def state_bytes(state: RecordDict) -> int:
    """Bytes of a state's records (arrays, metrics and configs)."""
    return sum(record.count_bytes() for record in state.values())


class ClientStates:
    """Client id -> its kept state; the clients used last in memory, the rest on disk.

    Parameters
    ----------
    memory_bytes : int
        Most bytes of state kept in memory (0: every state goes to disk).
    """

    def __init__(self, memory_bytes: int) -> None:
        if memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
        self.memory_bytes = memory_bytes
        self._memory: OrderedDict[int, RecordDict] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self.bytes_in_memory = 0
        self._on_disk: set[int] = set()
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    def __len__(self) -> int:
        return len(self._memory) + len(self._on_disk)

    def __contains__(self, client: object) -> bool:
        return client in self._memory or client in self._on_disk

    @property
    def on_disk(self) -> int:
        """How many clients' states are on disk now."""
        return len(self._on_disk)

    def get(self, client: int) -> RecordDict | None:
        """``client``'s state, or ``None`` if it keeps none."""
        if client in self._on_disk:
            self.put(client, self._read(client))
        state = self._memory.get(client)
        if state is not None:
            self._memory.move_to_end(client)
        return state

    def put(self, client: int, state: RecordDict) -> None:
        """Keep ``state`` for ``client`` (an empty state: nothing)."""
        self.pop(client)
        if len(state) == 0:
            return
        self._memory[client] = state
        self._sizes[client] = state_bytes(state)
        self.bytes_in_memory += self._sizes[client]
        while self.bytes_in_memory > self.memory_bytes and self._memory:
            oldest, kept = self._memory.popitem(last=False)
            self.bytes_in_memory -= self._sizes.pop(oldest)
            self._write(oldest, kept)

    def pop(self, client: int) -> None:
        """Forget ``client``'s state."""
        if client in self._memory:
            del self._memory[client]
            self.bytes_in_memory -= self._sizes.pop(client)
        if client in self._on_disk:
            self._on_disk.discard(client)
            self._path(client).unlink()

    def _path(self, client: int) -> Path:
        if self._folder is None:
            self._folder = tempfile.TemporaryDirectory(prefix="fl-clusters-client-states-")
        return Path(self._folder.name) / f"{client}.pb"

    def _write(self, client: int, state: RecordDict) -> None:
        path = self._path(client)
        partial = path.with_suffix(".partial")
        partial.write_bytes(recorddict_to_proto(state).SerializeToString())
        os.replace(partial, path)  # a state is on disk whole or not at all
        self._on_disk.add(client)

    def _read(self, client: int) -> RecordDict:
        proto = ProtoRecordDict()
        proto.ParseFromString(self._path(client).read_bytes())
        return recorddict_from_proto(proto)
