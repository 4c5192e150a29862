"""AuthService and storage.accounts against a real PostgreSQL (no server in between)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pwdlib import PasswordHash
from pwdlib.hashers.argon2 import Argon2Hasher
from sqlalchemy import text

from app.auth import tokens
from app.auth.passwords import Passwords
from app.auth.service import (
    AuthEvent,
    AuthService,
    BasicCache,
    SessionRevoked,
    UserRevoked,
    address_key,
    user_key,
)
from app.auth.tokens import (
    BasicCredentials,
    BearerCredentials,
    MalformedCredentials,
    is_loopback,
    parse_authorization,
)
from app.domain.model import Permissions, Role, User
from app.errors import Forbidden, NotFound, RateLimited, Unauthorized, ValidationFailed
from app.metrics import Metrics
from app.storage import accounts
from app.storage.database import Database, create_engine
from tests.support import test_settings as settings_for
from tests.support import wait_for

#: Cheap Argon2 parameters: these tests are about the logic, not the cost.
FAST = Argon2Hasher(time_cost=1, memory_cost=1024, parallelism=1)
ROOT = User("root", Role.ADMIN, Permissions(".*", ".*", ".*"))
REMOTE = "10.1.2.3"  # only ever a string handed to the service: no traffic goes there


def service(db: Database, database_url: str, **overrides: Any) -> AuthService:
    svc = AuthService(db, settings_for(database_url, **overrides), Metrics())
    svc.passwords = Passwords(PasswordHash((FAST,)))
    return svc


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


async def scalar(db: Database, sql: str) -> Any:
    async with db.connect() as conn:
        return (await conn.execute(text(sql))).scalar()


async def failure_counts(db: Database) -> dict[str, int]:
    async with db.connect() as conn:
        rows = await conn.execute(text("SELECT key, failures FROM auth_failures"))
        return {row.key: row.failures for row in rows}


@pytest.fixture
async def other_db(database_url: str) -> AsyncIterator[Database]:
    """A second engine on the same database: what a second broker process would have."""
    database = Database(create_engine(database_url, pool_size=2, max_overflow=0))
    try:
        yield database
    finally:
        await database.dispose()


# --- rate limiting shared by processes ------------------------------------------------------


async def test_user_failures_add_up_across_two_services(
    db: Database, other_db: Database, database_url: str
) -> None:
    one, two = service(db, database_url), service(other_db, database_url)
    await one.put_user(ROOT, "bob", "bob-pw-password", Role.USER, Permissions())
    for i in range(9):
        with pytest.raises(Unauthorized):
            await (one if i % 2 else two).authenticate_password("bob", "wrong", "127.0.0.1")
    assert (
        await two.authenticate_password("bob", "bob-pw-password", "127.0.0.1")
    ).username == "bob"
    with pytest.raises(Unauthorized):
        await one.authenticate_password("bob", "wrong", "127.0.0.1")  # the 10th

    for svc in (one, two):
        with pytest.raises(RateLimited) as info:
            await svc.authenticate_password("bob", "bob-pw-password", "127.0.0.1")
        assert 1 <= info.value.retry_after <= 60
        with pytest.raises(RateLimited):
            await svc.login(
                "bob", "bob-pw-password", "192.0.2.7"
            )  # any address: the user is locked
        with pytest.raises(RateLimited):
            await svc.authenticate(basic("bob", "bob-pw-password"), "127.0.0.1")
    assert (await failure_counts(db))["user:bob"] == 10


async def test_address_failures_add_up_across_two_services(
    db: Database, other_db: Database, database_url: str
) -> None:
    one, two = service(db, database_url), service(other_db, database_url)
    await one.bootstrap()
    token, _ = await one.login("admin", "admin-secret-password", "127.0.0.1")
    for i in range(30):
        with pytest.raises(Unauthorized):
            await (one if i % 2 else two).authenticate_token(f"bogus-{i}", "198.51.100.9")
    assert await failure_counts(db) == {"addr:198.51.100.9": 30}
    for svc in (one, two):
        with pytest.raises(RateLimited):
            await svc.authenticate_token(token, "198.51.100.9")
        with pytest.raises(RateLimited):
            await svc.authenticate_token(token, "::ffff:198.51.100.9")  # the same address
        with pytest.raises(RateLimited):
            await svc.authenticate(basic("admin", "admin-secret-password"), "198.51.100.9")
        assert (await svc.authenticate_token(token, "127.0.0.1")).username == "admin"
    assert await failure_counts(db) == {"addr:198.51.100.9": 30}


async def test_the_window_is_fixed_and_restarts_after_it_ends(db: Database) -> None:
    async with db.connect() as conn:
        assert await accounts.record_failures(conn, ["user:k"], 60) == {"user:k": 1}
        assert await accounts.record_failures(conn, ["user:k", "addr:x"], 60) == {
            "user:k": 2,
            "addr:x": 1,
        }
        await conn.execute(
            text("UPDATE auth_failures SET window_start = now() - interval '61 seconds'")
        )
        assert await accounts.record_failures(conn, ["user:k"], 60) == {"user:k": 1}
        fresh = await conn.execute(
            text(
                "SELECT window_start > now() - interval '5 seconds' FROM auth_failures "
                "WHERE key = 'user:k'"
            )
        )
        assert fresh.scalar() is True


async def test_one_lookup_reports_the_lockout_and_the_user(db: Database) -> None:
    async with db.transaction() as conn:
        await accounts.insert_user(conn, "lou", "$argon2id$x", Role.USER, Permissions())
        await conn.execute(
            text(
                "INSERT INTO auth_failures (key, failures) VALUES "
                "('user:lou', 10), ('addr:192.0.2.1', 29), ('addr:192.0.2.2', 30)"
            )
        )
    limits = {"user:lou": 10, "addr:192.0.2.1": 30}
    async with db.connect() as conn:
        found = await accounts.lookup_password_user(db.hot, "lou", limits, 60)
        assert found.locked == ("user:lou",)
        assert found.retry_after is not None
        assert 58 <= found.retry_after <= 60
        assert found.account is not None
        assert found.account.user.username == "lou"

        found = await accounts.lookup_password_user(db.hot, "nobody", {"addr:192.0.2.2": 30}, 60)
        assert (found.locked, found.account) == (("addr:192.0.2.2",), None)

        found = await accounts.lookup_password_user(db.hot, None, {"addr:192.0.2.1": 30}, 60)
        assert (found.retry_after, found.locked, found.account) == (None, (), None)

        found, stored = await accounts.lookup_session(db.hot, b"x" * 32, {"addr:192.0.2.2": 30}, 60)
        assert (found.locked, found.account, stored) == (("addr:192.0.2.2",), None, None)


async def test_requests_without_credentials_are_not_counted(
    db: Database, database_url: str
) -> None:
    svc = service(db, database_url)
    for header in (None, "", "Digest x=y", "Basic !!!", "Bearer"):
        with pytest.raises(Unauthorized):
            await svc.authenticate(header, "127.0.0.1")
    assert await failure_counts(db) == {}


async def test_unknown_user_and_wrong_password_fail_alike(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    await svc.put_user(ROOT, "carol", "c-pw-password", Role.USER, Permissions())
    errors = []
    for name, password in (("carol", "nope"), ("nobody", "nope"), ("bad name!", "nope")):
        with pytest.raises(Unauthorized) as info:
            await svc.login(name, password, "127.0.0.1")
        errors.append((type(info.value), info.value.message, info.value.code))
    assert errors[0] == errors[1] == errors[2]


async def test_impossible_names_count_under_a_digest(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    for name in ("nul\x00byte", "x" * 10_000):
        with pytest.raises(Unauthorized):
            await svc.authenticate_password(name, "pw", "127.0.0.1")
    counts = await failure_counts(db)
    assert counts["addr:127.0.0.1"] == 2
    assert counts[user_key("x" * 10_000)] == 1
    assert all(len(key) < 100 and "\x00" not in key for key in counts)


# --- the loopback-only guest ----------------------------------------------------------------


async def test_guest_authenticates_only_from_loopback(db: Database, database_url: str) -> None:
    svc = service(db, database_url, admin_user=None, admin_password=None)
    await svc.bootstrap()
    for host in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        user = await svc.authenticate_password("guest", "guest", host)
        assert (user.username, user.role, user.loopback_only) == ("guest", Role.ADMIN, True)

    with pytest.raises(Unauthorized) as remote:
        await svc.authenticate_password("guest", "guest", REMOTE)
    with pytest.raises(Unauthorized) as wrong:
        await svc.authenticate_password("guest", "wrong", "127.0.0.1")
    assert remote.value.message == wrong.value.message  # the same 401 as a bad credential
    with pytest.raises(Unauthorized):
        await svc.authenticate_password("guest", "guest", None)
    with pytest.raises(Unauthorized):
        await svc.login("guest", "guest", REMOTE)

    # A Basic entry cached for a loopback caller does not let a remote one in.
    assert (await svc.authenticate(basic("guest", "guest"), "127.0.0.1")).username == "guest"
    with pytest.raises(Unauthorized):
        await svc.authenticate(basic("guest", "guest"), REMOTE)
    # Nor does a token obtained from loopback.
    token, _ = await svc.login("guest", "guest", "127.0.0.1")
    assert (await svc.authenticate_token(token, "::1")).username == "guest"
    with pytest.raises(Unauthorized):
        await svc.authenticate_token(token, REMOTE)


async def test_concurrent_bootstraps_create_exactly_one_user(
    db: Database, other_db: Database, database_url: str
) -> None:
    services = [
        service(db, database_url),
        service(other_db, database_url),
        service(db, database_url, admin_user="boss", admin_password="boss-pw"),
        service(other_db, database_url, admin_user=None, admin_password=None),
    ] * 2
    await asyncio.gather(*(svc.bootstrap() for svc in services))
    assert await scalar(db, "SELECT count(*) FROM broker_users") == 1


async def test_half_configured_admin_falls_back_to_the_loopback_guest(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    svc = service(db, database_url, admin_user="boss", admin_password=None)
    with caplog.at_level(logging.INFO, logger="messagex.auth"):
        await svc.bootstrap()
    assert await scalar(db, "SELECT username FROM broker_users WHERE loopback_only") == "guest"
    assert "guest" in caplog.text


async def test_bootstrap_logs_the_username_only(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    svc = service(db, database_url, admin_user="chief", admin_password="Chief-Secret-42")
    with caplog.at_level(logging.DEBUG):
        await svc.bootstrap()
        await svc.bootstrap()  # users exist: nothing more
    assert "chief" in caplog.text
    assert "Chief-Secret-42" not in caplog.text
    assert "$argon2" not in caplog.text
    assert caplog.text.count("bootstrap") == 1
    user = await svc.authenticate_password("chief", "Chief-Secret-42", REMOTE)
    assert (user.role, user.loopback_only) == (Role.ADMIN, False)


# --- passwords ------------------------------------------------------------------------------


async def test_outdated_hash_parameters_are_upgraded_on_login(
    db: Database, database_url: str
) -> None:
    old = PasswordHash((Argon2Hasher(time_cost=2, memory_cost=2048, parallelism=1),))
    async with db.transaction() as conn:
        await accounts.insert_user(conn, "olga", old.hash("o-pw"), Role.USER, Permissions())
    svc = service(db, database_url)
    await svc.login("olga", "o-pw", "127.0.0.1")
    stored = await scalar(db, "SELECT password_hash FROM broker_users WHERE username = 'olga'")
    assert stored.startswith("$argon2id$v=19$m=1024,t=1,p=1$")
    assert await svc.passwords.verify("o-pw", stored)


async def test_passwords_are_stored_as_argon2id_hashes(db: Database, database_url: str) -> None:
    svc = AuthService(db, settings_for(database_url), Metrics())  # the production parameters
    await svc.put_user(ROOT, "pat", "pat-pw-password", Role.USER, Permissions())
    stored = await scalar(db, "SELECT password_hash FROM broker_users WHERE username = 'pat'")
    assert stored.startswith("$argon2id$")
    assert "pat-pw-password" not in stored
    assert (
        await svc.authenticate_password("pat", "pat-pw-password", "127.0.0.1")
    ).username == "pat"


# --- sessions -------------------------------------------------------------------------------


async def test_tokens_are_stored_as_sha256_and_expire_by_the_database_clock(
    db: Database, database_url: str
) -> None:
    svc = service(db, database_url, session_ttl_seconds=3600)
    await svc.bootstrap()
    token, expires_at = await svc.login("admin", "admin-secret-password", "127.0.0.1")
    assert len(base64.urlsafe_b64decode(token + "=")) >= 32
    async with db.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT token_digest, expires_at, expires_at - now() AS ttl "
                    "FROM management_sessions"
                )
            )
        ).one()
    assert bytes(row.token_digest) == hashlib.sha256(token.encode()).digest()
    assert row.expires_at == expires_at
    assert 3590 < row.ttl.total_seconds() <= 3600

    await svc.authenticate_token(token, "127.0.0.1")
    async with db.connect() as conn:
        await conn.execute(
            text("UPDATE management_sessions SET expires_at = now() - interval '1 ms'")
        )
    with pytest.raises(Unauthorized):
        await svc.authenticate_token(token, "127.0.0.1")
    assert await failure_counts(db) == {"addr:127.0.0.1": 1}  # an expired token is a failure


async def test_sweep_deletes_expired_sessions_and_stale_counters(
    db: Database, database_url: str
) -> None:
    svc = service(db, database_url)
    events: list[AuthEvent] = []

    async def collect(event: AuthEvent) -> None:
        events.append(event)

    svc.add_listener(collect)
    await svc.bootstrap()
    old, _ = await svc.login("admin", "admin-secret-password", "127.0.0.1")
    live, _ = await svc.login("admin", "admin-secret-password", "127.0.0.1")
    async with db.connect() as conn:
        await conn.execute(
            text(
                "UPDATE management_sessions SET expires_at = now() - interval '1 s' "
                "WHERE token_digest = :d"
            ),
            {"d": tokens.digest(old)},
        )
        await accounts.record_failures(conn, ["user:fresh", "user:stale"], 60)
        await conn.execute(
            text(
                "UPDATE auth_failures SET window_start = now() - interval '2 minutes' "
                "WHERE key = 'user:stale'"
            )
        )
    assert await svc.sweep_expired_sessions() == 1
    assert events == [SessionRevoked(tokens.digest(old))]
    assert await scalar(db, "SELECT count(*) FROM management_sessions") == 1
    assert await failure_counts(db) == {"user:fresh": 1}
    await svc.authenticate_token(live, "127.0.0.1")
    assert await svc.sweep_expired_sessions() == 0


async def test_a_session_for_a_deleted_user_is_not_created(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    await svc.put_user(ROOT, "gone", "gone-password", Role.USER, Permissions())
    async with db.transaction() as conn:
        account = await accounts.get_account(conn, "gone")
        assert account is not None
        await accounts.delete_user(conn, "gone")
        assert await accounts.create_session(conn, b"d" * 32, account.id, 60) is None


# --- user management and events -------------------------------------------------------------


async def test_events_for_the_websocket_layer(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    events: list[AuthEvent] = []

    async def broken(event: AuthEvent) -> None:
        raise RuntimeError("a broken listener must not stop the others")

    async def collect(event: AuthEvent) -> None:
        events.append(event)

    svc.add_listener(broken)
    svc.add_listener(collect)
    perms = Permissions(read="a")
    await svc.put_user(ROOT, "eve", "e-pw-password", Role.USER, perms)
    await svc.put_user(ROOT, "eve", "e-pw-password", Role.USER, perms)  # identical: no event
    await svc.put_user(ROOT, "eve", None, Role.USER, perms)  # identical: no event
    assert events == []
    await svc.put_user(ROOT, "eve", None, Role.USER, Permissions(read="b"))
    await svc.put_user(ROOT, "eve", None, Role.ADMIN, Permissions(read="b"))
    await svc.put_user(ROOT, "eve", "new-pw-password", Role.ADMIN, Permissions(read="b"))
    token, _ = await svc.login("eve", "new-pw-password", "127.0.0.1")
    await svc.logout(f"Bearer {token}")
    await svc.logout(basic("eve", "new-pw-password"))  # nothing to revoke
    await svc.delete_user(ROOT, "eve")
    assert events == [
        UserRevoked("eve", "permissions_changed"),
        UserRevoked("eve", "permissions_changed"),
        UserRevoked("eve", "password_changed"),
        SessionRevoked(hashlib.sha256(token.encode()).digest()),
        UserRevoked("eve", "deleted"),
    ]


async def test_user_management_validates_and_authorizes(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    peon = User("peon", Role.USER, Permissions(".*", ".*", ".*"))
    for call in (
        svc.list_users(peon, 10, None),
        svc.get_user(peon, "x"),
        svc.put_user(peon, "x", "pw", Role.USER, Permissions()),
        svc.delete_user(peon, "x"),
    ):
        with pytest.raises(Forbidden):
            await call
    with pytest.raises(ValidationFailed) as info:
        await svc.put_user(ROOT, "x", None, Role.USER, Permissions())
    assert info.value.errors[0]["loc"] == ["body", "password"]
    with pytest.raises(ValidationFailed) as info:
        await svc.put_user(ROOT, "x", "x-password", Role.USER, Permissions(write="[", read="("))
    assert [e["loc"] for e in info.value.errors] == [
        ["body", "permissions", "write"],
        ["body", "permissions", "read"],
    ]
    with pytest.raises(ValidationFailed):
        await svc.put_user(ROOT, "bad name", "pw", Role.USER, Permissions())
    with pytest.raises(NotFound):
        await svc.get_user(ROOT, "x")
    with pytest.raises(NotFound):
        await svc.delete_user(ROOT, "x")
    with pytest.raises(NotFound):
        await svc.get_user(ROOT, "nul\x00")
    assert await svc.list_users(ROOT, 10, None) == ([], None)


async def test_concurrent_creates_of_one_user(db: Database, database_url: str) -> None:
    svc = service(db, database_url)
    results = await asyncio.gather(
        *(svc.put_user(ROOT, "twin", f"password-{i}", Role.USER, Permissions()) for i in range(4))
    )
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert await scalar(db, "SELECT count(*) FROM broker_users") == 1


# --- pure helpers ---------------------------------------------------------------------------


def test_parse_authorization() -> None:
    assert parse_authorization(None) is None
    assert parse_authorization("") is None
    assert parse_authorization("Digest abc") is None
    assert parse_authorization("Bearer abc") == BearerCredentials("abc")
    assert parse_authorization("bearer  abc ") == BearerCredentials("abc")
    assert parse_authorization(basic("u", "p:with:colons")) == BasicCredentials(
        "u", "p:with:colons"
    )
    assert parse_authorization(basic("u", "")) == BasicCredentials("u", "")
    assert parse_authorization("BASIC " + base64.b64encode("ü:ß".encode()).decode()) == (
        BasicCredentials("ü", "ß")
    )
    for bad in (
        "Bearer",
        "Basic",
        "Basic ***",
        "Basic " + base64.b64encode(b"nocolon").decode(),
        "Basic " + base64.b64encode(b"\xff:\xfe").decode(),
    ):
        with pytest.raises(MalformedCredentials):
            parse_authorization(bad)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.1.2.3", False),
        ("128.0.0.1", False),
        ("::2", False),
        ("localhost", False),  # a name, not an address: not trusted
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(host: str | None, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_rate_limit_keys() -> None:
    assert user_key("bob") == "user:bob"
    assert user_key("bad name").startswith("user:#")
    assert user_key("bad name") != user_key("bad name2")
    assert address_key("10.0.0.1") == "addr:10.0.0.1"
    assert address_key("::ffff:10.0.0.1") == "addr:10.0.0.1"
    assert address_key("2001:DB8::1") == "addr:2001:db8::1"
    assert address_key(None) is None


def test_basic_cache() -> None:
    cache = BasicCache(ttl=0.05)
    user = User("u", Role.USER, Permissions())
    key = cache.key("u", "secret-password")
    assert key[0] == "u"
    assert b"secret-password" not in key[1]
    assert key[1] != hashlib.sha256(b"secret-password").digest()  # keyed per process
    assert key == cache.key("u", "secret-password")

    cache.put(key, user, cache.generation)
    assert cache.get(key) == user
    wait_for(lambda: cache.get(key) is None, timeout=2, message="the entry to expire")

    stale = cache.generation
    cache.drop_user("someone")  # a PUT/DELETE raced with a verification...
    cache.put(key, user, stale)  # ...whose result must not be cached
    assert cache.get(key) is None

    cache.put(key, user, cache.generation)
    cache.drop_user("u")
    assert cache.get(key) is None

    disabled = BasicCache(ttl=0)
    disabled.put(key, user, disabled.generation)
    assert disabled.get(key) is None

    small = BasicCache(ttl=5, max_entries=3)
    for i in range(10):
        small.put(small.key(f"u{i}", "p"), user, small.generation)
        assert len(small) <= 3


class _CountingPasswords(Passwords):
    def __init__(self) -> None:
        super().__init__(PasswordHash((FAST,)))
        self.verifications = 0

    async def verify_and_update(self, password: str, password_hash: str) -> tuple[bool, str | None]:
        self.verifications += 1
        return await super().verify_and_update(password, password_hash)


async def test_basic_cache_renews_without_argon2_until_the_hash_changes(
    db: Database, database_url: str
) -> None:
    svc = service(db, database_url, auth_cache_seconds=0.05)
    counting = svc.passwords = _CountingPasswords()
    await svc.put_user(ROOT, "renew", "password-1", Role.USER, Permissions())
    header = basic("renew", "password-1")
    assert (await svc.authenticate(header, "127.0.0.1")).username == "renew"
    assert counting.verifications == 1
    for _ in range(3):  # expired entries, same stored hash: renewed from the database row
        wait_for(lambda: svc.cache.get(svc.cache.key("renew", "password-1")) is None, timeout=2)
        assert (await svc.authenticate(header, "127.0.0.1")).username == "renew"
    assert counting.verifications == 1
    # another process changes the password: the hash in the database is no longer the one
    # that was verified, so the next expiry verifies again, and the old password fails
    other = service(db, database_url)
    await other.put_user(ROOT, "renew", "password-2", Role.USER, Permissions())
    wait_for(lambda: svc.cache.get(svc.cache.key("renew", "password-1")) is None, timeout=2)
    with pytest.raises(Unauthorized):
        await svc.authenticate(header, "127.0.0.1")
    assert counting.verifications == 2


async def test_concurrent_cache_misses_share_one_verification(
    db: Database, database_url: str
) -> None:
    svc = service(db, database_url)
    counting = svc.passwords = _CountingPasswords()
    await svc.put_user(ROOT, "flock", "flock-password", Role.USER, Permissions())
    users = await asyncio.gather(
        *[svc.authenticate(basic("flock", "flock-password"), "127.0.0.1") for _ in range(20)]
    )
    assert {u.username for u in users} == {"flock"}
    assert counting.verifications == 1
