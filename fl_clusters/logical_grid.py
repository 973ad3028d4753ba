"""Clients that are not nodes: N logical clients served by a pool of SuperNodes.

Flower's simulation makes a node per client, and its dispatcher checks every
stored message for every node every 0.1 s, so messaging N nodes once costs about
N x N checks (docs/performance.md). Like every cross-device simulator, the
logical-clients mode (run-config key ``num-clients``) separates the two: the
clients are ids 0..N-1 (their ``partition-id``), the federation's SuperNodes are
a pool of workers, and :class:`LogicalClientGrid` is the grid where they meet.

A strategy sees client ids where it saw node ids and needs no change, Flower's
own FedAvg included. A message for client ``c`` joins a block (one message for a
pool node carrying several clients, :mod:`fl_clusters.block_messages`); the node
serves the block client by client (:func:`fl_clusters.client.blocks.serve_block`)
and each client's reply is mapped back by the message id the grid gave it, never
by an id the reply claims. A round therefore sends about one message per pool
node. What a device would keep between rounds (its ``context.state``) is kept here,
by client id, sent with the client's next message and written to the checkpoint
through the same ``query.state`` / ``query.restore`` messages a node answers.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from logging import WARNING

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_clusters import protocol as p
from fl_clusters.block_messages import Block
from fl_clusters.client_states import ClientStates
from fl_clusters.grid import WrappingGrid
from fl_clusters.handshake import NodeIdentities, identify_nodes

# Most clients in one block message. A pool node serves its block's clients one
# after another, and the block and its reply sit in memory whole (a model per
# client in the reply): larger cohorts are cut into more blocks.
BLOCK_CLIENTS_MAX = 64
# Default of the clients' kept state held in memory (run-config key
# client-state-memory-mb).
STATE_MEMORY_BYTES = 2048 * 2**20
# Pause between pulls of LogicalClientGrid.send_and_receive.
PULL_PAUSE_S = 0.01


class LogicalClientGrid(WrappingGrid):
    """A Grid whose node ids are ``num_clients`` logical clients, served by ``grid``'s nodes.

    Parameters
    ----------
    grid : Grid
        Flower's grid; its nodes are the pool.
    num_clients : int
        Logical clients, ids ``0 .. num_clients - 1``.
    block_clients_max : int
        Most clients in one block message.
    state_memory_bytes : int
        Most bytes of the clients' kept state held in memory; the rest goes to a
        temporary folder (:class:`~fl_clusters.client_states.ClientStates`).
    workers : int | None
        Pool nodes that compute at once (the simulation's actors); a send is cut
        into this many blocks, or more to keep each within ``block_clients_max``,
        and never more than the pool has nodes. Every further block costs a
        message through Flower's dispatcher (about 30 ms on 2 cores,
        docs/performance.md). ``None``: one block a pool node.
    """

    def __init__(self, grid: Grid, num_clients: int,
                 block_clients_max: int = BLOCK_CLIENTS_MAX,
                 state_memory_bytes: int = STATE_MEMORY_BYTES,
                 workers: int | None = None) -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1 or None, got {workers}")
        super().__init__(grid)
        self.num_clients = num_clients
        self.block_clients_max = block_clients_max
        self.workers = workers
        # Client id -> what it keeps between rounds (its context.state), non-empty only.
        self.states = ClientStates(state_memory_bytes)
        # Logical message id -> the message (until its reply is handed out).
        self._sent: dict[str, Message] = {}
        # Block message id -> the logical message ids it carries, in order.
        self._blocks: dict[str, list[str]] = {}
        self._ready: dict[str, Message] = {}
        # Block replies refused as malformed (their clients count as failed).
        self.malformed_blocks = 0

    def get_node_ids(self) -> Iterable[int]:
        """The logical clients' ids."""
        return range(self.num_clients)

    def pool_nodes(self) -> list[int]:
        """The pool's node ids, sorted."""
        return sorted(self._grid.get_node_ids())

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Give each message an id, and push them to the pool in blocks.

        ``query.state`` and ``query.restore`` are answered here: the state they
        read and write is the one this grid keeps.
        """
        ids: list[str] = []
        to_push: dict[str, list[str]] = defaultdict(list)
        for msg in messages:
            message_id = uuid.uuid4().hex
            # Flower's Metadata has no setter: the SuperLink sets ids on its own messages.
            msg.metadata.__dict__["_message_id"] = message_id
            self._sent[message_id] = msg
            ids.append(message_id)
            client = msg.metadata.dst_node_id
            kind = msg.metadata.message_type
            if not 0 <= client < self.num_clients:
                self._ready[message_id] = _error(msg, ErrorCode.NODE_UNAVAILABLE,
                                                 f"no logical client {client}")
            elif kind == p.QUERY_STATE:
                self._ready[message_id] = Message(
                    RecordDict(dict((self.states.get(client) or RecordDict()).items())),
                    reply_to=msg)
            elif kind == p.QUERY_RESTORE:
                self.states.put(client, msg.content)
                self._ready[message_id] = Message(RecordDict(), reply_to=msg)
            else:
                to_push[kind].append(message_id)
        for message_ids in to_push.values():
            self._push_blocks(message_ids)
        return ids

    def _push_blocks(self, message_ids: list[str]) -> None:
        """Cut messages of one type into blocks (one per worker, at most
        ``block_clients_max`` clients each) and push them to the pool's nodes in turn."""
        pool = self.pool_nodes()
        if not pool:
            for message_id in message_ids:
                self._ready[message_id] = _error(self._sent[message_id],
                                                 ErrorCode.NODE_UNAVAILABLE, "no pool node")
            return
        busy = min(len(pool), len(message_ids), self.workers or len(pool))
        count = max(busy, math.ceil(len(message_ids) / self.block_clients_max))
        chunks = [message_ids[i::count] for i in range(count)]
        blocks = [self._block_message(chunk, pool[i % len(pool)])
                  for i, chunk in enumerate(chunks)]
        block_ids = list(self._grid.push_messages(blocks))
        for block_id, chunk in zip(block_ids, chunks, strict=True):
            if block_id:
                self._blocks[block_id] = chunk
            else:
                for message_id in chunk:
                    self._ready[message_id] = _error(self._sent[message_id],
                                                     ErrorCode.NODE_UNAVAILABLE,
                                                     "the pool node refused the block")

    def _block_message(self, message_ids: Sequence[str], node: int) -> Message:
        """One block message for ``node`` carrying ``message_ids``' clients."""
        messages = [self._sent[m] for m in message_ids]
        clients = [m.metadata.dst_node_id for m in messages]
        content = Block(clients, [m.content for m in messages],
                        [self.states.get(c) for c in clients],
                        num_clients=self.num_clients).to_records()
        first = messages[0].metadata
        return Message(content=content, dst_node_id=node, message_type=first.message_type,
                       group_id=first.group_id,
                       ttl=min(m.metadata.ttl for m in messages))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` that have come, unpacked from their blocks."""
        if self._blocks:
            for reply in self._grid.pull_messages(list(self._blocks)):
                chunk = self._blocks.pop(reply.metadata.reply_to_message_id, None)
                if chunk is not None:
                    self._unpack(reply, chunk)
        replies = []
        for message_id in message_ids:
            reply = self._ready.pop(message_id, None)
            if reply is not None:
                replies.append(reply)
                self._sent.pop(message_id, None)
        return replies

    def _unpack(self, reply: Message, chunk: list[str]) -> None:
        """Each client's reply out of a block's reply; the block's error is each one's."""
        sent = [self._sent[m] for m in chunk if m in self._sent]
        if len(sent) != len(chunk):
            return  # answered late, after the send that wanted it gave up
        if reply.has_error():
            for msg, message_id in zip(sent, chunk, strict=True):
                self._ready[message_id] = _error(msg, reply.error.code, reply.error.reason)
            return
        try:
            block = Block.from_records(reply.content)
            clients = [m.metadata.dst_node_id for m in sent]
            if block.clients != clients:
                raise ValueError(f"it answers for clients {block.clients[:5]}..., "
                                 f"not the {len(clients)} it was sent")
        except ValueError as err:
            self.malformed_blocks += 1
            log(WARNING, "logical clients: node %d's block reply is refused (%s); its %d "
                "clients count as failed", reply.metadata.src_node_id, err, len(chunk))
            for msg, message_id in zip(sent, chunk, strict=True):
                self._ready[message_id] = _error(msg, ErrorCode.UNKNOWN,
                                                 f"malformed block reply: {err}")
            return
        for position, (msg, message_id) in enumerate(zip(sent, chunk, strict=True)):
            client = clients[position]
            if block.states[position] is not None:
                self.states.put(client, block.states[position])  # type: ignore[arg-type]
            if position in block.errors:
                code, reason = block.errors[position]
                self._ready[message_id] = _error(msg, code, reason)
            else:
                self._ready[message_id] = Message(block.contents[position] or RecordDict(),
                                                  reply_to=msg)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push, then pull until every reply came or ``timeout`` seconds passed.

        fl-clusters' ServerApp sends through :class:`~fl_clusters.grid.MeteredGrid`
        instead, which paces its pulls to the wait.
        """
        pending = list(self.push_messages(messages))
        replies: list[Message] = []
        start = time.monotonic()
        while pending and (timeout is None or time.monotonic() - start < timeout):
            pulled = list(self.pull_messages(pending))
            replies += pulled
            answered = {m.metadata.reply_to_message_id for m in pulled}
            pending = [m for m in pending if m not in answered]
            if pending and not pulled:
                time.sleep(PULL_PAUSE_S)
        return replies


def _error(msg: Message, code: int, reason: str) -> Message:
    """An error reply to ``msg``."""
    return Message(Error(code=code, reason=reason), reply_to=msg)


def logical_identities(grid: Grid, num_clients: int, timeout: float | None) -> NodeIdentities:
    """Who the logical clients are: client ``c``'s stable key and partition are ``c``.

    Only client 0 is asked (``query.identity``), for what a handshake is for
    beside the keys: a reason no client can take part (its data set is missing,
    the partition plan cannot be made) stops the run before round 1. A client's
    ground-truth group then comes with its report, not here.
    """
    first = identify_nodes(grid, [0], timeout)
    ids = range(num_clients)
    return NodeIdentities(
        keys=dict(zip(ids, ids, strict=True)),
        groups=first.groups,
        problems=first.problems,
        startup_problems=first.startup_problems,
        partitions=dict(zip(ids, ids, strict=True)),
        unanswered=[],
        every_node=first.every_node,
    )
