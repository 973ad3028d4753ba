"""The ServerApp and ClientApp that ``flwr run .`` loads (pyproject's app components).

Both are registered here without importing torch or scikit-learn; each imports its
implementation (:mod:`fl_clusters.server_app`, :mod:`fl_clusters.client_app`) when
Flower first calls it. Flower's simulation loads the ServerApp and then the
ClientApp under one lock and calls ``ray.init`` only after both have loaded, so
loading the implementations there kept Ray waiting for about 3 s of imports.
Loaded from here, Ray starts at once and the ServerApp imports while Ray comes up:
the README's job went from 27.9-31.5 s to 26.7-27.4 s (docs/performance.md).
Code that builds its own apps (tests, notebooks, ``run_simulation``) keeps using
``fl_clusters.server_app.app`` and ``fl_clusters.client_app.build_client_app``.
Importing this module also asks Ray to pass messages inline
(:func:`pass_ray_messages_inline`), before Flower starts Ray.
"""

from __future__ import annotations

import os

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

# The query actions fl_clusters.client_app registers (a test checks the two apps
# answer the same message types).
QUERY_ACTIONS = (
    "report",
    "sample_assignment",
    "cluster_losses",
    "features",
    "identity",
    "state",
    "restore",
)

# Ray hands an actor an argument or return value above its
# max_direct_call_object_size (100 KiB by default) through its shared-memory object
# store, where the raylet seals, pins and frees each one. A Flower message is read
# once, so the store only adds work: with a Fashion-MNIST MLP (0.64 MB) in every
# message the raylet was the third-busiest process, and 100 clients' FedAvg round
# took 2.20 s against 1.52 s inline (docs/performance.md). 10 MiB is Ray's cap on
# the inline bytes of one task; larger messages still go through the store.
RAY_INLINE_BYTES = 10 * 1024 * 1024
RAY_INLINE_ENV = "RAY_max_direct_call_object_size"


def pass_ray_messages_inline() -> None:
    """Have Ray pass messages up to ``RAY_INLINE_BYTES`` inline with their task.

    Ray reads the setting when it starts (``ray.init``), so call this before; Flower's
    simulation imports this module before starting Ray. A value already in the
    environment is kept.
    """
    os.environ.setdefault(RAY_INLINE_ENV, str(RAY_INLINE_BYTES))


pass_ray_messages_inline()

server_app = ServerApp()


@server_app.main()
def _run_server(grid: Grid, context: Context) -> None:
    from fl_clusters.server_app import app

    app(grid, context)


def _handle(message: Message, context: Context) -> Message:
    from fl_clusters.client_app import app

    return app(message, context)


client_app = ClientApp()
client_app.train()(_handle)
client_app.evaluate()(_handle)
for _action in QUERY_ACTIONS:
    client_app.query(_action)(_handle)
