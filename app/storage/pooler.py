"""What changes behind a transaction pooler (``MESSAGEX_DATABASE_POOL_MODE=transaction``, such as
PgBouncer's ``pool_mode = transaction``): one server connection serves many clients, one
transaction at a time, so nothing may outlive a transaction on it (docs/operations.md,
"Behind PgBouncer"; the decision in docs/decisions.md).

- **Prepared statements.** PgBouncer 1.18 does not follow protocol-level prepared statements
  from one server connection to the next: a statement prepared on one may be executed on
  another, where it does not exist (or, worse, where another statement has its name). So no
  statement is kept: asyncpg's cache is off (``statement_cache_size=0``: it then sends every
  statement unnamed, parsed again with its Bind, within one Sync), and SQLAlchemy's too, with
  the statements it prepares itself unnamed as well (nothing is left on a server connection
  for the next client to trip over, and no name can collide).
- **Startup parameters.** PgBouncer, in either mode, refuses a startup parameter it does not
  track (and one listed in ``ignore_startup_parameters`` is dropped, not applied). So only
  ``application_name`` is sent at start-up, and the broker's other settings
  (``plan_cache_mode``, ``statement_timeout``) are SET once on each new connection
  (``session_setup``; one round trip per connection, which the pools keep). Behind a
  transaction pooler that SET would land on one server connection for whoever comes next,
  so it is not made: ``plan_cache_mode`` is moot there (an unnamed statement is planned once,
  for its parameters: a custom plan, storage/planner.py), and ``statement_timeout`` is the
  server's: set it on the broker's role (``ALTER ROLE … SET statement_timeout``); the
  client's bound on every statement (``command_timeout``) stays.
- **Session state.** The broker keeps none outside a transaction: its advisory locks are
  transaction-scoped, its ``set_config`` calls local; LISTEN needs a session, so it goes over
  ``MESSAGEX_LISTEN_DATABASE_URL`` or is replaced by polling (broker/cluster.py).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

log = logging.getLogger("messagex.pooler")

PoolMode = Literal["session", "transaction"]

SESSION: PoolMode = "session"
TRANSACTION: PoolMode = "transaction"

#: the startup parameters a transaction pooler keeps per client (PgBouncer tracks these)
_TRACKED = frozenset({"application_name"})


def startup_settings(settings: dict[str, str]) -> dict[str, str]:
    """Those of the server ``settings`` a connection sends at start-up."""
    return {name: value for name, value in settings.items() if name in _TRACKED}


def session_setup(pool_mode: PoolMode, settings: dict[str, str]) -> str | None:
    """The statement that makes the rest of ``settings`` on a new connection, or None."""
    rest = {name: value for name, value in settings.items() if name not in _TRACKED}
    if pool_mode == TRANSACTION or not rest:
        return None
    return "SELECT " + ", ".join(
        f"set_config({_literal(name)}, {_literal(value)}, false)" for name, value in rest.items()
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def driver_args(pool_mode: PoolMode) -> dict[str, Any]:
    """asyncpg ``connect`` / ``create_pool`` arguments for ``pool_mode``."""
    return {"statement_cache_size": 0} if pool_mode == TRANSACTION else {}


def dialect_args(pool_mode: PoolMode) -> dict[str, Any]:
    """``connect_args`` of a SQLAlchemy asyncpg engine for ``pool_mode``."""
    if pool_mode != TRANSACTION:
        return {}
    return {
        **driver_args(pool_mode),
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": _unnamed,
    }


def _unnamed() -> str:
    return ""


async def check_statement_timeout(pool_mode: PoolMode, hot: Any, wanted_ms: int) -> None:
    """Behind a transaction pooler the server's ``statement_timeout`` is the role's (the
    broker cannot SET it): warn once when it is unbounded, or looser than
    ``MESSAGEX_DB_STATEMENT_TIMEOUT_MS`` asks. ``hot``: the ``HotPath``."""
    if pool_mode != TRANSACTION or not wanted_ms:
        return
    try:
        async with hot.connection() as conn:
            # pg_settings gives it in ms, whatever unit it was set with
            got = int(
                await conn.fetchval(
                    "SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'"
                )
            )
    except Exception as exc:  # the database is down: the broker says so elsewhere
        log.warning("could not read the server's statement_timeout (%s)", type(exc).__name__)
        return
    if got == 0 or got > wanted_ms:
        log.warning(
            "the server's statement_timeout is %s, MESSAGEX_DB_STATEMENT_TIMEOUT_MS is %d: "
            "behind a transaction pooler the broker cannot SET it; run ALTER ROLE <its role> "
            "SET statement_timeout = %d (docs/operations.md, Behind PgBouncer)",
            f"{got} ms" if got else "0 (none)",
            wanted_ms,
            wanted_ms,
        )
