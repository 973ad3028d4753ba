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
"""

from __future__ import annotations

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
