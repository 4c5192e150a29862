"""Fault, load and bad-input suite (issue 5).

Every test here is marked ``faults``. Heavy ones are also marked ``slow`` and are opt-in:
``pytest -m slow tests/faults`` runs them; a plain ``pytest`` (CI) skips them and runs the
fast subset, which uses smaller counts of the same scenarios.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import BrokerProc, brokers
from tests.faults.pg import OwnPostgres
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    client,
    running_server,
)
from tests.support import test_settings as settings_for

HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault-injection, load and bad-input suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the suite's items (slow ones are deselected by tests/conftest.py unless asked
    for; those that run may outlast the suite's 60 s per-test timeout)."""
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.faults)
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.timeout(1200))


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture(scope="module")
def own_pg() -> Iterator[OwnPostgres]:
    """A PostgreSQL of this module's own, which the test may stop and restart. Never the
    machine's shared server."""
    root = Path(tempfile.mkdtemp(prefix="messagex-faults-pg-"))
    pg = OwnPostgres(root)
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def module_db(pg_cluster: PgCluster, template_db: str) -> Iterator[str]:
    """A migrated database shared by one module's tests (their queues have distinct names)."""
    name = pg_cluster.create_database(template_db)
    try:
        yield pg_cluster.url_for(name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture(scope="module")
def module_logs() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="messagex-faults-logs-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(module_db: str, module_logs: Path) -> Iterator[list[BrokerProc]]:
    """Two broker processes on one database, shared by a module (short ack timeouts)."""
    with brokers(
        module_db, module_logs, 2, ACK_TIMEOUT_SECONDS=3, ACK_TIMEOUT_CHECK_INTERVAL_MS=200
    ) as started:
        yield started


@pytest.fixture(scope="module")
def mserver(module_db: str) -> Iterator[LiveServer]:
    """An in-process server shared by one module's tests."""
    with running_server(settings_for(module_db)) as live:
        yield live


@pytest.fixture(scope="module")
def madmin(mserver: LiveServer) -> Iterator[httpx.Client]:
    with client(mserver.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        yield c
