"""What a stranger on the network or a malicious web page can reach (issue 18, contract §3).

- Host (finding 3): a DNS-rebinding page reaches a loopback broker with its own name in
  ``Host``; that is 400, for REST and for the WebSocket upgrade, so the guest's loopback rule
  and the WebSocket same-origin rule cannot be beaten that way.
- Proxies (finding 4): ``X-Forwarded-For`` / ``Forwarded`` only from
  ``MESSAGEX_TRUSTED_PROXIES``; otherwise the client is the socket's peer.
- Cross-site writes (finding 7): no Basic challenge; a request a cross-site form could send
  changes nothing.
- The publish edge authenticates before it reads the body (finding 12).
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.api.exposure import allowed_hosts, client_behind_proxies, parse_networks
from tests.api.test_publish import sql
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, client, running_server
from tests.support import test_settings as settings_for

BASIC_ADMIN = "Basic " + base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


def raw_exchange(port: int, request: bytes, timeout: float = 10) -> bytes:
    """Send ``request`` on a fresh TCP connection; the response head (up to the blank line)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in data and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def status_of(head: bytes) -> int:
    assert head.startswith(b"HTTP/1.1 "), head[:200]
    return int(head.split(b" ", 2)[1])


def upgrade(port: int, host: str, origin: str | None, authorization: str) -> bytes:
    key = base64.b64encode(b"0123456789abcdef").decode()
    lines = [
        "GET /api/v1/ws HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"Authorization: {authorization}",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return raw_exchange(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


@pytest.fixture
def guest_server(database_url: str) -> Iterator[LiveServer]:
    """A broker with the bootstrap guest (no admin configured), on loopback."""
    with running_server(settings_for(database_url, admin_user=None, admin_password=None)) as live:
        yield live


# --- Host (finding 3) -----------------------------------------------------------------------


def test_a_rebinding_host_gets_400_not_the_guests_admin(guest_server: LiveServer) -> None:
    """Before: ``Host: attacker.example:PORT`` with Basic guest:guest on GET /users → 200."""
    port = guest_server.port
    with client(guest_server.base_url, auth=("guest", "guest")) as guest:
        r = guest.get("/users", headers={"Host": f"attacker.example:{port}"})
        assert r.status_code == 400, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "bad_request"
        assert "Host" in r.json()["detail"]
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
            assert guest.get("/users", headers={"Host": host}).status_code == 200, host
        # a refused Host changes nothing
        r = guest.put("/queues/rebound", json={}, headers={"Host": "attacker.example"})
        assert r.status_code == 400
        assert guest.get("/queues/rebound").status_code == 404


def test_a_rebinding_websocket_is_refused_before_the_upgrade(guest_server: LiveServer) -> None:
    """Before: ``Origin`` and ``Host`` both ``attacker.example:PORT`` → CONNECTED as admin."""
    port = guest_server.port
    evil = f"attacker.example:{port}"
    head = upgrade(port, evil, f"http://{evil}", GUEST)
    assert status_of(head) == 400, head
    assert b"application/problem+json" in head
    same = f"127.0.0.1:{port}"
    assert status_of(upgrade(port, same, f"http://{same}", GUEST)) == 101


def test_allowed_hosts_setting(database_url: str) -> None:
    settings = settings_for(database_url, allowed_hosts="broker.example, [::1]")
    with running_server(settings) as live, client(live.base_url) as anon:
        assert anon.get("/auth/me", headers={"Host": "broker.example:443"}).status_code == 401
        assert anon.get("/auth/me", headers={"Host": "[::1]"}).status_code == 401
        assert anon.get("/auth/me", headers={"Host": "127.0.0.1"}).status_code == 400
        assert (
            httpx.get(f"{live.base_url}/healthz", headers={"Host": "x.example"}).status_code == 400
        )


def test_default_hosts_depend_on_the_listen_address() -> None:
    assert allowed_hosts("", "127.0.0.1") == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("", "::1") == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("", "localhost") == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("", "0.0.0.0") is None
    assert allowed_hosts("", "192.0.2.10") is None
    assert allowed_hosts("*", "127.0.0.1") is None
    assert allowed_hosts("Broker.Example:8000,[::1]", "0.0.0.0") == frozenset(
        {"broker.example", "::1"}
    )


# --- proxies (finding 4) ------------------------------------------------------------------


def failure_keys(server: LiveServer) -> set[str]:
    return {row["key"] for row in sql(server, "SELECT key FROM auth_failures")}


def test_forwarded_headers_are_ignored_by_default(guest_server: LiveServer) -> None:
    """Before: uvicorn believed X-Forwarded-For from loopback: any string became the client
    (40 failures with a new fake address each: no 429), and a remote client behind a
    same-host proxy looked local."""
    with client(guest_server.base_url) as anon:
        codes = []
        for i in range(40):
            r = anon.post(
                "/auth/login",
                json={"username": f"nobody-{i}", "password": "wrong-password"},
                headers={"X-Forwarded-For": f"198.51.100.{i}", "Forwarded": f"for=192.0.2.{i}"},
            )
            codes.append(r.status_code)
        assert codes[:30] == [401] * 30
        assert set(codes[30:]) == {429}  # all counted against the socket's peer
        assert {k for k in failure_keys(guest_server) if k.startswith("addr:")} == {
            "addr:127.0.0.1"
        }


def test_trusted_proxies_name_the_client(database_url: str) -> None:
    settings = settings_for(
        database_url, admin_user=None, admin_password=None, trusted_proxies="127.0.0.0/8"
    )
    with running_server(settings) as live, client(live.base_url) as anon:
        # the guest is loopback-only: through the proxy, a remote client is remote
        remote = {"X-Forwarded-For": "203.0.113.7", "Authorization": GUEST}
        assert anon.get("/auth/me", headers=remote).status_code == 401
        assert anon.get("/auth/me", headers={"Authorization": GUEST}).status_code == 200
        # the right-most untrusted address is the client; what the client itself wrote
        # (the left-most entries) is not believed
        anon.post(
            "/auth/login",
            json={"username": "nobody", "password": "wrong-password"},
            headers={"X-Forwarded-For": "10.9.9.9, 198.51.100.20, 127.0.0.5"},
        )
        anon.post(
            "/auth/login",
            json={"username": "nobody", "password": "wrong-password"},
            headers={"Forwarded": 'for="[2001:db8::1]:4711";proto=https'},
        )
        anon.post(
            "/auth/login",
            json={"username": "nobody", "password": "wrong-password"},
            headers={"X-Forwarded-For": "not-an-address"},
        )
        addresses = {k for k in failure_keys(live) if k.startswith("addr:")}
        assert addresses == {
            "addr:203.0.113.7",
            "addr:198.51.100.20",
            "addr:2001:db8::1",
            "addr:127.0.0.1",
        }


@pytest.mark.parametrize(
    ("peer", "headers", "expected"),
    [
        ("198.51.100.1", [(b"x-forwarded-for", b"1.2.3.4")], "198.51.100.1"),  # untrusted peer
        ("10.0.0.1", [(b"x-forwarded-for", b"1.2.3.4")], "1.2.3.4"),
        ("10.0.0.1", [(b"x-forwarded-for", b"1.2.3.4, 10.0.0.2")], "1.2.3.4"),
        ("10.0.0.1", [(b"x-forwarded-for", b"10.0.0.3, 10.0.0.2")], "10.0.0.3"),
        ("10.0.0.1", [(b"x-forwarded-for", b"junk")], "10.0.0.1"),
        ("10.0.0.1", [(b"forwarded", b'for="[::ffff:1.2.3.4]:80", for=10.0.0.9')], "1.2.3.4"),
        ("10.0.0.1", [(b"forwarded", b"for=unknown")], "10.0.0.1"),
        ("10.0.0.1", [], "10.0.0.1"),
    ],
)
def test_the_forwarded_chain(peer: str, headers: list[tuple[bytes, bytes]], expected: str) -> None:
    assert client_behind_proxies(peer, headers, parse_networks("10.0.0.0/8")) == expected


def test_uvicorn_proxy_headers_are_off(server: LiveServer) -> None:
    assert server.server.config.proxy_headers is False


# --- cross-site writes (finding 7) ---------------------------------------------------------


def ready(admin: httpx.Client, queue: str) -> int:
    stats: dict[str, Any] = admin.get(f"/queues/{queue}").json()["stats"]
    return int(stats["ready"])


def test_no_basic_challenge(anon: httpx.Client) -> None:
    r = anon.get("/auth/me")
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="messagex"'
    assert "basic" not in r.headers["www-authenticate"].lower()


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Content-Type": "application/x-www-form-urlencoded"}, 400),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 400),
        ({"Content-Type": "text/plain;charset=UTF-8"}, 400),
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "same-site"}, 403),
    ],
)
def test_a_request_a_cross_site_form_could_send_changes_nothing(
    server: LiveServer, admin: httpx.Client, headers: dict[str, str], status: int
) -> None:
    """Before: a cross-site form POST to /queues/q/purge with cached Basic credentials purged
    the queue."""
    assert admin.put("/queues/csrf", json={}).status_code in (200, 201)
    assert admin.post("/queues/csrf/messages", json={"body": 1}).status_code == 200
    r = admin.post("/queues/csrf/purge", content=b"a=b", headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["code"] == ("bad_request" if status == 400 else "forbidden")
    assert ready(admin, "csrf") == 1
    r = admin.post("/queues/csrf/messages", content=b'{"body": 2}', headers=headers)
    assert r.status_code == status, r.text
    assert ready(admin, "csrf") == 1


def test_curl_and_same_origin_writes_still_work(server: LiveServer, admin: httpx.Client) -> None:
    assert admin.put("/queues/own", json={}).status_code in (200, 201)
    assert admin.post("/queues/own/messages", json={"body": 1}).status_code == 200
    # curl -X POST .../purge -H "$AUTH": no body, no Content-Type
    assert admin.post("/queues/own/purge").status_code == 200
    assert admin.post("/queues/own/messages", json={"body": 1}).status_code == 200
    same = {"Origin": server.base_url, "Sec-Fetch-Site": "same-origin"}
    assert admin.post("/queues/own/purge", headers=same).status_code == 200
    assert ready(admin, "own") == 0
    # reads are not affected by the rule
    assert admin.get("/queues/own", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200


# --- the publish edge authenticates first (finding 12) ---------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/queues/q/messages", "/api/v1/exchanges/x/publish"])
def test_a_publish_is_refused_before_its_body_is_read(server: LiveServer, path: str) -> None:
    """Before: the edge read (and parsed) up to 16 MiB before authenticating; a client that
    announced 8 MB and sent 1 KiB waited for an answer that never came."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 8000000\r\n"
        "Authorization: Basic Zm9vOmJhcg==\r\n\r\n"
    ).encode()
    answer = raw_exchange(server.port, head + b"[" * 1024, timeout=5)
    assert status_of(answer) == 401, answer


def test_compose_requires_the_admin_password_from_the_environment() -> None:
    """Before: compose.yaml shipped ``change-me`` as the admin's password."""
    text = (Path(__file__).resolve().parents[2] / "compose.yaml").read_text()
    assert "change-me" not in text
    assert "MESSAGEX_ADMIN_PASSWORD: ${MESSAGEX_ADMIN_PASSWORD:?" in text
    assert "MESSAGEX_ALLOWED_HOSTS: ${MESSAGEX_ALLOWED_HOSTS:-localhost,127.0.0.1,[::1]}" in text
