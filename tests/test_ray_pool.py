"""A dead Ray actor leaves Flower's pool; the worker threads never outnumber the actors."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

from fl_clusters.ray_pool import actor_permits, drop_actor


@dataclass
class FakePool:
    """Flower's ``BasicActorPool`` as ray_pool reads it: a list of actors and a count."""

    pool: list[SimpleNamespace] = field(default_factory=list)
    num_actors: int = 0


def actor(hex_id: str) -> SimpleNamespace:
    return SimpleNamespace(_actor_id=SimpleNamespace(hex=lambda: hex_id))


def test_drop_actor_removes_only_the_dead_one() -> None:
    pool = FakePool([actor("aa"), actor("bb")], num_actors=2)
    assert drop_actor(pool, "bb") == 1
    assert [a._actor_id.hex() for a in pool.pool] == ["aa"]
    assert pool.num_actors == 1
    # An actor already taken by another thread is not there: nothing to drop.
    assert drop_actor(pool, "cc") == 0
    assert pool.num_actors == 1


def test_actor_permits_are_one_per_actor_and_shared_by_the_backend() -> None:
    backend = SimpleNamespace(pool=FakePool([actor("aa"), actor("bb")], num_actors=2))
    permits = actor_permits(backend)
    assert actor_permits(backend) is permits
    assert permits.acquire(blocking=False) and permits.acquire(blocking=False)
    # A third worker thread waits: there are two actors.
    assert not permits.acquire(blocking=False)
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (permits.acquire(), taken.set()))
    waiter.start()
    assert not taken.wait(0.1)
    permits.release()
    waiter.join(timeout=5)
    assert taken.is_set()
