"""Authentication, sessions and user management (contract §3 and §12).

Hot path, per authenticated request:

- Bearer: one statement loads the session's user and the caller's address lockout state.
- Basic: a verified (username, password) pair is cached in this process for at most
  ``settings.auth_cache_seconds`` (≤ 5 s), keyed by the username and a keyed SHA-256 of the
  password (never the password itself). A cache hit touches no database, so a lockout made by
  another process applies here within that window; on this process, reaching the limit drops
  the user's cached entries at once, and a user PUT/DELETE here drops them at once too.
  A miss costs one statement (lockout state + user row) and one Argon2id verification in a
  worker thread.

Failed authentications are counted in ``auth_failures`` (shared by every broker process) per
``user:<name>`` and per ``addr:<ip>`` in a fixed 60 s window that starts at the first counted
failure. A key that reached its limit (10 per user, 30 per address) gets ``RateLimited`` —
even with the right password — until its window ends; those answers are not counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NoReturn

from app.auth import permissions as authz
from app.auth import tokens
from app.auth.passwords import Passwords
from app.auth.tokens import BearerCredentials, MalformedCredentials, parse_authorization
from app.config import Settings
from app.domain.model import Permissions, Role, User, is_valid_name
from app.errors import NotFound, RateLimited, Unauthorized, ValidationFailed
from app.metrics import Metrics
from app.storage import accounts
from app.storage.accounts import Account
from app.storage.database import Database

log = logging.getLogger("messagex.auth")

WINDOW_SECONDS = 60
USER_FAILURE_LIMIT = 10
ADDRESS_FAILURE_LIMIT = 30
CACHE_MAX_ENTRIES = 10_000
GUEST = "guest"

BAD_PASSWORD = "invalid username or password"  # noqa: S105 (a message)
BAD_TOKEN = "the token is invalid, expired or revoked"  # noqa: S105
NO_CREDENTIALS = "authentication required: send a bearer token or basic credentials"


# --- events for the WebSocket layer ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserRevoked:
    """A user was deleted, or its password or permissions changed: re-check its connections."""

    username: str
    reason: Literal["deleted", "password_changed", "permissions_changed"] = "deleted"


@dataclass(frozen=True, slots=True)
class SessionRevoked:
    """A session token stopped working (logout, or swept after expiry)."""

    token_digest: bytes


AuthEvent = UserRevoked | SessionRevoked
Listener = Callable[[AuthEvent], Awaitable[None]]


# --- rate-limit keys ------------------------------------------------------------------------


def user_key(username: str) -> str:
    """``user:<name>``; a name no user can have (too long, bad characters, NUL) is hashed so
    that it still counts but never bloats the table or reaches PostgreSQL as raw text."""
    if is_valid_name(username):
        return f"user:{username}"
    digest = hashlib.sha256(username.encode("utf-8", "surrogatepass")).hexdigest()
    return f"user:#{digest}"


def address_key(client_host: str | None) -> str | None:
    if not client_host:
        return None
    try:
        address = ipaddress.ip_address(client_host.split("%", 1)[0])
    except ValueError:
        return f"addr:{client_host[:100]}"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return f"addr:{address.compressed}"


def _limits(username: str | None, client_host: str | None) -> dict[str, int]:
    limits: dict[str, int] = {}
    if username is not None:
        limits[user_key(username)] = USER_FAILURE_LIMIT
    addr = address_key(client_host)
    if addr is not None:
        limits[addr] = ADDRESS_FAILURE_LIMIT
    return limits


# --- the Basic cache ------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    user: User
    expires: float
    #: the stored hash the password was verified against: while it is unchanged in the
    #: database, an expired entry is renewed without another Argon2 verification
    password_hash: str = ""


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a shared verification's outcome as seen, even when no one else waited for it."""
    if not future.cancelled():
        future.exception()


#: how long after expiry a cache entry may still be renewed without Argon2
RENEW_WINDOW_SECONDS = 600.0


class BasicCache:
    """Verified Basic credentials, for at most ``ttl`` seconds (monotonic clock, this process).

    Keys are (username, HMAC-SHA256(process secret, password)): the password is never kept,
    and its digest is useless outside this process. ``generation`` moves on every
    invalidation, so a verification that raced with a PUT/DELETE does not re-insert a stale
    entry.
    """

    def __init__(self, ttl: float, max_entries: int = CACHE_MAX_ENTRIES) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self.generation = 0
        self._secret = secrets.token_bytes(32)
        self._entries: dict[tuple[str, bytes], _Entry] = {}

    def key(self, username: str, password: str) -> tuple[str, bytes]:
        mac = hmac.new(self._secret, password.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return username, mac.digest()

    def get(self, key: tuple[str, bytes]) -> User | None:
        entry = self.entry(key)
        return None if entry is None else entry.user

    def entry(self, key: tuple[str, bytes]) -> _Entry | None:
        """The live entry of ``key``: its user and the hash the password was verified with."""
        entry = self._entries.get(key)
        if entry is None or entry.expires <= time.monotonic():
            return None
        return entry

    def renewable(self, key: tuple[str, bytes]) -> str | None:
        """The verified hash of an expired entry (kept at most RENEW_WINDOW_SECONDS)."""
        entry = self._entries.get(key)
        if entry is None or entry.expires + RENEW_WINDOW_SECONDS <= time.monotonic():
            return None
        return entry.password_hash or None

    def put(
        self, key: tuple[str, bytes], user: User, generation: int, password_hash: str = ""
    ) -> None:
        if self.ttl <= 0 or generation != self.generation:
            return
        now = time.monotonic()
        if len(self._entries) >= self.max_entries:
            self._entries = {k: e for k, e in self._entries.items() if e.expires > now}
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
        self._entries[key] = _Entry(user, now + self.ttl, password_hash)

    def drop_user(self, username: str) -> None:
        self.generation += 1
        for key in [k for k in self._entries if k[0] == username]:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)


# --- the service ----------------------------------------------------------------------------


class AuthService:
    def __init__(self, db: Database, settings: Settings, metrics: Metrics) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.passwords = Passwords.argon2(
            time_cost=settings.argon2_time_cost,
            memory_kib=settings.argon2_memory_kib,
            parallelism=settings.argon2_parallelism,
        )
        self.cache = BasicCache(settings.auth_cache_seconds)
        self._in_flight: dict[
            tuple[tuple[str, bytes], str | None], asyncio.Future[tuple[User, str]]
        ] = {}
        self._listeners: list[Listener] = []
        #: keys this process saw reach their limit → monotonic time after which the window
        #: has surely ended. Only used to bypass the Basic cache; the database decides 429s.
        self._locked: dict[str, float] = {}

    # --- listeners ------------------------------------------------------------------------

    def add_listener(self, callback: Listener) -> None:
        self._listeners.append(callback)

    async def _emit(self, event: AuthEvent) -> None:
        for listener in list(self._listeners):
            try:
                await listener(event)
            except Exception:
                log.exception("an auth event listener failed on %s", type(event).__name__)

    # --- bootstrap ------------------------------------------------------------------------

    def _bootstrap_identity(self) -> tuple[str, str, bool]:
        user, password = self.settings.admin_user, self.settings.admin_password
        if user and password and is_valid_name(user):
            return user, password, False
        if user or password:
            log.warning(
                "MESSAGEX_ADMIN_USER and MESSAGEX_ADMIN_PASSWORD must both be set (and the user "
                "name valid); creating the loopback-only guest instead"
            )
        return GUEST, GUEST, True

    async def bootstrap(self) -> None:
        """Create the first admin when ``broker_users`` is empty (safe across processes)."""
        async with self.db.connect() as conn:
            if await accounts.has_users(conn):
                return
        username, password, loopback_only = self._bootstrap_identity()
        password_hash = await self.passwords.hash(password)
        async with self.db.transaction() as conn:
            created = await accounts.insert_first_user(
                conn, username, password_hash, Role.ADMIN, loopback_only
            )
        if created:
            log.info(
                "bootstrap: created admin user %s%s",
                username,
                " (may authenticate from loopback addresses only)" if loopback_only else "",
            )

    # --- authentication -------------------------------------------------------------------

    async def authenticate(self, authorization: str | None, client_host: str | None) -> User:
        """The caller named by an ``Authorization`` header (Bearer token or Basic)."""
        return (await self.authenticate_with_hash(authorization, client_host))[0]

    async def authenticate_with_hash(
        self, authorization: str | None, client_host: str | None
    ) -> tuple[User, str | None]:
        """``authenticate``, and the stored password hash a Basic password was verified
        against (None for a token): a WebSocket keeps it, and closes when it changes."""
        credentials = parse_authorization(authorization)  # malformed: Unauthorized, uncounted
        if credentials is None:
            raise Unauthorized(NO_CREDENTIALS)
        if isinstance(credentials, BearerCredentials):
            return await self.authenticate_token(credentials.token, client_host), None
        return await self._authenticate_basic(
            credentials.username, credentials.password, client_host
        )

    async def _authenticate_basic(
        self, username: str, password: str, client_host: str | None
    ) -> tuple[User, str]:
        key = self.cache.key(username, password)
        cached = self.cache.entry(key)
        if (
            cached is not None
            and not self._locally_locked(username, client_host)
            and self._from_allowed_host(cached.user, client_host)
        ):
            return cached.user, cached.password_hash
        # Single flight: requests that miss the cache together (at start-up, or when an entry
        # expires under load) share one Argon2 verification instead of one each.
        flight = (key, client_host)
        pending = self._in_flight.get(flight)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[tuple[User, str]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._in_flight[flight] = future
        try:
            generation = self.cache.generation
            account = await self._verify_password(
                username, password, client_host, verified_hash=self.cache.renewable(key)
            )
            verified = account.user, account.password_hash
            self.cache.put(key, account.user, generation, account.password_hash)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
            raise
        finally:
            del self._in_flight[flight]
        future.set_result(verified)
        return verified

    async def authenticate_password(
        self, username: str, password: str, client_host: str | None
    ) -> User:
        return (await self.authenticate_password_with_hash(username, password, client_host))[0]

    async def authenticate_password_with_hash(
        self, username: str, password: str, client_host: str | None
    ) -> tuple[User, str]:
        """``authenticate_password``, and the stored hash the password was verified against."""
        account = await self._verify_password(username, password, client_host)
        return account.user, account.password_hash

    async def _verify_password(
        self,
        username: str,
        password: str,
        client_host: str | None,
        verified_hash: str | None = None,
    ) -> Account:
        """Check the password (and the rate limits) against the database.

        ``verified_hash``: the stored hash this same password was verified against a moment
        ago (an expired Basic cache entry). When the database still holds exactly that hash,
        the password cannot have changed, so the Argon2 verification is skipped: the cache
        still re-reads the user (deleted, changed, locked out) every few seconds, without the
        CPU cost.
        """
        limits = _limits(username, client_host)
        lookup_name = username if is_valid_name(username) else None
        found = await accounts.lookup_password_user(
            self.db.hot, lookup_name, limits, WINDOW_SECONDS
        )
        self._raise_if_limited(found)
        account = found.account
        if account is None and lookup_name is None:
            # A name no user can have reveals nothing and is refused without Argon2.
            await self._fail(limits, BAD_PASSWORD)
        if (
            account is not None
            and verified_hash is not None
            and hmac.compare_digest(verified_hash.encode(), account.password_hash.encode())
        ):
            ok, new_hash = True, None
        else:
            # Argon2 runs only for an attempt already counted as a failure: concurrent wrong
            # passwords cannot all pass the limit check while the first ones are hashed.
            counts = await self._reserve(limits)
            if account is None:
                # Same work as a wrong password, so timing does not reveal who exists.
                await self.passwords.verify_dummy(password)
                self._refuse(limits, counts, BAD_PASSWORD)
            ok, new_hash = await self.passwords.verify_and_update(password, account.password_hash)
            if not ok or not self._from_allowed_host(account.user, client_host):
                self._refuse(limits, counts, BAD_PASSWORD)
            async with self.db.transaction() as conn:
                await accounts.release_failures(conn, list(limits), WINDOW_SECONDS)
        if not self._from_allowed_host(account.user, client_host):
            await self._fail(limits, BAD_PASSWORD)
        if new_hash is not None:
            async with self.db.transaction() as conn:
                await accounts.replace_password_hash(
                    conn, account.id, account.password_hash, new_hash
                )
            # what the database now holds (unless the password changed meanwhile)
            account = Account(account.id, account.user, new_hash)
        return account

    async def authenticate_token(self, token: str, client_host: str | None) -> User:
        wanted = tokens.digest(token)
        limits = _limits(None, client_host)
        found, stored = await accounts.lookup_session(self.db.hot, wanted, limits, WINDOW_SECONDS)
        self._raise_if_limited(found)
        account = found.account
        if (
            account is None
            or stored is None
            or not tokens.same_digest(stored, wanted)
            or not self._from_allowed_host(account.user, client_host)
        ):
            await self._fail(limits, BAD_TOKEN)
        return account.user

    @staticmethod
    def _from_allowed_host(user: User, client_host: str | None) -> bool:
        return not user.loopback_only or tokens.is_loopback(client_host)

    def _raise_if_limited(self, found: accounts.AuthLookup) -> None:
        retry_after = found.retry_after
        if retry_after is None:
            return
        # Remember the lockout so that the Basic cache is bypassed for these keys.
        self._lock_locally(found.locked, retry_after)
        raise RateLimited(retry_after, _too_many(retry_after))

    async def _fail(self, limits: Mapping[str, int], message: str) -> NoReturn:
        """Count a failed authentication against ``limits``' keys, then refuse it."""
        counts: dict[str, int] = {}
        if limits:
            async with self.db.connect() as conn:
                counts = await accounts.record_failures(conn, list(limits), WINDOW_SECONDS)
        self._refuse(limits, counts, message)

    async def _reserve(self, limits: Mapping[str, int]) -> dict[str, int]:
        """Count this attempt as a failure before its password is checked; 429 (and nothing
        counted) when that takes a key past its limit. Returns the keys' counts with it."""
        if not limits:
            return {}
        try:
            async with self.db.transaction() as conn:
                retry_after, counts = await accounts.reserve_failures(conn, limits, WINDOW_SECONDS)
                if retry_after is not None:
                    raise RateLimited(retry_after)  # rolls the reservation back
        except RateLimited as exc:
            over = [key for key, n in counts.items() if n > limits[key]]
            self._lock_locally(over, exc.retry_after)
            raise RateLimited(exc.retry_after, _too_many(exc.retry_after)) from None
        return counts

    def _refuse(
        self, limits: Mapping[str, int], counts: Mapping[str, int], message: str
    ) -> NoReturn:
        """Refuse a failed authentication already counted (``counts``: key → its count)."""
        self.metrics.auth_failures.inc()
        reached = {key: limits[key] for key, n in counts.items() if n >= limits[key]}
        if reached:
            self._lock_locally(reached, WINDOW_SECONDS)
        raise Unauthorized(message)

    def _lock_locally(self, keys: Iterable[str], seconds: int) -> None:
        until = time.monotonic() + max(1, seconds)
        for key in keys:
            self._locked[key] = max(until, self._locked.get(key, 0.0))
            if key.startswith("user:"):
                self.cache.drop_user(key.removeprefix("user:"))

    def _locally_locked(self, username: str, client_host: str | None) -> bool:
        """Whether a lockout remembered here covers this user or address. The keys are only
        worked out while something is locked: not on every cached request."""
        if not self._locked:
            return False
        now = time.monotonic()
        for key in [k for k, until in self._locked.items() if until <= now]:
            del self._locked[key]
        return any(key in self._locked for key in _limits(username, client_host))

    # --- sessions -------------------------------------------------------------------------

    async def login(
        self, username: str, password: str, client_host: str | None
    ) -> tuple[str, datetime]:
        """A new session token for valid credentials, and when it expires."""
        account = await self._verify_password(username, password, client_host)
        token = tokens.new_token()
        async with self.db.transaction() as conn:
            expires_at = await accounts.create_session(
                conn, tokens.digest(token), account.id, self.settings.session_ttl_seconds
            )
        if expires_at is None:  # the user was deleted in the meantime
            raise Unauthorized(BAD_PASSWORD)
        return token, expires_at

    async def logout(self, authorization: str | None) -> None:
        """Revoke the bearer token of ``authorization`` at once (Basic: nothing to revoke)."""
        try:
            credentials = parse_authorization(authorization)
        except MalformedCredentials:
            return
        if not isinstance(credentials, BearerCredentials):
            return
        digest = tokens.digest(credentials.token)
        async with self.db.transaction() as conn:
            deleted = await accounts.delete_session(conn, digest)
        if deleted:
            await self._emit(SessionRevoked(digest))

    async def sweep_expired_sessions(self) -> int:
        """Delete expired sessions (and rate-limit counters whose window ended); returns the
        number of sessions deleted. Emits ``SessionRevoked`` for each."""
        async with self.db.transaction() as conn:
            digests = await accounts.delete_expired_sessions(conn)
            await accounts.delete_stale_failures(conn, WINDOW_SECONDS)
        for digest in digests:
            await self._emit(SessionRevoked(digest))
        return len(digests)

    # --- user management (admin only) -----------------------------------------------------

    async def list_users(
        self, actor: User, limit: int = 100, after: str | None = None, contains: str | None = None
    ) -> tuple[list[User], str | None]:
        """A page of users by name (byte order) and the cursor of the next page; only those
        whose name contains ``contains``, when given."""
        authz.require_admin(actor)
        async with self.db.connect() as conn:
            users = await accounts.list_users(conn, limit, after, contains)
        next_after = users[-1].username if len(users) == limit and users else None
        return users, next_after

    async def get_user(self, actor: User, name: str) -> User:
        authz.require_admin(actor)
        async with self.db.connect() as conn:
            account = await accounts.get_account(conn, name) if is_valid_name(name) else None
        if account is None:
            raise NotFound(f"user '{name}' not found")
        return account.user

    async def put_user(
        self,
        actor: User,
        name: str,
        password: str | None,
        role: Role = Role.USER,
        permissions: Permissions | None = None,
    ) -> tuple[User, bool]:
        """Create (password required) or replace a user; returns it and whether it was created.

        A password equal to the current one is no change (an idempotent PUT keeps the user's
        sessions); a new password revokes every session of the user.
        """
        authz.require_admin(actor)
        perms = permissions or Permissions()
        _validate_user(name, password, perms, self.settings.min_password_length)
        password_hash = await self._hash_for(name, password)
        async with self.db.transaction() as conn:
            current = await accounts.get_account(conn, name, for_update=True)
            if current is None:
                if password_hash is None:
                    raise _password_required()
                created = await accounts.insert_user(conn, name, password_hash, role, perms)
                if created is not None:
                    return created.user, True
                # Created concurrently: wait for that row and update it.
                current = await accounts.get_account(conn, name, for_update=True)
                assert current is not None
            new_hash = password_hash if password_hash != current.password_hash else None
            updated = await accounts.update_user(conn, current.id, new_hash, role, perms)
            if new_hash is not None:
                await accounts.delete_user_sessions(conn, current.id)
        await self._after_update(current.user, updated.user, password_changed=new_hash is not None)
        return updated.user, False

    async def _hash_for(self, name: str, password: str | None) -> str | None:
        """A hash of ``password``: the user's current one when it already matches, else a new
        one. Argon2 runs here, before the transaction, never while it holds row locks."""
        if password is None:
            return None
        async with self.db.connect() as conn:
            existing = await accounts.get_account(conn, name)
        if existing is not None and await self.passwords.verify(password, existing.password_hash):
            return existing.password_hash
        return await self.passwords.hash(password)

    async def _after_update(self, before: User, after: User, password_changed: bool) -> None:
        self.cache.drop_user(after.username)
        if password_changed:
            await self._emit(UserRevoked(after.username, "password_changed"))
        elif (before.role, before.permissions) != (after.role, after.permissions):
            await self._emit(UserRevoked(after.username, "permissions_changed"))

    async def delete_user(self, actor: User, name: str) -> None:
        """Delete a user; its sessions go with it and its cached Basic credentials at once."""
        authz.require_admin(actor)
        deleted = False
        if is_valid_name(name):
            async with self.db.transaction() as conn:
                deleted = await accounts.delete_user(conn, name)
        if not deleted:
            raise NotFound(f"user '{name}' not found")
        self.cache.drop_user(name)
        await self._emit(UserRevoked(name, "deleted"))


def _too_many(retry_after: int) -> str:
    return f"too many failed authentication attempts; retry in {max(1, retry_after)} s"


def _password_required() -> ValidationFailed:
    return ValidationFailed(
        "password: a password is required to create a user",
        errors=[
            {"loc": ["body", "password"], "msg": "required to create a user", "type": "missing"}
        ],
    )


def _validate_user(
    name: str, password: str | None, perms: Permissions, min_password_length: int
) -> None:
    errors: list[dict[str, Any]] = []
    if not is_valid_name(name):
        errors.append(
            {
                "loc": ["path", "name"],
                "msg": "1-255 characters from A-Z a-z 0-9 _ . : -, first alphanumeric",
                "type": "string_pattern_mismatch",
            }
        )
    if password is not None and len(password) < min_password_length:
        errors.append(
            {
                "loc": ["body", "password"],
                "msg": f"must have at least {min_password_length} characters",
                "type": "string_too_short",
            }
        )
    for field in ("configure", "write", "read"):
        problem = authz.check_pattern(getattr(perms, field))
        if problem is not None:
            errors.append(
                {"loc": ["body", "permissions", field], "msg": problem, "type": "value_error"}
            )
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValidationFailed(f"{where}: {first['msg']}", errors=errors)
