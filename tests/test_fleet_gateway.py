"""deploy/fleet_gateway.py: SuperNodes' requests pass, the Control and Runtime APIs do not.

What a host holding only ``ca.crt`` gets from a real secured deployment is
tests/test_deploy.py's ``test_a_host_holding_only_ca_crt_...``.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.test_deploy import REPO

sys.path.insert(0, str(REPO / "deploy"))

from fleet_gateway import FLEET_ROUTES, build_app


def recording_superlink() -> tuple[Starlette, list[tuple[str, str, bytes, str | None]]]:
    """A stand-in SuperLink that answers every request and records what reached it."""
    seen: list[tuple[str, str, bytes, str | None]] = []

    async def answer(request: Request) -> Response:
        seen.append((request.method, request.url.path, await request.body(),
                     request.headers.get("flwr-signature")))
        return Response(b"reply:" + request.url.path.encode(), status_code=200,
                        headers={"content-type": "application/protobuf"})

    app = Starlette(routes=[Route("/{rest:path}", answer, methods=["GET", "POST"])])
    return app, seen


@pytest.fixture
def gateway() -> tuple[TestClient, list]:
    upstream, seen = recording_superlink()
    app = build_app("http://superlink", False, transport=httpx.ASGITransport(app=upstream))
    with TestClient(app) as client:
        yield client, seen


def test_every_fleet_route_is_forwarded_with_its_body_and_signature(gateway) -> None:
    client, seen = gateway
    for path in FLEET_ROUTES:
        reply = client.post(path, content=b"\x08\x01", headers={"flwr-signature": "sig"})
        assert reply.status_code == 200, path
        assert reply.content == b"reply:" + path.encode()
    assert seen == [("POST", path, b"\x08\x01", "sig") for path in FLEET_ROUTES]


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/control/register-node"),
    ("POST", "/v1/control/list-runs"),
    ("POST", "/v1/control/start-run"),
    ("POST", "/v1/runtime/push-messages"),
    ("GET", "/v1/fleet/pull-messages"),
    ("POST", "/v1/fleet/../control/start-run"),
    ("POST", "/v1/fleet/register-node/extra"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/health"),
])
def test_everything_else_is_refused_and_never_reaches_the_superlink(
    gateway, method: str, path: str
) -> None:
    client, seen = gateway
    reply = client.request(method, path, content=b"x")
    assert reply.status_code == 403
    assert "Fleet API (SuperNodes) only" in reply.text
    assert seen == []


def test_the_gateway_refuses_to_start_without_tls_files_or_insecure() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "deploy/fleet_gateway.py"), "--listen", "127.0.0.1:1",
         "--upstream", "127.0.0.1:2"], capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "give --certfile, --keyfile and --cafile (TLS), or --insecure" in result.stderr
