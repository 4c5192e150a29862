"""What the broker sends and sets per pool mode (app/storage/pooler.py; docs/operations.md,
"Behind PgBouncer"). The real PgBouncer runs in tests/faults/test_pgbouncer.py."""

from __future__ import annotations

import pytest

from app.config import SettingsError, load_settings
from app.storage import pooler

SETTINGS = {
    "application_name": "messagex",
    "plan_cache_mode": "force_custom_plan",
    "statement_timeout": "30000",
}


def test_only_what_pgbouncer_tracks_goes_at_start_up() -> None:
    assert pooler.startup_settings(SETTINGS) == {"application_name": "messagex"}


def test_session_mode_sets_the_rest_once_per_connection() -> None:
    assert pooler.session_setup("session", SETTINGS) == (
        "SELECT set_config('plan_cache_mode', 'force_custom_plan', false), "
        "set_config('statement_timeout', '30000', false)"
    )
    assert pooler.session_setup("session", {"application_name": "x"}) is None
    assert pooler.session_setup("session", {"a": "it's"}) == (
        "SELECT set_config('a', 'it''s', false)"
    )


def test_transaction_mode_sets_nothing_and_keeps_no_statement() -> None:
    assert pooler.session_setup("transaction", SETTINGS) is None
    assert pooler.driver_args("transaction") == {"statement_cache_size": 0}
    args = pooler.dialect_args("transaction")
    assert args["prepared_statement_cache_size"] == 0
    assert args["prepared_statement_name_func"]() == ""  # unnamed: nothing left behind
    assert pooler.driver_args("session") == pooler.dialect_args("session") == {}


def test_the_settings() -> None:
    s = load_settings()
    assert (s.database_pool_mode, s.listen_database_url) == ("session", None)
    s = load_settings(
        database_pool_mode="transaction", listen_database_url="postgresql://u@db:5432/x"
    )
    assert s.database_pool_mode == "transaction"
    assert s.listen_database_url == "postgresql://u@db:5432/x"


def test_bad_values_name_their_variable() -> None:
    with pytest.raises(SettingsError, match="MESSAGEX_DATABASE_POOL_MODE"):
        load_settings(database_pool_mode="statement")
    with pytest.raises(SettingsError, match="MESSAGEX_LISTEN_DATABASE_URL"):
        load_settings(listen_database_url="mysql://x")
