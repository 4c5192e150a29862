"""User management through the real server: CRUD, validation, authorization, revocation."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import re2  # type: ignore[import-untyped]

from app.auth.permissions import _compiled
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    client,
    login,
    running_server,
    wait_for,
)
from tests.support import test_settings as settings_for

NO_PERMISSIONS = {"configure": "", "write": "", "read": ""}


def put(admin: httpx.Client, name: str, **body: Any) -> httpx.Response:
    return admin.put(f"/users/{name}", json=body)


def me(server: LiveServer, **kwargs: Any) -> httpx.Response:
    return httpx.get(f"{server.base_url}/api/v1/auth/me", **kwargs)


def assert_no_secrets(r: httpx.Response, *passwords: str) -> None:
    assert "password" not in r.text
    assert "$argon2" not in r.text
    for password in passwords:
        assert password not in r.text


def assert_validation_error(r: httpx.Response, *loc: str) -> None:
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "validation_error"
    assert any(tuple(e["loc"][-len(loc) :]) == loc for e in body["errors"]), body


# --- CRUD -----------------------------------------------------------------------------------


def test_create_read_update_delete(admin: httpx.Client, server: LiveServer) -> None:
    r = put(admin, "alice", password="alice-pw-1")
    assert r.status_code == 201
    assert r.json() == {"username": "alice", "role": "user", "permissions": NO_PERMISSIONS}
    assert_no_secrets(r, "alice-pw-1")

    r = admin.get("/users/alice")
    assert r.status_code == 200
    assert r.json() == {"username": "alice", "role": "user", "permissions": NO_PERMISSIONS}

    perms = {"configure": "a\\..*", "write": "x|y", "read": ".*"}
    r = put(admin, "alice", role="admin", permissions=perms)  # no password: keep the current one
    assert r.status_code == 200
    assert r.json() == {"username": "alice", "role": "admin", "permissions": perms}
    assert me(server, auth=("alice", "alice-pw-1")).json()["role"] == "admin"

    r = put(admin, "alice", permissions={"read": "q"})  # PUT replaces: omitted fields reset
    assert r.status_code == 200
    assert r.json() == {
        "username": "alice",
        "role": "user",
        "permissions": {"configure": "", "write": "", "read": "q"},
    }

    r = admin.delete("/users/alice")
    assert r.status_code == 204
    assert r.content == b""
    r = admin.get("/users/alice")
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"
    assert admin.delete("/users/alice").status_code == 404


def test_password_is_required_to_create(admin: httpx.Client) -> None:
    assert_validation_error(put(admin, "nopw"), "password")
    assert_validation_error(admin.put("/users/nopw"), "password")  # no body at all
    assert admin.get("/users/nopw").status_code == 404


@pytest.mark.parametrize("field", ["configure", "write", "read"])
def test_invalid_regex_is_422_naming_the_field(admin: httpx.Client, field: str) -> None:
    r = put(admin, "rex", password="pw-secret", permissions={field: "(unclosed"})
    assert_validation_error(r, "permissions", field)
    assert field in r.json()["detail"]
    assert admin.get("/users/rex").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"password": ""},
        {"password": "pw-secret", "role": "root"},
        {"password": "pw-secret", "unknown": 1},
        {"password": "pw-secret", "permissions": {"read": ".*", "admin": ".*"}},
        {"password": 12345},
        {"password": "pw-secret", "permissions": {"read": 1}},
    ],
)
def test_bodies_that_break_the_schema_are_422(admin: httpx.Client, body: dict[str, Any]) -> None:
    r = admin.put("/users/val", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error"
    assert admin.get("/users/val").status_code == 404


@pytest.mark.parametrize("name", ["-lead", "has space", "x" * 256, "ümlaut", "a/b"])
def test_invalid_names_in_the_path_are_refused(admin: httpx.Client, name: str) -> None:
    r = admin.put(f"/users/{name}", json={"password": "pw-secret"})
    assert r.status_code in (404, 422), r.text
    assert admin.get(f"/users/{name}").status_code in (404, 422)


def test_names_may_use_every_allowed_character(admin: httpx.Client) -> None:
    name = "A-z_0.9:x"
    assert put(admin, name, password="pw-secret").status_code == 201
    assert admin.get(f"/users/{name}").json()["username"] == name
    assert put(admin, "x" * 255, password="pw-secret").status_code == 201


def test_no_response_carries_a_password_or_hash(admin: httpx.Client, server: LiveServer) -> None:
    secret = "s3cret-Value-xyz"
    responses = [
        put(admin, "sam", password=secret),
        put(admin, "sam", password=secret, role="admin"),
        admin.get("/users/sam"),
        admin.get("/users"),
        me(server, auth=("sam", secret)),
        put(admin, "sam", password=secret, permissions={"read": "("}),
    ]
    for r in responses:
        assert_no_secrets(r, secret)


# --- listing --------------------------------------------------------------------------------


def test_list_is_paginated_in_byte_order(admin: httpx.Client) -> None:
    for name in ["bob", "Zed", "alice", "0day", "carol"]:
        assert put(admin, name, password="pw-secret").status_code == 201
    everyone = ["0day", "Zed", ADMIN_USER, "alice", "bob", "carol"]
    assert sorted(everyone, key=lambda s: s.encode()) == everyone

    r = admin.get("/users")
    assert r.status_code == 200
    assert [u["username"] for u in r.json()["items"]] == everyone
    assert r.json()["next_after"] is None

    seen: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 4}
        if after is not None:
            params["after"] = after
        page = admin.get("/users", params=params).json()
        seen += [u["username"] for u in page["items"]]
        assert len(page["items"]) <= 4
        after = page["next_after"]
        if after is None:
            break
        assert after == page["items"][-1]["username"]
    assert seen == everyone

    page = admin.get("/users", params={"limit": 6}).json()
    assert page["next_after"] == "carol"  # a full page may point at an empty one
    assert admin.get("/users", params={"after": "carol"}).json() == {
        "items": [],
        "next_after": None,
    }
    for item in admin.get("/users").json()["items"]:
        assert set(item) == {"username", "role", "permissions"}


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"limit": "x"}])
def test_list_limit_out_of_range_is_422(admin: httpx.Client, params: dict[str, Any]) -> None:
    r = admin.get("/users", params=params)
    assert r.status_code == 422
    assert r.json()["code"] == "validation_error"


# --- authorization --------------------------------------------------------------------------


def test_user_management_is_admin_only(admin: httpx.Client, server: LiveServer) -> None:
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert put(admin, "mallory", password="m-pw-secret", permissions=everything).status_code == 201
    with client(server.base_url, auth=("mallory", "m-pw-secret")) as mallory:
        for method, path, body in [
            ("GET", "/users", None),
            ("GET", "/users/admin", None),
            ("GET", "/users/mallory", None),
            ("PUT", "/users/mallory", {"password": "m-pw-secret", "role": "admin"}),
            ("PUT", "/users/newbie", {"password": "pw-secret"}),
            ("DELETE", "/users/admin", None),
        ]:
            r = mallory.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["code"] == "forbidden"
        assert mallory.get("/auth/me").json()["role"] == "user"
    assert admin.get("/users/newbie").status_code == 404
    assert admin.get("/users/admin").status_code == 200


# --- revocation -----------------------------------------------------------------------------


def test_delete_stops_basic_at_once_and_revokes_sessions(
    admin: httpx.Client, server: LiveServer
) -> None:
    assert put(admin, "victor", password="v-pw-secret").status_code == 201
    assert me(server, auth=("victor", "v-pw-secret")).status_code == 200  # now cached
    token = login(server.base_url, "victor", "v-pw-secret")
    assert admin.delete("/users/victor").status_code == 204
    assert me(server, auth=("victor", "v-pw-secret")).status_code == 401
    assert me(server, headers={"Authorization": f"Bearer {token}"}).status_code == 401
    # Re-creating the name does not bring the old session back.
    assert put(admin, "victor", password="v-pw-secret").status_code == 201
    assert me(server, headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert me(server, auth=("victor", "v-pw-secret")).status_code == 200


def test_password_change_stops_the_old_password_at_once(
    admin: httpx.Client, server: LiveServer
) -> None:
    assert put(admin, "wendy", password="old-pw-secret").status_code == 201
    assert me(server, auth=("wendy", "old-pw-secret")).status_code == 200  # now cached
    token = login(server.base_url, "wendy", "old-pw-secret")
    assert put(admin, "wendy", password="new-pw-secret").status_code == 200
    assert me(server, auth=("wendy", "old-pw-secret")).status_code == 401
    assert me(server, auth=("wendy", "new-pw-secret")).status_code == 200
    # A new password also revokes the user's sessions.
    assert me(server, headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_an_identical_put_keeps_sessions(admin: httpx.Client, server: LiveServer) -> None:
    assert put(admin, "yan", password="y-pw-secret").status_code == 201
    token = login(server.base_url, "yan", "y-pw-secret")
    assert put(admin, "yan", password="y-pw-secret").status_code == 200
    assert me(server, headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_permission_changes_apply_at_once_to_cached_basic(
    admin: httpx.Client, server: LiveServer
) -> None:
    assert put(admin, "zoe", password="z-pw-secret", permissions={"read": "a"}).status_code == 201
    assert me(server, auth=("zoe", "z-pw-secret")).json()["permissions"]["read"] == "a"
    assert put(admin, "zoe", permissions={"read": "b"}).status_code == 200
    assert me(server, auth=("zoe", "z-pw-secret")).json()["permissions"]["read"] == "b"


def test_other_processes_drop_cached_basic_credentials_within_the_cache_window(
    database_url: str,
) -> None:
    with (
        running_server(settings_for(database_url)) as one,
        running_server(settings_for(database_url, auth_cache_seconds=0.5)) as two,
    ):
        with client(one.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as adm:
            assert put(adm, "olga", password="o-pw-secret").status_code == 201
            assert me(two, auth=("olga", "o-pw-secret")).status_code == 200  # cached on two
            assert adm.delete("/users/olga").status_code == 204
        assert me(one, auth=("olga", "o-pw-secret")).status_code == 401
        wait_for(
            lambda: me(two, auth=("olga", "o-pw-secret")).status_code == 401,
            timeout=3,
            interval=0.05,
            message="the other process to refuse the deleted user",
        )


# --- password policy and linear-time permissions (issue 18, contract §3) --------------------


def test_a_password_shorter_than_the_minimum_is_422(admin: httpx.Client) -> None:
    """Before: a 1-character password was accepted."""
    r = put(admin, "shorty", password="1234567")  # MESSAGEX_MIN_PASSWORD_LENGTH: 8
    assert_validation_error(r, "password")
    assert "at least 8" in r.json()["detail"]
    assert admin.get("/users/shorty").status_code == 404
    assert_validation_error(put(admin, "shorty", password="x" * 1025), "password")
    assert put(admin, "shorty", password="12345678").status_code == 201
    assert put(admin, "shorty", password="x" * 1024).status_code == 200
    assert_validation_error(put(admin, "shorty", password="x"), "password")
    assert put(admin, "shorty", role="admin").status_code == 200  # no password: kept


def test_the_minimum_password_length_is_a_setting(database_url: str) -> None:
    with (
        running_server(settings_for(database_url, min_password_length=12)) as live,
        client(live.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as adm,
    ):
        assert_validation_error(put(adm, "tall", password="x" * 11), "password")
        assert put(adm, "tall", password="x" * 12).status_code == 201


@pytest.mark.parametrize("pattern", ["(a)\\1", "(?=a)a", "(?<=a)b"])
def test_a_regex_without_a_linear_time_match_is_422(admin: httpx.Client, pattern: str) -> None:
    r = put(admin, "rex2", password="pw-secret", permissions={"read": pattern})
    assert_validation_error(r, "permissions", "read")
    assert "RE2" in r.json()["detail"]
    assert admin.get("/users/rex2").status_code == 404


def test_permission_regexes_match_in_linear_time(server: LiveServer, admin: httpx.Client) -> None:
    """Before: ``(a|aa)+`` ran on Python's backtracking engine, on the event loop: 47 ms for
    28 characters, doubling with each more one (a 36-character name: about 12 s)."""
    assert isinstance(_compiled("(a|aa)+"), re2._Regexp)  # RE2: an automaton, no backtracking
    evil = "(a|aa)+"
    assert put(admin, "redos", password="pw-secret", permissions={"read": evil}).status_code == 201
    name = "a" * 36 + "b"
    with client(server.base_url, auth=("redos", "pw-secret")) as redos:
        started = time.monotonic()
        assert redos.get(f"/queues/{name}").status_code == 403
        assert redos.get(f"/queues/{'a' * 40}").status_code == 404  # allowed; no such queue
        assert time.monotonic() - started < 2.0  # generous: RE2 takes microseconds
