"""Browser tests: Debian's headless Chromium (/usr/bin/chromium) driven by Playwright.

Playwright never downloads a browser here: it launches the system Chromium by path. One
broker (with a database of its own) and one browser for the whole package, and a fresh
browser context (its own sessionStorage) per test; tests use names of their own.

Playwright's sync API keeps an event loop running on the main thread while it is started,
and the database fixtures call ``asyncio.run``: so Playwright starts only after the
package's server (and its database) exist, and stops before they are torn down — the
``playwright`` fixture depends on ``ui_server`` for that order, and is package-scoped so
that no test outside this package runs under Playwright's loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    Playwright,
    expect,
    sync_playwright,
)

from tests.support import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    LiveServer,
    PgCluster,
    client,
    running_server,
    unavailable_here,
)
from tests.support import test_settings as settings_for

CHROMIUM = Path(os.environ.get("MESSAGEX_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="package")
def playwright(ui_server: LiveServer) -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        unavailable_here(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does it)")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # Playwright gives every launch a fresh, temporary user-data-dir.
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="package")
def ui_server(pg_cluster: PgCluster, template_db: str) -> Iterator[LiveServer]:
    name = pg_cluster.create_database(template_db)
    try:
        # the charts' history sampled every second, so that tests see it soon
        settings = settings_for(pg_cluster.url_for(name), history_interval_seconds=1)
        with running_server(settings) as live:
            yield live
    finally:
        pg_cluster.drop_database(name)


@pytest.fixture(scope="package")
def rest(ui_server: LiveServer) -> Iterator[httpx.Client]:
    """The REST API as the bootstrap admin, to arrange and check what the UI shows."""
    with client(ui_server.base_url, auth=(ADMIN_USER, ADMIN_PASSWORD)) as c:
        yield c


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(10_000)
    # expect(...) has its own default (5 s): on a loaded CI runner (three test workers on
    # two cores) a WebSocket publish's answer once took longer. The same bound as actions.
    expect.set_options(timeout=10_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    """A page that records script errors and accepts confirm() dialogs (purge, delete)."""
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("dialog", lambda dialog: dialog.accept())
    yield pg
    assert errors == [], f"uncaught script errors: {errors}"
