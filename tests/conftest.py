"""Fixtures: one PostgreSQL for the run, one migrated template, a fresh clone per test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from hypothesis import HealthCheck, settings

from app.storage.database import Database, create_engine
from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    client,
    login,
    running_server,
    test_settings,
)

# Property tests check what is generated, not how fast: on a busy 2-core machine (CI, a
# benchmark beside it) data generation can be slow, which must not fail a test.
settings.register_profile("messagex", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("messagex")

_SHARED_PG = pytest.StashKey[PgCluster]()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``) the workers share one embedded PostgreSQL: the
    controller starts it before it spawns them and hands them its URL through
    MESSAGEX_TEST_DATABASE_URL (each worker still has its own template and databases, named
    after its pid). Without xdist, or with a URL given, the ``pg_cluster`` fixture does it."""
    distributed = config.getoption("dist", "no") != "no" and config.getoption("numprocesses", 0)
    if not distributed or hasattr(config, "workerinput"):
        return
    if os.environ.get("MESSAGEX_TEST_DATABASE_URL"):
        return
    cluster = PgCluster(None)
    config.stash[_SHARED_PG] = cluster
    os.environ["MESSAGEX_TEST_DATABASE_URL"] = cluster.url


#: Tests that keep the CPU busy for long (broker processes under load, floods, fuzzing,
#: benchmarks; property tests with thousands of examples) or that time a broker under load.
#: Under xdist's ``--dist loadgroup`` each group runs on one worker, one test at a time, so
#: at most one of each kind runs beside the rest of the suite, as they did in a serial run.
_HEAVY_GROUPS = {
    "processes": (
        "tests/faults/",
        "tests/bench/",
        "tests/api/test_multiprocess.py",
        "tests/api/test_ttl_multiprocess.py",
        "tests/api/test_routing_cache.py",
        "tests/api/test_ws_many_queues.py",
        "tests/api/test_cli.py",
    ),
    "properties": (
        "tests/unit/test_publish_decoding.py",
        "tests/unit/test_fast_decoders.py",
        "tests/unit/test_routing.py",
        "tests/unit/test_route_graph.py",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (minutes, big volumes) run only when asked for (``pytest -m
    slow``): otherwise they are deselected (reported as such), not skipped. The CPU-heavy
    files get their xdist group (run one at a time each under ``make test TEST_WORKERS=n``)."""
    if "slow" not in (config.getoption("markexpr", "") or ""):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix()
        for group, prefixes in _HEAVY_GROUPS.items():
            if path.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))


def pytest_unconfigure(config: pytest.Config) -> None:
    cluster = config.stash.get(_SHARED_PG, None)
    if cluster is not None:
        os.environ.pop("MESSAGEX_TEST_DATABASE_URL", None)
        cluster.stop()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    cluster = PgCluster(None)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def template_db(pg_cluster: PgCluster) -> Iterator[str]:
    name = pg_cluster.template()
    yield name
    pg_cluster.drop_database(name)


@pytest.fixture
def database_url(pg_cluster: PgCluster, template_db: str) -> Iterator[str]:
    """A freshly migrated database of this test's own (a clone of the template)."""
    name = pg_cluster.create_database(template_db)
    try:
        yield pg_cluster.url_for(name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
def empty_database_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A database with no schema at all."""
    name = pg_cluster.create_database(None)
    try:
        yield pg_cluster.url_for(name)
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(create_engine(database_url, pool_size=5, max_overflow=5))
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture
def server(database_url: str) -> Iterator[LiveServer]:
    with running_server(test_settings(database_url)) as live:
        yield live


@pytest.fixture
def admin_token(server: LiveServer) -> str:
    return login(server.base_url, ADMIN_USER, ADMIN_PASSWORD)


@pytest.fixture
def admin(server: LiveServer) -> Iterator[httpx.Client]:
    """An httpx client for /api/v1 as the bootstrap admin (HTTP Basic)."""
    with client(server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        yield c


@pytest.fixture
def anon(server: LiveServer) -> Iterator[httpx.Client]:
    with client(server.base_url) as c:
        yield c


@pytest.fixture(scope="module")
def srv(
    request: pytest.FixtureRequest, pg_cluster: PgCluster, template_db: str
) -> Iterator[LiveServer]:
    """One server (and database) shared by a module's tests, which isolate themselves by
    using names of their own. A module tunes it with ``SERVER_SETTINGS = {...}``."""
    name = pg_cluster.create_database(template_db)
    try:
        overrides = getattr(request.module, "SERVER_SETTINGS", {})
        with running_server(test_settings(pg_cluster.url_for(name), **overrides)) as live:
            yield live
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture(scope="module")
def adm(srv: LiveServer) -> Iterator[httpx.Client]:
    """An admin client (HTTP Basic) of the module's shared server."""
    with client(srv.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        yield c


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many WebSocket frames were checked against openapi/asyncapi.json."""
    from tests.asyncapi_check import COUNTS

    if COUNTS:
        counts = ", ".join(f"{n:,} {what}" for what, n in sorted(COUNTS.items()))
        terminalreporter.write_line(f"AsyncAPI: {counts}")
