"""A Flower Grid whose nodes are one ClientApp called in this process.

Runs a ServerApp against a ClientApp with no Ray and no SuperLink: a run costs only
its training, so a whole federation fits in a test or a measurement that needs to
reach into the nodes (their contexts are plain attributes). Messages are copied on
the way in and out, as a wire would, and a handler that raises is answered with an
error reply carrying Flower's reason format.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run

# Handler calls that LoopbackGrids are making in this process now. Such a call is
# an in-process simulation, which fl_clusters.attacks must tell from a deployed
# ClientApp (attack clients run in simulations only).
_calls_in_progress = 0


def delivering() -> bool:
    """Whether a :class:`LoopbackGrid` of this process is calling a ClientApp handler now."""
    return _calls_in_progress > 0


class LoopbackGrid(Grid):
    """A Grid whose nodes are one ClientApp called in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs.
    num_nodes : int
        Nodes; node ``i`` gets ``partition-id`` ``i`` of ``num_nodes``.
    run_config : Mapping[str, Any]
        Every node's ``context.run_config``.
    """

    def __init__(
        self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any]
    ) -> None:
        self.client_app = client_app
        # Ids far from partition ids, so that code mixing them up fails.
        self.contexts = {
            1000 + i: Context(
                run_id=1,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i in range(num_nodes)
        }
        self._run = Run.create_empty(run_id=1)
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        """Keep the run (one run per grid)."""
        self._run = run

    @property
    def run(self) -> Run:
        """The run."""
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Deprecated in Flower; kept for the abstract interface."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Every node id."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Run each message's node on a copy of it now; keep the replies."""
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid4())
            delivered = copy.deepcopy(message)
            reply = self._deliver(delivered, self.contexts[message.metadata.dst_node_id])
            reply.metadata.__dict__["_message_id"] = str(uuid4())
            self._replies[message.metadata.message_id] = copy.deepcopy(reply)
            ids.append(message.metadata.message_id)
        return ids

    def _deliver(self, message: Message, context: Context) -> Message:
        """The node's reply to ``message``; a handler that raises gets Flower's error reply."""
        global _calls_in_progress
        _calls_in_progress += 1
        try:
            return self.client_app(message, context)
        except Exception as error:  # any handler error becomes an error reply, as in Flower
            reason = f"{type(error)}:<'{error}'>"
            return Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                reply_to=message,
            )
        finally:
            _calls_in_progress -= 1

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to ``message_ids`` (each returned once)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and return every reply (all nodes answer at once)."""
        return self.pull_messages(self.push_messages(messages))
