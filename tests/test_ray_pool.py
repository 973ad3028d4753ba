"""Flower's actor pool: a dead actor leaves it, the worker threads never outnumber the
actors, and the runs of a sweep share one pool."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

from fl_clusters.ray_pool import actor_permits, actors_kept_between_runs, drop_actor


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


@dataclass
class FakeActorPool:
    """Flower's ``BasicActorPool`` as the kept pool is read: idle actors, messages in
    flight, capacity, and what was asked of it."""

    num_actors: int = 2
    actors_capacity: int = 2
    pool: list[str] = field(default_factory=lambda: ["a", "b"])
    _future_to_actor: dict[Any, str] = field(default_factory=dict)
    added: int = 0
    terminated: int = 0

    def add_actors_to_pool(self, count: int) -> None:
        self.added += count
        self.num_actors += count
        self.pool += ["new"] * count

    def terminate_all_actors(self) -> None:
        self.terminated += 1


def _backend(resources: dict[str, float]) -> Any:
    backend = object.__new__(RayBackend)
    backend.client_resources, backend.pool, backend.app_fn = resources, None, None
    return backend


@pytest.fixture
def built_pools(monkeypatch: pytest.MonkeyPatch) -> list[FakeActorPool]:
    """Flower's own build and terminate, recording the pools they make and end."""
    pools: list[FakeActorPool] = []

    def build(self: Any, app_fn: Any) -> None:
        self.pool, self.app_fn = FakeActorPool(), app_fn
        pools.append(self.pool)

    def terminate(self: Any) -> None:
        self.pool.terminate_all_actors()

    monkeypatch.setattr(RayBackend, "build", build)
    monkeypatch.setattr(RayBackend, "terminate", terminate)
    return pools


def test_the_runs_of_a_sweep_share_one_pool(built_pools: list[FakeActorPool]) -> None:
    cpu = {"num_cpus": 1.0}
    with actors_kept_between_runs():
        first = _backend(cpu)
        RayBackend.build(first, "app 1")
        RayBackend.terminate(first)
        second = _backend(cpu)
        RayBackend.build(second, "app 2")
        assert second.pool is built_pools[0] and second.app_fn == "app 2"
        assert built_pools[0].terminated == 0 and built_pools[0].added == 0
        # An actor lost with its node is replaced before the next run.
        second.pool.num_actors -= 1
        second.pool.pool.pop()
        RayBackend.terminate(second)
        third = _backend(cpu)
        RayBackend.build(third, "app 3")
        assert third.pool is built_pools[0] and built_pools[0].added == 1
        RayBackend.terminate(third)
    assert len(built_pools) == 1 and built_pools[0].terminated == 1
    # Outside the block Flower's own build and terminate are back.
    fourth = _backend(cpu)
    RayBackend.build(fourth, "app 4")
    RayBackend.terminate(fourth)
    assert len(built_pools) == 2 and built_pools[1].terminated == 1


def test_a_pool_with_messages_in_flight_or_other_resources_is_not_reused(
    built_pools: list[FakeActorPool],
) -> None:
    with actors_kept_between_runs():
        timed_out = _backend({"num_cpus": 1.0})
        RayBackend.build(timed_out, "app")
        timed_out.pool._future_to_actor["future"] = timed_out.pool.pool.pop()
        RayBackend.terminate(timed_out)
        assert built_pools[0].terminated == 1
        kept = _backend({"num_cpus": 1.0})
        RayBackend.build(kept, "app")
        RayBackend.terminate(kept)
        gpu = _backend({"num_cpus": 1.0, "num_gpus": 0.5})
        RayBackend.build(gpu, "app")
        assert gpu.pool is built_pools[2] and built_pools[1].terminated == 1
        RayBackend.terminate(gpu)
    assert [pool.terminated for pool in built_pools] == [1, 1, 1]
