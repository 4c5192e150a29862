"""Warns when a snapshot held on the broker's database keeps VACUUM from cleaning up.

A session that keeps a transaction (and so a snapshot) open — a forgotten ``psql`` inside
``BEGIN``, a long ``REPEATABLE READ`` report — or a replication slot with an old ``xmin``
holds back every table's cleanup horizon: every ACKed message stays in ``messages`` as a dead
row until it ends, and claims and the table's size degrade (docs/reliability.md, "A held
snapshot"). The broker cannot end it; it says who it is, so that an operator can.

Every broker process runs the check (one query over ``pg_stat_activity`` and
``pg_replication_slots``, every ``interval`` s): no election needed, and a few processes cost
a few cheap queries a minute. Each warns about a holder at most once per ``warn_seconds``.
"""

from __future__ import annotations

import logging
import time

from app.storage.database import Database
from app.storage.health import XminHolder, oldest_xmin_holder

log = logging.getLogger("messagex.vacuum")

#: the check runs this often, or every half threshold when that is shorter
CHECK_SECONDS = 30.0


class XminWatch:
    def __init__(self, db: Database, warn_seconds: float) -> None:
        self.db = db
        self.warn_seconds = warn_seconds
        #: holder → when it was first seen (a slot has no start time of its own)
        self._first_seen: dict[tuple[str, int | None, str], float] = {}
        #: holder → when it was last warned about
        self._warned: dict[tuple[str, int | None, str], float] = {}

    @property
    def interval(self) -> float:
        return min(CHECK_SECONDS, max(1.0, self.warn_seconds / 2))

    async def check(self) -> XminHolder | None:
        """Look once; warn when the oldest holder is older than the threshold. Returns the
        holder warned about, if any."""
        async with self.db.connect() as conn:
            holder = await oldest_xmin_holder(conn)
        now = time.monotonic()
        if holder is None:
            self._first_seen.clear()
            self._warned.clear()
            return None
        key = (holder.kind, holder.pid, holder.name)
        self._first_seen = {key: self._first_seen.get(key, now)}
        self._warned = {k: v for k, v in self._warned.items() if k == key}
        age = holder.age_seconds
        if age is None:
            age = now - self._first_seen[key]
        if age < self.warn_seconds:
            return None
        last = self._warned.get(key)
        if last is not None and now - last < self.warn_seconds:
            return None
        self._warned[key] = now
        log.warning(
            "a %s holds the oldest snapshot on the database and keeps VACUUM from removing "
            "dead rows (ACKed messages stay in the table until it ends): pid %s, "
            "application_name %r, state %r, age %.0f s, xmin %d transactions old "
            "(MESSAGEX_XMIN_WARN_SECONDS=%g)",
            holder.kind,
            holder.pid,
            holder.name,
            holder.state,
            age,
            holder.xid_age,
            self.warn_seconds,
        )
        return holder
