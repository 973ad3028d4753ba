"""One message for a block of logical clients: how their contents travel together.

In the logical-clients mode (:mod:`fl_clusters.logical_grid`) a SuperNode of the
pool serves a block of clients per message. The block message holds, for each
client, the content the strategy addressed to it and the state the client keeps
between rounds (its ``context.state``, kept by the server); the reply holds each
client's reply content (or its error) and its state after the call. A record that
several clients' contents share (the round's model, sent to every client of a
cluster) travels once per block.

The block's layout (which record is whose) is one config record, :data:`BLOCK`;
the records themselves are numbered ``"block/<j>"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, RecordDict

# The config record of a block message (and of its reply): clients and layout.
BLOCK = "fl-clusters.block"
# Its fields.
CLIENTS = "clients"
NUM_CLIENTS = "num-clients"
LAYOUT = "layout"
ERRORS = "errors"
# Parts of a client's entry in the layout.
CONTENT, STATE = "content", "state"
RECORD_PREFIX = "block/"


@dataclass
class Block:
    """The clients of one block message (or of its reply), in order.

    Parameters
    ----------
    clients : list[int]
        The logical client ids, one per entry.
    contents : list[RecordDict | None]
        Each client's content (``None``: it has none, as an error reply).
    states : list[RecordDict | None]
        Each client's kept state (``None``: it keeps none).
    errors : dict[int, tuple[int, str]]
        Position in ``clients`` -> (Flower error code, reason) of a client whose
        call failed (replies only).
    num_clients : int
        The federation's number of logical clients (requests only; 0 in replies).
    """

    clients: list[int]
    contents: list[RecordDict | None]
    states: list[RecordDict | None]
    errors: dict[int, tuple[int, str]] = field(default_factory=dict)
    num_clients: int = 0

    def to_records(self) -> RecordDict:
        """The block as one message content; a record shared by clients goes once."""
        records = RecordDict()
        numbers: dict[int, str] = {}
        layout: list[tuple[int, str, str, str]] = []
        for position, parts in enumerate(zip(self.contents, self.states, strict=True)):
            for part, content in zip((CONTENT, STATE), parts, strict=True):
                if content is None:
                    continue
                layout.append((position, part, "", ""))  # present, even when empty
                for name, record in content.items():
                    # By identity: a strategy builds the round's model once and puts
                    # that object in every member's content.
                    key = numbers.get(id(record))
                    if key is None:
                        key = numbers[id(record)] = f"{RECORD_PREFIX}{len(numbers)}"
                        records[key] = record
                    layout.append((position, part, name, key))
        records[BLOCK] = ConfigRecord({
            CLIENTS: [int(c) for c in self.clients],
            NUM_CLIENTS: int(self.num_clients),
            LAYOUT: json.dumps(layout),
            ERRORS: json.dumps({str(k): list(v) for k, v in self.errors.items()}),
        })
        return records

    @classmethod
    def from_records(cls, records: RecordDict) -> Block:
        """Read a block back.

        Raises
        ------
        ValueError
            If ``records`` holds no block, or a malformed one (a layout naming a
            record or a client that is not there).
        """
        config = records.config_records.get(BLOCK)
        if config is None:
            raise ValueError(f"no '{BLOCK}' record: not a block message")
        try:
            clients = [int(c) for c in config[CLIENTS]]  # type: ignore[union-attr]
            layout = json.loads(str(config[LAYOUT]))
            errors = {int(k): (int(v[0]), str(v[1]))
                      for k, v in json.loads(str(config[ERRORS])).items()}
            num_clients = int(config.get(NUM_CLIENTS, 0))  # type: ignore[arg-type]
            block = cls(clients, [None] * len(clients), [None] * len(clients), errors,
                        num_clients)
            for position, part, name, key in layout:
                parts = block.contents if part == CONTENT else block.states
                if part not in (CONTENT, STATE) or not 0 <= int(position) < len(clients):
                    raise ValueError(f"layout entry {position}/{part} names no client")
                if parts[position] is None:
                    parts[position] = RecordDict()
                if name:
                    parts[position][str(name)] = records[str(key)]  # type: ignore[index]
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ValueError(f"malformed block record: {err}") from err
        if any(not 0 <= k < len(clients) for k in errors):
            raise ValueError("malformed block record: an error names no client")
        return block


def is_block(records: RecordDict) -> bool:
    """Whether a message content is a block of logical clients."""
    return BLOCK in records.config_records

