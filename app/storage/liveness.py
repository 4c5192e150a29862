"""Checks that keep live WebSocket connections honest: sessions still valid, users still there.
Each is one statement on the hot path (no transaction): they run every 2 s on every process."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text

from app.domain.model import Permissions, Role, User
from app.storage.fastpath import HotPath, Statement

# Sessions among these digests that are neither revoked (deleted) nor expired (DB clock).
LIVE_SESSIONS = text("""
SELECT token_digest FROM management_sessions
WHERE token_digest = ANY(CAST(:digests AS bytea[])) AND expires_at > now()
""")

USERS = text("""
SELECT username, role, perm_configure, perm_write, perm_read, loopback_only, password_hash
FROM broker_users WHERE username = ANY(CAST(:names AS text[]))
""")


_LIVE_SESSIONS = Statement(LIVE_SESSIONS)
_USERS = Statement(USERS)


async def live_sessions(hot: HotPath, digests: Sequence[bytes]) -> set[bytes]:
    if not digests:
        return set()
    rows = await hot.fetch(_LIVE_SESSIONS, {"digests": list(digests)})
    return {bytes(r[0]) for r in rows}


async def users(hot: HotPath, names: Sequence[str]) -> dict[str, tuple[User, str]]:
    """The named users that exist, with their current password hash."""
    if not names:
        return {}
    rows = await hot.fetch(_USERS, {"names": list(names)})
    return {
        r[0]: (User(r[0], Role(r[1]), Permissions(r[2], r[3], r[4]), bool(r[5])), r[6])
        for r in rows
    }
