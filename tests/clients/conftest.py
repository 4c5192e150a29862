"""A broker (with a database of its own) per test module, for the client tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import LiveServer, PgCluster, running_server
from tests.support import test_settings as settings_for


@pytest.fixture(scope="module")
def broker(pg_cluster: PgCluster, template_db: str) -> Iterator[LiveServer]:
    name = pg_cluster.create_database(template_db)
    try:
        with running_server(settings_for(pg_cluster.url_for(name))) as live:
            yield live
    finally:
        pg_cluster.drop_database(name)
