"""Ray settings that must be in the environment before Flower's simulation starts Ray.

Both the apps ``flwr run`` loads (:mod:`fl_clusters.apps`) and every ClientApp built
in code (:mod:`fl_clusters.client_app`, :class:`~fl_clusters.adapter.ClusteredClient`)
set them; Ray reads them once, in ``ray.init``.
"""

from __future__ import annotations

import os

# Ray hands an actor an argument or return value above its
# max_direct_call_object_size (100 KiB by default) through its shared-memory object
# store, where the raylet seals, pins and frees each one. A Flower message is read
# once, so the store only adds work (docs/performance.md measures it). 10 MiB is
# Ray's cap on the inline bytes of one task; larger messages still go through the store.
RAY_INLINE_BYTES = 10 * 1024 * 1024
RAY_INLINE_ENV = "RAY_max_direct_call_object_size"
RAY_ADDRESS_ENV = "RAY_ADDRESS"
RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def pass_ray_messages_inline() -> None:
    """Have Ray pass messages up to ``RAY_INLINE_BYTES`` inline with their task.

    Ray reads the setting when it starts (``ray.init``), so call this before; Flower's
    simulation imports :mod:`fl_clusters.apps`, which calls it, before starting Ray.
    A value already in the environment is kept.
    """
    os.environ.setdefault(RAY_INLINE_ENV, str(RAY_INLINE_BYTES))


def start_own_ray_unless_a_cluster_is_named() -> None:
    """Have a simulation start its own Ray, on loopback, unless ``RAY_ADDRESS`` names one.

    Flower's simulation calls a plain ``ray.init()``, which joins the cluster
    recorded in Ray's ``ray_current_cluster`` file when one is there: a cluster
    stopped without removing that file would make every later run wait for it.
    ``RAY_ADDRESS=local`` always starts a fresh local Ray, and
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` has it listen and connect on
    127.0.0.1 instead of the machine's network address (a single-machine run has
    no other machine to reach). A user who wants a cluster sets ``RAY_ADDRESS``
    to its head (docs/cluster.md), and then neither is touched.
    """
    if os.environ.get(RAY_ADDRESS_ENV):
        return
    os.environ[RAY_ADDRESS_ENV] = "local"
    os.environ.setdefault(RAY_LOOPBACK_ENV, "0")
