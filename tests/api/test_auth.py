"""Authentication through the real server: login/logout/me, Basic, rate limiting, bootstrap."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    admin_sql,
    client,
    login,
    running_server,
)
from tests.support import test_settings as settings_for

ADDR = "addr:127.0.0.1"


def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def failures(url: str) -> dict[str, int]:
    return {r["key"]: r["failures"] for r in fetch(url, "SELECT key, failures FROM auth_failures")}


def make_user(admin: httpx.Client, name: str, password: str = "pw-" + "x" * 8, **body: Any) -> None:
    r = admin.put(f"/users/{name}", json={"password": password, **body})
    assert r.status_code == 201, r.text


def post_login(server: LiveServer, username: Any, password: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/api/v1/auth/login", json={"username": username, "password": password}
    )


def me(server: LiveServer, **kwargs: Any) -> httpx.Response:
    return httpx.get(f"{server.base_url}/api/v1/auth/me", **kwargs)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_unauthorized(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == "unauthorized"
    assert {"type", "title", "status", "detail", "code"} <= body.keys()
    assert "www-authenticate" in r.headers


def assert_rate_limited(r: httpx.Response) -> int:
    assert r.status_code == 429, r.text
    assert r.json()["code"] == "rate_limited"
    retry_after = int(r.headers["Retry-After"])
    assert 1 <= retry_after <= 60
    return retry_after


# --- login / logout / me --------------------------------------------------------------------


def test_login_issues_a_bearer_token_stored_only_as_its_sha256(
    server: LiveServer, database_url: str
) -> None:
    r = post_login(server, ADMIN_USER, ADMIN_PASSWORD)
    assert r.status_code == 201
    body = r.json()
    assert set(body) == {"token", "token_type", "expires_at"}
    assert body["token_type"] == "bearer"
    token = body["token"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43,}", token)  # ≥ 32 random bytes, URL-safe

    (row,) = fetch(
        database_url, "SELECT token_digest, expires_at - now() AS ttl FROM management_sessions"
    )
    assert bytes(row["token_digest"]) == hashlib.sha256(token.encode()).digest()
    assert timedelta(seconds=86400 - 60) < row["ttl"] <= timedelta(seconds=86400)
    expires_at = datetime.fromisoformat(body["expires_at"].replace("Z", "+00:00"))
    assert abs(expires_at - (datetime.now(UTC) + timedelta(seconds=86400))) < timedelta(minutes=5)

    r = me(server, headers=bearer(token))
    assert r.status_code == 200
    assert r.json() == {
        "username": ADMIN_USER,
        "role": "admin",
        "permissions": {"configure": ".*", "write": ".*", "read": ".*"},
    }


def test_session_ttl_setting_sets_expiry(database_url: str) -> None:
    with running_server(settings_for(database_url, session_ttl_seconds=120)) as live:
        r = post_login(live, ADMIN_USER, ADMIN_PASSWORD)
        assert r.status_code == 201
        (row,) = fetch(database_url, "SELECT expires_at - now() AS ttl FROM management_sessions")
        assert timedelta(seconds=60) < row["ttl"] <= timedelta(seconds=120)


def test_logout_revokes_that_token_at_once(server: LiveServer) -> None:
    first = login(server.base_url, ADMIN_USER, ADMIN_PASSWORD)
    second = login(server.base_url, ADMIN_USER, ADMIN_PASSWORD)
    assert first != second
    r = httpx.post(f"{server.base_url}/api/v1/auth/logout", headers=bearer(first))
    assert r.status_code == 204
    assert r.content == b""
    assert_unauthorized(me(server, headers=bearer(first)))
    assert_unauthorized(httpx.post(f"{server.base_url}/api/v1/auth/logout", headers=bearer(first)))
    assert me(server, headers=bearer(second)).status_code == 200


def test_logout_with_basic_is_204_and_basic_keeps_working(admin: httpx.Client) -> None:
    r = admin.post("/auth/logout")
    assert r.status_code == 204
    assert admin.get("/auth/me").status_code == 200


def test_logout_needs_credentials(anon: httpx.Client) -> None:
    assert_unauthorized(anon.post("/auth/logout"))


def test_expired_token_is_refused(server: LiveServer, database_url: str) -> None:
    token = login(server.base_url, ADMIN_USER, ADMIN_PASSWORD)
    assert me(server, headers=bearer(token)).status_code == 200
    admin_sql(
        database_url, "UPDATE management_sessions SET expires_at = now() - interval '1 second'"
    )
    assert_unauthorized(me(server, headers=bearer(token)))


def test_me_with_basic_shows_role_and_permissions(admin: httpx.Client, server: LiveServer) -> None:
    make_user(
        admin, "carol", "carol-pw", permissions={"configure": "c.*", "write": "w", "read": ""}
    )
    r = me(server, auth=("carol", "carol-pw"))
    assert r.status_code == 200
    assert r.json() == {
        "username": "carol",
        "role": "user",
        "permissions": {"configure": "c.*", "write": "w", "read": ""},
    }


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic !!!notbase64"},
        {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
        {"Authorization": "Digest username=admin"},
        {"Authorization": "Bearer not-a-real-token"},
    ],
)
def test_missing_malformed_or_bad_credentials_are_401(
    server: LiveServer, headers: dict[str, str]
) -> None:
    assert_unauthorized(me(server, headers=headers))


def test_protected_routes_refuse_anonymous_callers(anon: httpx.Client) -> None:
    for method, path in [
        ("GET", "/auth/me"),
        ("GET", "/users"),
        ("GET", "/users/admin"),
        ("PUT", "/users/x"),
        ("DELETE", "/users/x"),
    ]:
        assert_unauthorized(anon.request(method, path))


def test_unknown_user_and_wrong_password_get_the_same_answer(
    server: LiveServer, admin: httpx.Client
) -> None:
    make_user(admin, "dave", "dave-password")
    unknown = post_login(server, "nobody", "whatever")
    wrong = post_login(server, "dave", "not-dave-pw")
    assert unknown.status_code == wrong.status_code == 401
    assert unknown.json() == wrong.json()
    assert unknown.headers["www-authenticate"] == wrong.headers["www-authenticate"]
    basic_unknown = me(server, auth=("nobody", "whatever"))
    basic_wrong = me(server, auth=("dave", "not-dave-pw"))
    assert basic_unknown.status_code == basic_wrong.status_code == 401
    assert basic_unknown.json() == basic_wrong.json()


@pytest.mark.parametrize("username", ["", "no spaces allowed", "x" * 300, "nul\u0000byte", "-x"])
def test_login_with_an_impossible_username_is_a_counted_failure(
    server: LiveServer, database_url: str, username: str
) -> None:
    r = post_login(server, username, "pw")
    assert_unauthorized(r)
    counted = failures(database_url)
    assert counted[ADDR] == 1
    assert len(counted) == 2  # the address and (a digest of) the name
    assert all(len(key) < 100 for key in counted)


def test_malformed_login_bodies_are_not_authentication_failures(
    server: LiveServer, database_url: str
) -> None:
    url = f"{server.base_url}/api/v1/auth/login"
    assert httpx.post(url, json={"username": "a"}).status_code == 422
    assert httpx.post(url, json={"username": "a", "password": "b", "x": 1}).status_code == 422
    r = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["code"] == "bad_request"
    assert failures(database_url) == {}


def test_login_response_and_errors_never_echo_the_password(server: LiveServer) -> None:
    secret = "very-secret-password-123"
    for r in (
        post_login(server, ADMIN_USER, secret),
        post_login(server, "nobody", secret),
        httpx.post(f"{server.base_url}/api/v1/auth/login", json={"password": secret}),
    ):
        assert secret not in r.text
        assert "$argon2" not in r.text


# --- rate limiting --------------------------------------------------------------------------


def test_ten_failures_for_a_user_lock_it_out_even_with_the_right_password(
    server: LiveServer, admin: httpx.Client, database_url: str
) -> None:
    make_user(admin, "erin", "erin-password")
    for _ in range(10):
        assert_unauthorized(post_login(server, "erin", "wrong"))
    assert failures(database_url) == {"user:erin": 10, ADDR: 10}

    assert_rate_limited(post_login(server, "erin", "erin-password"))
    assert_rate_limited(me(server, auth=("erin", "erin-password")))
    assert_rate_limited(post_login(server, "erin", "wrong"))
    # 429 answers are not counted.
    assert failures(database_url) == {"user:erin": 10, ADDR: 10}
    # Another user from the same address is not affected (the address is below 30).
    assert admin.get("/auth/me").status_code == 200

    # The fixed window ends 60 s after the first counted failure.
    admin_sql(
        database_url,
        "UPDATE auth_failures SET window_start = window_start - interval '61 seconds'",
    )
    assert post_login(server, "erin", "erin-password").status_code == 201


def test_unknown_usernames_are_limited_too(server: LiveServer, database_url: str) -> None:
    admin_sql(database_url, "INSERT INTO auth_failures (key, failures) VALUES ('user:ghost', 9)")
    assert_unauthorized(post_login(server, "ghost", "x"))
    assert_rate_limited(post_login(server, "ghost", "x"))


def test_retry_after_counts_the_seconds_left_in_the_window(
    server: LiveServer, database_url: str
) -> None:
    admin_sql(
        database_url,
        "INSERT INTO auth_failures (key, failures, window_start) "
        "VALUES ('user:frank', 10, now() - interval '45 seconds')",
    )
    retry_after = assert_rate_limited(post_login(server, "frank", "x"))
    assert 14 <= retry_after <= 16


def test_thirty_bad_tokens_lock_out_the_address_for_every_credential(
    server: LiveServer, admin: httpx.Client, database_url: str
) -> None:
    token = login(server.base_url, ADMIN_USER, ADMIN_PASSWORD)
    assert admin.get("/auth/me").status_code == 200  # Basic now cached on this process
    for i in range(30):
        assert_unauthorized(me(server, headers=bearer(f"bad-token-{i}")))
    # A bad bearer token counts against the address only.
    assert failures(database_url) == {ADDR: 30}
    assert_rate_limited(me(server, headers=bearer(token)))
    assert_rate_limited(admin.get("/auth/me"))  # the cache does not bypass a local lockout
    assert_rate_limited(post_login(server, ADMIN_USER, ADMIN_PASSWORD))
    assert failures(database_url) == {ADDR: 30}


def test_requests_without_credentials_are_not_counted(
    anon: httpx.Client, admin: httpx.Client, database_url: str
) -> None:
    for _ in range(35):
        assert_unauthorized(anon.get("/auth/me"))
    assert failures(database_url) == {}
    assert admin.get("/auth/me").status_code == 200


def test_reaching_the_limit_drops_the_cached_basic_entry_at_once(
    server: LiveServer, admin: httpx.Client, database_url: str
) -> None:
    make_user(admin, "gina", "gina-password")
    assert me(server, auth=("gina", "gina-password")).status_code == 200  # now cached
    admin_sql(database_url, "INSERT INTO auth_failures (key, failures) VALUES ('user:gina', 9)")
    assert me(server, auth=("gina", "gina-password")).status_code == 200  # a cache hit: no database
    assert_unauthorized(me(server, auth=("gina", "wrong")))  # the 10th failure, on this process
    assert_rate_limited(me(server, auth=("gina", "gina-password")))


def test_failures_on_two_processes_add_up(database_url: str) -> None:
    """Two servers on one database share the counters: failures on both lock the user out on
    both."""
    with (
        running_server(settings_for(database_url)) as one,
        running_server(settings_for(database_url)) as two,
    ):
        with client(one.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as adm:
            make_user(adm, "hank", "hank-password")
        admin_sql(database_url, "INSERT INTO auth_failures (key, failures) VALUES ('user:hank', 8)")
        assert_unauthorized(post_login(one, "hank", "wrong"))
        assert post_login(two, "hank", "hank-password").status_code == 201  # 9 failures: not yet
        assert_unauthorized(post_login(two, "hank", "wrong"))
        assert_rate_limited(post_login(one, "hank", "hank-password"))
        assert_rate_limited(me(two, auth=("hank", "hank-password")))
        assert failures(database_url)["user:hank"] == 10


# --- bootstrap ------------------------------------------------------------------------------


def test_without_admin_settings_the_loopback_guest_is_bootstrapped(database_url: str) -> None:
    assert fetch(database_url, "SELECT 1 FROM broker_users") == []
    settings = settings_for(database_url, admin_user=None, admin_password=None)
    with running_server(settings) as live:
        r = me(live, auth=("guest", "guest"))
        assert r.status_code == 200
        assert r.json()["role"] == "admin"
        with client(live.base_url, auth=("guest", "guest")) as guest:
            names = [u["username"] for u in guest.get("/users").json()["items"]]
        assert names == ["guest"]
        assert post_login(live, "guest", "guest").status_code == 201
        assert_unauthorized(me(live, auth=("guest", "not-guest")))
    (row,) = fetch(database_url, "SELECT loopback_only, role FROM broker_users")
    assert row["loopback_only"] is True
    assert row["role"] == "admin"


def test_configured_admin_is_bootstrapped_and_no_guest(
    server: LiveServer, database_url: str
) -> None:
    rows = fetch(database_url, "SELECT username, role, loopback_only FROM broker_users")
    assert [(r["username"], r["role"], r["loopback_only"]) for r in rows] == [
        (ADMIN_USER, "admin", False)
    ]
    assert_unauthorized(me(server, auth=("guest", "guest")))


def test_bootstrap_does_nothing_when_users_exist(database_url: str) -> None:
    with running_server(settings_for(database_url, admin_user=None, admin_password=None)):
        pass
    with running_server(settings_for(database_url)) as live:
        assert_unauthorized(me(live, auth=(ADMIN_USER, ADMIN_PASSWORD)))
        assert me(live, auth=("guest", "guest")).status_code == 200
    names = [r["username"] for r in fetch(database_url, "SELECT username FROM broker_users")]
    assert names == ["guest"]
