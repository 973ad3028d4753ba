"""A SuperNode of the pool serving a block of logical clients, one after another.

In the logical-clients mode (:mod:`fl_clusters.logical_grid`) a message may hold a
block of clients (:mod:`fl_clusters.block_messages`). :func:`serve_block`, a Flower
mod, calls the handler once per client with that client's own message and a
``Context`` of its own: its ``partition-id`` (the client id) and ``num-partitions``
in the node config, and the state it kept between rounds, which the server holds
and sends with the block. A client whose handler raises loses only its own reply.
Any handler works unchanged: the built-in ClientApp's, a
:class:`~fl_clusters.adapter.ClusteredClient`'s, or a Flower app's own given
``ClientApp(mods=[serve_block])``.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import Context, Message, Metadata, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode

from fl_clusters.block_messages import Block, is_block


def _client_message(block: Message, client: int, content: RecordDict) -> Message:
    """The message the handler sees for ``client``: the block's, addressed to it."""
    meta = block.metadata
    metadata = Metadata(
        run_id=meta.run_id, message_id=meta.message_id, src_node_id=meta.src_node_id,
        dst_node_id=client, reply_to_message_id=meta.reply_to_message_id,
        group_id=meta.group_id, created_at=meta.created_at, ttl=meta.ttl,
        message_type=meta.message_type,
    )
    return Message(content=content, metadata=metadata)


def client_context(context: Context, client: int, num_clients: int,
                   state: RecordDict | None) -> Context:
    """``client``'s context on this node: its partition, and the state it kept."""
    node_config = {**context.node_config, "partition-id": client,
                   "num-partitions": num_clients}
    return Context(run_id=context.run_id, node_id=client, node_config=node_config,
                   state=state if state is not None else RecordDict(),
                   run_config=context.run_config)


def error_reason(err: Exception) -> str:
    """A handler's exception as Flower words an error reply's reason."""
    return f"{type(err)}:<'\nException {type(err).__name__} occurred. Message: {err}'>"


def serve_block(message: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower mod: a block message is served client by client; any other passes through.

    Raises
    ------
    ValueError
        If the block is malformed (Flower then replies with an error for the
        whole block, and the server counts each of its clients as failed).
    """
    if not message.has_content() or not is_block(message.content):
        return call_next(message, context)
    block = Block.from_records(message.content)
    replies = Block(block.clients, [], [])
    for position, client in enumerate(block.clients):
        content = block.contents[position]
        own = client_context(context, client, block.num_clients, block.states[position])
        try:
            reply = call_next(_client_message(message, client, content or RecordDict()), own)
        except Exception as err:  # one client's failure is its own reply
            replies.errors[position] = (ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                        error_reason(err))
            replies.contents.append(None)
            replies.states.append(block.states[position])
            continue
        if reply.has_error():
            replies.errors[position] = (reply.error.code, reply.error.reason)
            replies.contents.append(None)
        else:
            replies.contents.append(reply.content)
        replies.states.append(own.state)
    return Message(replies.to_records(), reply_to=message)


def per_client(handler: ClientAppCallable) -> Callable[[Message, Context], Message]:
    """``handler`` serving block messages client by client (:func:`serve_block`)."""
    def served(message: Message, context: Context) -> Message:
        return serve_block(message, context, handler)

    return served
