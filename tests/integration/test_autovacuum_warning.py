"""The broker says at start when autovacuum will not visit ``messages``: every ACK leaves a
dead row there that only VACUUM reclaims, so without it the table grows without bound (the
soak measured 2.1 kB per message, docs/reliability.md). Real PostgreSQL."""

from __future__ import annotations

import logging

import pytest

from app.lifespan import warn_if_autovacuum_off
from app.storage.database import Database
from tests.integration.test_publish_atomicity import execute

WARNING = "autovacuum is off for the messages table"


async def test_warns_when_the_table_has_autovacuum_disabled(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await execute(database_url, "ALTER TABLE messages SET (autovacuum_enabled = false)")
    with caplog.at_level(logging.WARNING, "messagex"):
        await warn_if_autovacuum_off(db)
    assert WARNING in caplog.text


async def test_follows_the_server_setting_otherwise(
    db: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows = await execute(database_url, "SELECT current_setting('autovacuum')::bool AND $1", True)
    server_on = bool(rows[0][0])
    with caplog.at_level(logging.WARNING, "messagex"):
        await warn_if_autovacuum_off(db)
    assert (WARNING in caplog.text) is not server_on
