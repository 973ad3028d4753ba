"""What one tick of Flower 1.41's simulation dispatcher costs, by nodes and stored messages.

Flower's simulation engine hands instructions to its actors from a thread
(``add_messages_to_queue`` in ``flwr/server/superlink/fleet/vce/vce_api.py``) that
wakes every 0.1 s and asks the in-memory LinkState, for every registered node,
for one undelivered instruction (``get_message_ins(node_id, limit=1)``); that call
walks every stored instruction, checking its expiry and federation before its
destination. An instruction stays stored, delivered, until the ServerApp pulls its
reply. This benchmark builds that state outside any run (Flower's own
``_register_nodes`` and ``InMemoryGrid.push_messages``, as a simulation does),
stores M instructions for M different nodes, and times the tick's loop body on it:
the first tick (which delivers the M instructions) and the ticks after it (which
deliver nothing and check the same M stored instructions for every node).

docs/performance.md ("Where start-up goes") reads the ticks against the start-up
handshake, which messages every node once through the app's window of 32
instructions in flight: N / 32 ticks of N x 32 checks each.

    python benchmarks/flower_dispatcher.py [--nodes 1000 3000 10000] [--stored 0 32 128]
        [--out benchmarks/measured/flower-dispatcher.json]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from benchmarks.overhead import machine_info, write_results
from fl_clusters.sweep.provenance import measurement_provenance

OUT = Path(__file__).parent / "measured" / "flower-dispatcher.json"
RUN_ID, TASK_ID = 7, 11


def dispatcher_state(num_nodes: int, stored: int) -> tuple[LinkState, list[int]]:
    """A simulation's LinkState with ``num_nodes`` nodes and one instruction stored for
    each of the first ``stored`` of them, pushed as a ServerApp's grid pushes them."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                               ObjectStoreFactory())
    state = factory.state()
    run = Run.create_empty(run_id=RUN_ID)
    run.primary_task_id, run.federation_id = TASK_ID, NOOP_FEDERATION_ID
    # What Flower's run_simulation registers before it starts the engine.
    state.run_ids[RUN_ID] = RunRecord(run=run)  # type: ignore[attr-defined]
    state.task_store[TASK_ID] = Task(task_id=TASK_ID, run_id=RUN_ID)  # type: ignore[attr-defined]
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, SUPERLINK_NODE_ID
    nodes = list(_register_nodes(num_nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    grid.push_messages([
        Message(RecordDict({"config": ConfigRecord({"round": 1})}), dst_node_id=node,
                message_type="query")
        for node in nodes[:stored]
    ])
    return state, nodes


def dispatcher_tick(state: LinkState, nodes: list[int]) -> tuple[float, int]:
    """One pass of ``add_messages_to_queue``'s loop: seconds, and instructions delivered."""
    start = time.perf_counter()
    delivered = sum(len(state.get_message_ins(node_id=node, limit=1)) for node in nodes)
    return time.perf_counter() - start, delivered


def measure(num_nodes: int, stored: int, ticks: int = 3) -> dict[str, Any]:
    """The first tick and the fastest of ``ticks`` later ones, with the cost per check."""
    state, nodes = dispatcher_state(num_nodes, stored)
    first_s, delivered = dispatcher_tick(state, nodes)
    later = [dispatcher_tick(state, nodes) for _ in range(ticks)]
    later_s = min(seconds for seconds, _ in later)
    return {
        "nodes": num_nodes,
        "stored": stored,
        "first_tick_s": first_s,
        "delivered_first_tick": delivered,
        "later_tick_s": later_s,
        "delivered_later_ticks": sum(count for _, count in later),
        "still_stored": len(state.message_ins_store),  # type: ignore[attr-defined]
        "check_us": later_s / (num_nodes * stored) * 1e6 if stored else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--stored", type=int, nargs="+", default=[0, 32, 128])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if any(stored > nodes for stored in args.stored for nodes in args.nodes):
        parser.error("--stored cannot exceed the smallest --nodes (one instruction a node)")
    source = measurement_provenance()
    info = {**machine_info(), "load_average_before": os.getloadavg()}
    rows = [measure(nodes, stored) for nodes in args.nodes for stored in args.stored]
    for row in rows:
        print(f"{row['nodes']:>6} nodes, {row['stored']:>4} stored: first tick "
              f"{row['first_tick_s']:.4f} s, later ticks {row['later_tick_s']:.4f} s, "
              f"{row['check_us'] or 0:.2f} us a check")
    info["load_average_after"] = os.getloadavg()
    write_results(args.out, source, info, rows)


if __name__ == "__main__":
    main()
