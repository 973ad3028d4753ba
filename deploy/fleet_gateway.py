"""The only door SuperNodes get: Flower's Fleet API, and nothing else of the SuperLink.

Flower 1.41 serves its Fleet API (SuperNodes), Control API (``flwr run``, ``flwr
supernode register``, ``flwr ls``) and Runtime API on one HTTP(S) port, and the
open-source Control API has no authentication: whoever reaches that port can
register a node key, list runs and submit a run (code that every node executes).
So the deployment binds the SuperLink to loopback and puts this gateway on the
address SuperNodes reach. It forwards exactly the Fleet API's POST routes (the
list below, from ``flwr/supernode/fleet_http_connection.py``) to the SuperLink,
headers and body unchanged, so SuperNode authentication (a signed timestamp in
the headers) works through it; every other method or path gets 403 and never
reaches the SuperLink.

    python deploy/fleet_gateway.py --listen HOST:PORT --upstream 127.0.0.1:PORT \
        [--certfile server.pem --keyfile server.key --cafile ca.crt | --insecure]
"""

from __future__ import annotations

import argparse
import contextlib
import ssl
import sys
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

# Every request a SuperNode makes (Flower 1.41 and 1.42).
FLEET_ROUTES = (
    "/v1/fleet/register-node",
    "/v1/fleet/activate-node",
    "/v1/fleet/deactivate-node",
    "/v1/fleet/unregister-node",
    "/v1/fleet/send-node-heartbeat",
    "/v1/fleet/pull-messages",
    "/v1/fleet/push-messages",
    "/v1/fleet/get-run",
    "/v1/fleet/get-fab",
    "/v1/fleet/push-object",
    "/v1/fleet/pull-object",
    "/v1/fleet/confirm-message-received",
)
# Headers that belong to one connection, not to the request (RFC 9110, 7.6.1);
# httpx and uvicorn set their own.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "content-length",
})
# A model a SuperNode pushes travels in one request; far above any model here,
# far below what could exhaust the SuperLink's machine.
MAX_BODY_BYTES = 512 * 1024 * 1024
REFUSAL = ("403: this port serves the Fleet API (SuperNodes) only; the Control API "
           "(flwr run, flwr supernode register, flwr ls) is on the SuperLink's loopback "
           "address, for the operator (docs/deploy.md)\n")


def _kept_headers(headers: httpx.Headers | object) -> list[tuple[str, str]]:
    """The end-to-end headers of a request or response."""
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]  # type: ignore[attr-defined]


def build_app(upstream: str, verify: ssl.SSLContext | bool,
              transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """The gateway: Fleet routes forwarded to ``upstream`` (a base URL), the rest refused.

    Parameters
    ----------
    upstream : str
        The SuperLink's base URL on loopback, e.g. ``https://127.0.0.1:9093``.
    verify : ssl.SSLContext | bool
        How the gateway checks the SuperLink's certificate (``False`` for plain HTTP).
    transport : httpx.AsyncBaseTransport | None
        How requests reach ``upstream``; ``None``: the network (tests pass an app).
    """
    client = httpx.AsyncClient(base_url=upstream, verify=verify, timeout=None,
                               transport=transport)

    async def forward(request: Request) -> Response:
        declared = int(request.headers.get("content-length") or 0)
        if declared > MAX_BODY_BYTES:
            return PlainTextResponse("413: request body too large\n", status_code=413)
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return PlainTextResponse("413: request body too large\n", status_code=413)
        try:
            reply = await client.post(request.url.path, content=body,
                                      headers=_kept_headers(request.headers))
        except httpx.HTTPError as err:
            return PlainTextResponse(f"502: the SuperLink did not answer: {err}\n",
                                     status_code=502)
        return Response(reply.content, status_code=reply.status_code,
                        headers=dict(_kept_headers(reply.headers)))

    async def refuse(request: Request) -> Response:
        return PlainTextResponse(REFUSAL, status_code=403)

    everything = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
    routes = [Route(path, forward, methods=["POST"]) for path in FLEET_ROUTES]
    routes.append(Route("/{rest:path}", refuse, methods=everything))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    # The catch-all comes last: a Fleet path asked with another method lands there too.
    return Starlette(routes=routes, lifespan=lifespan)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT SuperNodes connect to")
    parser.add_argument("--upstream", required=True, help="the SuperLink's loopback HOST:PORT")
    parser.add_argument("--certfile", help="TLS certificate the gateway presents")
    parser.add_argument("--keyfile", help="its private key")
    parser.add_argument("--cafile", help="CA that signed the SuperLink's certificate")
    parser.add_argument("--insecure", action="store_true",
                        help="plain HTTP both ways (loopback tests only)")
    args = parser.parse_args(argv)
    if not args.insecure and not (args.certfile and args.keyfile and args.cafile):
        parser.error("give --certfile, --keyfile and --cafile (TLS), or --insecure")
    return args


def main(argv: list[str] | None = None) -> None:
    """Serve the gateway until stopped."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    host, _, port = args.listen.rpartition(":")
    if args.insecure:
        app = build_app(f"http://{args.upstream}", False)
        tls: dict[str, str] = {}
    else:
        app = build_app(f"https://{args.upstream}", ssl.create_default_context(cafile=args.cafile))
        tls = {"ssl_certfile": args.certfile, "ssl_keyfile": args.keyfile}
    uvicorn.run(app, host=host.strip("[]"), port=int(port), log_level="warning",
                access_log=False, **tls)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
