"""Helpers shared by the browser tests."""

from __future__ import annotations

from playwright.sync_api import Locator, Page, expect

from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer


def log_in(
    page: Page, server: LiveServer, username: str = ADMIN_USER, password: str = ADMIN_PASSWORD
) -> None:
    page.goto(f"{server.base_url}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()


def go(page: Page, nav: str) -> None:
    """Follow a link of the main navigation."""
    page.get_by_role("navigation", name="Main").get_by_role("link", name=nav, exact=True).click()


def stat(page: Page, key: str) -> Locator:
    """The locator of one live statistic (``data-stat``)."""
    return page.locator(f'[data-stat="{key}"]')
