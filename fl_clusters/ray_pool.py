"""Flower's pool of Ray actors: dead actors leave it; a sweep keeps it between runs.

Flower 1.41's Ray backend puts the actor of a failed message back into its pool
whatever the failure. An actor whose node died fails every later message at once,
so it is idle again first and takes most of the messages that follow: after a
machine of a Ray cluster is lost, nearly every client of the next phases fails
(docs/cluster.md). Ray says so precisely (``ActorDiedError``, as opposed to the
``ActorUnavailableError`` of an actor that may come back); on that error the
actor is taken out of the pool for good, and the run goes on with the actors left.
Flower runs one worker thread per actor and each takes an actor from the pool
without waiting, so a thread whose actor was dropped keeps one permit of a
semaphore sized to the pool: the threads never outnumber the actors left.

Every simulation builds its pool anew: each actor is a fresh process that imports
Flower, torch and the ClientApp before its first message, seconds a run on a small
machine. A ClientApp actor is not bound to a run (each message brings the app and
its context), so :func:`actors_kept_between_runs` lets the runs of one process (a
sweep's cells) share one pool.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from logging import WARNING
from typing import Any

from flwr.common.logger import log

SIMULATION_ENGINE = "flwr.server.superlink.fleet.vce.vce_api"
PATCHED = "_fl_clusters_drops_dead_actors"
PERMITS = "_fl_clusters_actor_permits"
_PERMITS_LOCK = threading.Lock()


def drop_dead_actors_in_simulation() -> None:
    """Have this process's Flower simulation stop sending messages to dead actors.

    Does nothing outside a simulation (a deployed ServerApp has no Ray pool) and
    when already done.
    """
    if SIMULATION_ENGINE not in sys.modules:
        return
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if getattr(RayBackend, PATCHED, False):
        return
    process_message = RayBackend.process_message

    def process_message_dropping_dead_actors(
        self: RayBackend, message: Any, context: Any
    ) -> Any:
        if self.pool is None:
            return process_message(self, message, context)
        permits = actor_permits(self)
        permits.acquire()
        dropped = 0
        try:
            return process_message(self, message, context)
        except Exception as error:
            from ray.exceptions import ActorDiedError

            if isinstance(error, ActorDiedError):
                dropped = drop_actor(self.pool, error.actor_id)
            raise
        finally:
            # With no actor left, messages fail at once (and the ServerApp's failed-
            # round policy ends the run) rather than wait forever for a permit.
            if not dropped or self.pool.num_actors == 0:
                permits.release()

    RayBackend.process_message = process_message_dropping_dead_actors  # type: ignore[method-assign]
    setattr(RayBackend, PATCHED, True)


def actor_permits(backend: Any) -> threading.Semaphore:
    """The semaphore of ``backend``'s worker threads, one permit per live actor."""
    with _PERMITS_LOCK:
        if not hasattr(backend, PERMITS):
            setattr(backend, PERMITS, threading.Semaphore(backend.pool.num_actors))
        return getattr(backend, PERMITS)


def drop_actor(pool: Any, actor_id: str | None) -> int:
    """Take the actor ``actor_id`` (hex) out of Flower's actor ``pool``; return how many."""
    # Ray's actor handles expose their id only as ``_actor_id`` (Flower reads it too).
    dead = [actor for actor in list(pool.pool) if actor._actor_id.hex() == actor_id]
    dropped = 0
    for actor in dead:
        try:
            pool.pool.remove(actor)
        except ValueError:  # another worker thread took it meanwhile; its failure drops it
            continue
        pool.num_actors -= 1
        dropped += 1
        log(WARNING, "Ray actor %s died with its node: the simulation goes on with the "
            "%d actor(s) left", actor_id, pool.num_actors)
    return dropped


def _pool_is_idle(pool: Any) -> bool:
    """Every actor back in the pool, none running a message."""
    return not pool._future_to_actor and len(pool.pool) == pool.num_actors


@contextmanager
def actors_kept_between_runs() -> Iterator[None]:
    """Within the block, the simulations of this process share one pool of actors.

    A run's pool is kept when the run ends with every actor idle, and the next run
    with the same client resources takes it (topped up to capacity, should an actor
    have died with its node); a run that ends with messages in flight (a timeout)
    terminates its actors, as Flower does. The pool left at the end of the block is
    terminated.
    """
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    build, terminate = RayBackend.build, RayBackend.terminate
    kept: dict[str, Any] = {}

    def build_or_take_kept(self: RayBackend, app_fn: Any) -> None:
        pool = kept.pop("pool", None)
        if pool is not None and kept.pop("resources") == self.client_resources:
            pool.add_actors_to_pool(max(0, pool.actors_capacity - pool.num_actors))
            self.pool, self.app_fn = pool, app_fn
            return
        if pool is not None:
            pool.terminate_all_actors()
        build(self, app_fn)

    def keep_if_idle(self: RayBackend) -> None:
        if self.pool is not None and _pool_is_idle(self.pool):
            kept.update(pool=self.pool, resources=self.client_resources)
            self.pool = None
            return
        terminate(self)

    RayBackend.build = build_or_take_kept  # type: ignore[method-assign]
    RayBackend.terminate = keep_if_idle  # type: ignore[method-assign]
    try:
        yield
    finally:
        RayBackend.build, RayBackend.terminate = build, terminate  # type: ignore[method-assign]
        if "pool" in kept:
            kept["pool"].terminate_all_actors()
