"""Hostile names, headers and properties generated with hypothesis (Unicode, NUL, unpaired
surrogates, quotes, SQL fragments, very long strings): every answer is a 4xx problem — 422
for what the schema refuses — or an exact round trip; never a 500.

Requests are written as JSON text with ``ensure_ascii`` so that an unpaired surrogate
travels as the ``\\ud800`` escape a hostile client would send.
"""

from __future__ import annotations

import base64
import json
import re
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.domain.model import NAME_RE
from tests.support import LiveServer

SQL = [
    "'; DROP TABLE messages; --",
    '" OR 1=1 --',
    "q'); DELETE FROM queues; --",
    "$$; SELECT pg_sleep(10); $$",
    "%s%s%s%n",
    "\\x00",
    "../../etc/passwd",
    "amq.direct",
    "a" * 255,
    "a" * 256,
    "é" * 300,
    "x" * 20_000,
]

hostile_text = st.one_of(
    st.sampled_from(SQL),
    st.text(max_size=40),  # any code point, surrogates and NUL included
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300),
    st.text(alphabet="\x00'\"\\;-%$ \t\n\r\u202e\ufeff\U0001f600", max_size=30),
)

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)
headers = st.dictionaries(hostile_text, json_value, max_size=5)
properties = st.fixed_dictionaries(
    {},
    optional={
        "message_id": hostile_text,
        "correlation_id": hostile_text,
        "reply_to": hostile_text,
        "content_type": hostile_text,
    },
)

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
HEAVY = settings(FAST, max_examples=600)


def send(api: httpx.Client, method: str, path: str, payload: Any) -> httpx.Response:
    return api.request(
        method,
        path,
        content=json.dumps(payload),  # ensure_ascii: surrogates as \\udXXX escapes
        headers={"content-type": "application/json"},
    )


def no_500(r: httpx.Response, *allowed: int) -> None:
    assert r.status_code < 500, f"{r.status_code} {r.text[:300]}"
    if allowed:
        assert r.status_code in allowed, f"{r.status_code} {r.text[:300]}"
    if r.status_code >= 400:
        problem = r.json()
        assert {"type", "title", "status", "detail", "code"} <= problem.keys()


def path_of(name: str) -> str:
    return quote(name.encode("utf-8", "surrogatepass"), safe="")


def storable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in value


def same_json(a: Any, b: Any) -> bool:
    """JSON equality, numbers by decimal value (jsonb keeps a number's value, not its
    spelling or whether Python would read it as an int or a float)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        # the decimal value written in the JSON text: 1.5e+16 and 15000000000000000 are the
        # same JSON number (jsonb keeps numbers as decimals)
        return Decimal(json.dumps(a)) == Decimal(json.dumps(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# -- names ----------------------------------------------------------------------------------


def check_name(api: httpx.Client, name: str, args: dict[str, Any]) -> None:
    valid = NAME_RE.fullmatch(name) is not None
    r = send(api, "PUT", f"/queues/{path_of(name)}", {"arguments": args})
    if name in ("", ".", ".."):
        # the client resolves these away (RFC 3986): "/queues/" (404: no trailing-slash
        # redirects) or "/api/v1/" (405): anything but a 5xx
        no_500(r)
        assert r.status_code >= 300
        return
    if not valid:
        no_500(r, 404, 403, 422)
        return
    if name.startswith("amq."):
        no_500(r, 403, 422)
        return
    no_500(r, 200, 201, 422)
    if r.status_code == 422:
        return
    got = api.get(f"/queues/{path_of(name)}")
    no_500(got, 200)
    assert got.json()["name"] == name
    assert same_json(got.json()["arguments"], args)
    listed = api.get("/queues", params={"after": name[:-1] or None, "limit": 1000})
    no_500(listed, 200, 422)
    no_500(api.delete(f"/queues/{path_of(name)}"), 204)


def hostile_names(server: LiveServer, admin: httpx.Client, examples: settings) -> None:
    @examples
    @given(name=hostile_text, args=st.dictionaries(hostile_text, json_value, max_size=3))
    @example(name="", args={})
    @example(name=".", args={})
    @example(name="..", args={})
    @example(name="q\x00", args={"\ud800": "\x00"})
    @example(name="amq.x", args={})
    def run(name: str, args: dict[str, Any]) -> None:
        check_name(admin, name, args)
        r = send(admin, "PUT", f"/exchanges/{path_of(name)}", {"type": "topic", "arguments": args})
        no_500(r)
        if r.status_code in (200, 201):
            no_500(admin.delete(f"/exchanges/{path_of(name)}"), 204)
        no_500(admin.get("/queues", params={"after": name}), 200, 422)
        no_500(admin.get("/bindings", params={"exchange": name}), 200, 422)
        no_500(admin.get(f"/users/{path_of(name)}"))

    run()


def test_hostile_names_never_500(server: LiveServer, admin: httpx.Client) -> None:
    hostile_names(server, admin, FAST)


@pytest.mark.slow
def test_hostile_names_never_500_many(server: LiveServer, admin: httpx.Client) -> None:
    hostile_names(server, admin, HEAVY)


# -- headers, properties, routing keys, bodies ----------------------------------------------


def hostile_messages(admin: httpx.Client, examples: settings) -> None:
    assert admin.put("/queues/hostile", json={}).status_code in (200, 201)

    @examples
    @given(h=headers, p=properties, body=json_value, key=hostile_text)
    def run(h: dict[str, Any], p: dict[str, str], body: Any, key: str) -> None:
        payload = {"body": body, "headers": h, "properties": p, "routing_key": key}
        r = send(admin, "POST", "/queues/hostile/messages", payload)
        no_500(r, 200, 422)
        if r.status_code != 200:
            return
        got = admin.post("/queues/hostile/get", json={"max_messages": 1})
        no_500(got, 200)
        (m,) = got.json()["messages"]
        assert admin.post(f"/deliveries/{m['delivery_tag']}/ack").status_code == 204
        assert m["message_id"] == r.json()["message_id"]
        assert same_json(m["body"], body), (m["body"], body)
        assert same_json(m["headers"], h), (m["headers"], h)
        for k, v in p.items():
            assert m["properties"][k] == v
        # through an exchange, the routing key too
        r = send(admin, "POST", "/exchanges/amq.topic/publish", payload)
        no_500(r, 200, 422)

    run()


def test_hostile_headers_and_properties_422_or_exact_round_trip(admin: httpx.Client) -> None:
    hostile_messages(admin, FAST)


@pytest.mark.slow
def test_hostile_headers_and_properties_many(admin: httpx.Client) -> None:
    hostile_messages(admin, HEAVY)


# -- credentials and users ------------------------------------------------------------------


def from_other_address(server: LiveServer) -> httpx.Client:
    """A client whose failed logins count against 127.0.0.2, not against the admin's
    127.0.0.1 (30 failures from one address lock that address out, admin included)."""
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    return httpx.Client(base_url=f"{server.base_url}/api/v1", transport=transport, timeout=30)


def printable(raw: bytes) -> bytes:
    return bytes(b for b in raw if 0x20 <= b < 0x7F)


def hostile_accounts(server: LiveServer, admin: httpx.Client, examples: settings) -> None:
    with from_other_address(server) as stranger:

        @examples
        @given(user=hostile_text, password=hostile_text, pattern=hostile_text)
        def run(user: str, password: str, pattern: str) -> None:
            r = send(stranger, "POST", "/auth/login", {"username": user, "password": password})
            no_500(r, 401, 422, 429)
            raw = f"{user}:{password}".encode("utf-8", "surrogatepass")
            basic = b"Basic " + base64.b64encode(raw)
            no_500(stranger.get("/auth/me", headers={b"Authorization": basic}), 401, 429)
            bearer = b"Bearer " + (printable(raw).strip() or b"x")
            no_500(stranger.get("/auth/me", headers={b"Authorization": bearer}), 401, 429)
            body = {
                "password": password or "x",
                "role": "user",
                "permissions": {"configure": pattern, "write": pattern, "read": ""},
            }
            name = "u-" + re.sub(r"[^A-Za-z0-9_.:-]", "", user)[:200]
            r = send(admin, "PUT", f"/users/{path_of(name)}", body)
            no_500(r, 200, 201, 422)
            if r.status_code in (200, 201):
                got = admin.get(f"/users/{path_of(name)}").json()
                assert got["permissions"]["configure"] == pattern
                # no password nor hash field (a pattern may itself read "password")
                keys = set(got) | set(got["permissions"])
                assert not {k for k in keys if "password" in k or "hash" in k}, got
                no_500(admin.delete(f"/users/{path_of(name)}"), 204)

        run()


def test_hostile_credentials_and_permissions_never_500(
    server: LiveServer, admin: httpx.Client
) -> None:
    hostile_accounts(server, admin, FAST)


@pytest.mark.slow
def test_hostile_credentials_and_permissions_many(server: LiveServer, admin: httpx.Client) -> None:
    hostile_accounts(server, admin, HEAVY)


# -- the defects this suite found, pinned -----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("PUT", "/queues/q-surrogate", '{"arguments": {"x": "\\ud800"}}'),
        ("PUT", "/queues/q-surrogate-key", '{"arguments": {"\\udc00": 1}}'),
        ("PUT", "/exchanges/x-surrogate", '{"type": "direct", "arguments": {"x": "\\ud800"}}'),
        (
            "POST",
            "/bindings",
            '{"exchange": "amq.headers", "queue": "q", "arguments": {"a": "\\ud800"}}',
        ),
        (
            "PUT",
            "/users/nul-pattern",
            '{"password": "pw", "role": "user", '
            '"permissions": {"configure": "\\u0000", "write": "", "read": ""}}',
        ),
    ],
)
def test_unstorable_strings_are_422_not_500(
    admin: httpx.Client, method: str, path: str, raw: str
) -> None:
    """Regression: an unpaired surrogate in queue/exchange/binding arguments, and a NUL in a
    permission pattern, reached PostgreSQL and came back as 500."""
    assert admin.put("/queues/q", json={}).status_code in (200, 201)
    r = admin.request(method, path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error"
