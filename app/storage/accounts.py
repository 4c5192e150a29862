"""Users, session-token digests and the shared failed-authentication counters.

Every function takes a connection and never commits: the auth service owns transactions.
The two lookups that run on every authenticated request (``lookup_password_user`` and
``lookup_session``) answer the rate-limit question and load the caller in ONE statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Integer,
    Interval,
    LargeBinary,
    case,
    cast,
    delete,
    extract,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.domain.model import Permissions, Role, User
from app.storage import queries
from app.storage.fastpath import HotPath
from app.storage.listing import name_contains
from app.storage.tables import auth_failures, broker_users, management_sessions

#: pg_advisory_xact_lock key serializing the bootstrap of the first user ("mxboot").
BOOTSTRAP_LOCK_KEY = 0x6D78626F6F74


@dataclass(frozen=True, slots=True)
class Account:
    """A user as storage knows it: the domain user plus its id and password hash."""

    id: int
    user: User
    password_hash: str


@dataclass(frozen=True, slots=True)
class AuthLookup:
    """The answer of one authentication round trip.

    ``retry_after``: seconds until the window of a locked-out key ends (None: not limited).
    ``locked``: the keys that reached their limit.
    ``account``: the user the credentials name (None: no such user or session).
    """

    retry_after: int | None
    locked: tuple[str, ...]
    account: Account | None


def _account(row: Any) -> Account:
    return Account(
        id=row.id,
        user=User(
            username=row.username,
            role=Role(row.role),
            permissions=Permissions(row.perm_configure, row.perm_write, row.perm_read),
            loopback_only=row.loopback_only,
        ),
        password_hash=row.password_hash,
    )


def _window(seconds: int) -> ColumnElement[timedelta]:
    return literal(timedelta(seconds=seconds), Interval)


_USER_COLUMNS = (
    broker_users.c.id,
    broker_users.c.username,
    broker_users.c.password_hash,
    broker_users.c.role,
    broker_users.c.perm_configure,
    broker_users.c.perm_write,
    broker_users.c.perm_read,
    broker_users.c.loopback_only,
)


def _limit_params(limits: Mapping[str, int], window_seconds: int) -> dict[str, Any]:
    return {"keys": list(limits), "limits": list(limits.values()), "window": window_seconds}


def _hot_account(row: Any, offset: int) -> Account | None:
    values = row[offset:]
    if values[0] is None:
        return None
    id_, username, password_hash, role, configure, write, read, loopback_only = values
    return Account(
        id=id_,
        user=User(username, Role(role), Permissions(configure, write, read), loopback_only),
        password_hash=password_hash,
    )


async def lookup_password_user(
    hot: HotPath, username: str | None, limits: Mapping[str, int], window_seconds: int
) -> AuthLookup:
    """Rate-limit state of ``limits``' keys and the user named ``username``, in one statement.
    ``username`` None skips the user (a name no user can have)."""
    params = _limit_params(limits, window_seconds)
    params["username"] = username
    (row,) = await hot.fetch(queries.LOOKUP_PASSWORD_USER, params)
    return AuthLookup(row[0], tuple(row[1] or ()), _hot_account(row, 2))


async def lookup_session(
    hot: HotPath, token_digest: bytes, limits: Mapping[str, int], window_seconds: int
) -> tuple[AuthLookup, bytes | None]:
    """Rate-limit state and the live (unexpired, by the database clock) session's user, in one
    statement. Also returns the stored digest, for a constant-time comparison by the caller."""
    params = _limit_params(limits, window_seconds)
    params["digest"] = token_digest
    (row,) = await hot.fetch(queries.LOOKUP_SESSION, params)
    found = AuthLookup(row[0], tuple(row[1] or ()), _hot_account(row, 3))
    return found, (bytes(row[2]) if row[2] is not None else None)


async def record_failures(
    conn: AsyncConnection, keys: Sequence[str], window_seconds: int
) -> dict[str, int]:
    """Count one failure against each key; returns each key's count in its current window.

    A fixed window: it starts at the first counted failure; a failure after the window ended
    starts a new one at 1. Keys are upserted in sorted order so that concurrent callers lock
    rows in the same order (no deadlock).
    """
    counted = await _count_failures(conn, keys, window_seconds)
    return {key: failures for key, (failures, _) in counted.items()}


async def _count_failures(
    conn: AsyncConnection, keys: Sequence[str], window_seconds: int
) -> dict[str, tuple[int, int]]:
    """Count one failure against each key: key → (failures in its window, seconds left)."""
    if not keys:
        return {}
    ordered = sorted(set(keys))
    window_over = auth_failures.c.window_start + _window(window_seconds) <= func.now()
    insert = pg_insert(auth_failures).values([{"key": key} for key in ordered])
    window_end = auth_failures.c.window_start + _window(window_seconds)
    stmt = insert.on_conflict_do_update(
        index_elements=[auth_failures.c.key],
        set_={
            "window_start": case((window_over, func.now()), else_=auth_failures.c.window_start),
            "failures": case((window_over, 1), else_=auth_failures.c.failures + 1),
        },
    ).returning(
        auth_failures.c.key,
        auth_failures.c.failures,
        cast(func.ceil(extract("epoch", window_end - func.now())), Integer).label("left"),
    )
    return {row.key: (row.failures, row.left) for row in await conn.execute(stmt)}


async def reserve_failures(
    conn: AsyncConnection, limits: Mapping[str, int], window_seconds: int
) -> tuple[int | None, dict[str, int]]:
    """Count one failure against each key of ``limits`` *before* the password is checked, so
    that concurrent attempts cannot all pass the limit check (contract §3).

    Returns (None, each key's count) when every key stays within its limit (the failure is
    counted; release it with ``release_failures`` if the password turns out right), else the
    seconds until the longest window over the limit ends; the caller must then roll the
    transaction back, so that a refused attempt is not counted.
    """
    counted = await _count_failures(conn, list(limits), window_seconds)
    over = [left for key, (failures, left) in counted.items() if failures > limits[key]]
    counts = {key: failures for key, (failures, _) in counted.items()}
    return (max(over) if over else None), counts


async def release_failures(conn: AsyncConnection, keys: Sequence[str], window_seconds: int) -> None:
    """Take back a failure ``reserve_failures`` counted (the password was right); a counter
    back at zero is deleted, so the next failure starts a new window."""
    if not keys:
        return
    ordered = sorted(set(keys))
    # lock the rows in key order, as the upsert does (no deadlock between the two)
    await conn.execute(
        select(auth_failures.c.key)
        .where(auth_failures.c.key.in_(ordered))
        .order_by(auth_failures.c.key)
        .with_for_update()
    )
    open_window = auth_failures.c.window_start + _window(window_seconds) > func.now()
    await conn.execute(
        update(auth_failures)
        .where(auth_failures.c.key.in_(ordered), auth_failures.c.failures > 0, open_window)
        .values(failures=auth_failures.c.failures - 1)
    )
    await conn.execute(
        delete(auth_failures).where(auth_failures.c.key.in_(ordered), auth_failures.c.failures <= 0)
    )


async def delete_stale_failures(conn: AsyncConnection, window_seconds: int) -> int:
    """Forget counters whose window has ended (they no longer limit anything)."""
    result = await conn.execute(
        delete(auth_failures).where(
            auth_failures.c.window_start + _window(window_seconds) <= func.now()
        )
    )
    return int(result.rowcount)


# --- users ----------------------------------------------------------------------------------


async def has_users(conn: AsyncConnection) -> bool:
    return bool((await conn.execute(select(select(broker_users.c.id).exists()))).scalar())


async def insert_first_user(
    conn: AsyncConnection, username: str, password_hash: str, role: Role, loopback_only: bool
) -> bool:
    """Create the bootstrap user when there is no user at all; True when this call did.

    An advisory lock held to the end of the transaction serializes concurrent bootstraps
    (several broker processes starting at once), so exactly one of them creates a user even
    if they were configured with different names; ON CONFLICT covers the same name anyway.
    """
    await conn.execute(select(func.pg_advisory_xact_lock(BOOTSTRAP_LOCK_KEY)))
    if await has_users(conn):
        return False
    stmt = (
        pg_insert(broker_users)
        .values(
            username=username,
            password_hash=password_hash,
            role=role.value,
            perm_configure=".*",
            perm_write=".*",
            perm_read=".*",
            loopback_only=loopback_only,
        )
        .on_conflict_do_nothing(index_elements=[broker_users.c.username])
        .returning(broker_users.c.id)
    )
    return (await conn.execute(stmt)).first() is not None


async def get_account(
    conn: AsyncConnection, username: str, *, for_update: bool = False
) -> Account | None:
    stmt = select(*_USER_COLUMNS).where(broker_users.c.username == username)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await conn.execute(stmt)).first()
    return _account(row) if row is not None else None


async def insert_user(
    conn: AsyncConnection, username: str, password_hash: str, role: Role, permissions: Permissions
) -> Account | None:
    """Create a user; None when one of that name exists already (e.g. a concurrent PUT)."""
    stmt = (
        pg_insert(broker_users)
        .values(
            username=username,
            password_hash=password_hash,
            role=role.value,
            perm_configure=permissions.configure,
            perm_write=permissions.write,
            perm_read=permissions.read,
        )
        .on_conflict_do_nothing(index_elements=[broker_users.c.username])
        .returning(*_USER_COLUMNS)
    )
    row = (await conn.execute(stmt)).first()
    return _account(row) if row is not None else None


async def update_user(
    conn: AsyncConnection,
    user_id: int,
    password_hash: str | None,
    role: Role,
    permissions: Permissions,
) -> Account:
    values: dict[str, Any] = {
        "role": role.value,
        "perm_configure": permissions.configure,
        "perm_write": permissions.write,
        "perm_read": permissions.read,
        "updated_at": func.now(),
    }
    if password_hash is not None:
        values["password_hash"] = password_hash
    stmt = (
        update(broker_users)
        .where(broker_users.c.id == user_id)
        .values(**values)
        .returning(*_USER_COLUMNS)
    )
    return _account((await conn.execute(stmt)).one())


async def replace_password_hash(
    conn: AsyncConnection, user_id: int, old_hash: str, new_hash: str
) -> None:
    """Store a rehash (new Argon2 parameters) unless the password changed in the meantime."""
    await conn.execute(
        update(broker_users)
        .where(broker_users.c.id == user_id, broker_users.c.password_hash == old_hash)
        .values(password_hash=new_hash)
    )


async def delete_user(conn: AsyncConnection, username: str) -> bool:
    """Delete a user; its sessions go with it (ON DELETE CASCADE)."""
    result = await conn.execute(
        delete(broker_users).where(broker_users.c.username == username).returning(broker_users.c.id)
    )
    return result.first() is not None


async def list_users(
    conn: AsyncConnection, limit: int, after: str | None, contains: str | None = None
) -> list[User]:
    """Users ordered by name in byte order, keyset-paginated; only those whose name contains
    ``contains``, when given."""
    name = broker_users.c.username.collate("C")
    stmt = (
        select(*_USER_COLUMNS)
        .where(name_contains(broker_users.c.username, contains))
        .order_by(name)
        .limit(limit)
    )
    if after is not None:
        stmt = stmt.where(name > after)
    return [_account(row).user for row in await conn.execute(stmt)]


# --- sessions -------------------------------------------------------------------------------


async def create_session(
    conn: AsyncConnection, token_digest: bytes, user_id: int, ttl_seconds: int
) -> datetime | None:
    """Store a session digest expiring ``ttl_seconds`` from now (database clock).

    None when the user no longer exists: the INSERT ... SELECT takes a KEY SHARE lock on the
    user row, so a concurrent DELETE either happens first (no row, nothing inserted) or waits.
    """
    user = (
        select(
            literal(token_digest, LargeBinary),
            broker_users.c.id,
            func.now() + _window(ttl_seconds),
        )
        .where(broker_users.c.id == user_id)
        .with_for_update(key_share=True)
    )
    stmt = (
        pg_insert(management_sessions)
        .from_select(["token_digest", "user_id", "expires_at"], user)
        .returning(management_sessions.c.expires_at)
    )
    expires_at: datetime | None = (await conn.execute(stmt)).scalar_one_or_none()
    return expires_at


async def delete_session(conn: AsyncConnection, token_digest: bytes) -> bool:
    result = await conn.execute(
        delete(management_sessions)
        .where(management_sessions.c.token_digest == token_digest)
        .returning(management_sessions.c.user_id)
    )
    return result.first() is not None


async def delete_user_sessions(conn: AsyncConnection, user_id: int) -> int:
    result = await conn.execute(
        delete(management_sessions).where(management_sessions.c.user_id == user_id)
    )
    return int(result.rowcount)


async def delete_expired_sessions(conn: AsyncConnection) -> list[bytes]:
    """Delete sessions past their expiry (database clock); returns their digests."""
    result = await conn.execute(
        delete(management_sessions)
        .where(management_sessions.c.expires_at <= func.now())
        .returning(management_sessions.c.token_digest)
    )
    return [bytes(row.token_digest) for row in result]
