"""Fixtures of the web page's tests (issue 14), loaded by each test module with
``pytest_plugins = ["web_fixtures"]`` (a conftest.py here would shadow tests/conftest.py,
which other tests import as ``conftest``): a served home and Debian's Chromium driven by
Playwright (launched from /usr/bin/chromium; never 'playwright install', which downloads)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright
from web_helpers import CHROMIUM, CHROMIUM_ARGS, Served, free_port, make_home


def _serve() -> Iterator[Served]:
    home = make_home()
    server = Served(home, free_port())
    server.start()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """One server per test module (it takes seconds to start on a loaded machine); every test
    makes sessions of its own, so tests do not see each other's records."""
    yield from _serve()


@pytest.fixture
def own_served() -> Iterator[Served]:
    """A server of the test's own, for a test that stops and restarts it."""
    yield from _serve()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"Debian's chromium is not installed at {CHROMIUM} on this machine: "
            "'SHELLYARD_SETUP_TESTS=1 bash scripts/setup' installs it"
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        await launched.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    made = await browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    yield made
    await made.close()


@pytest.fixture
async def page(context: BrowserContext) -> Page:
    opened = await context.new_page()
    opened.set_default_timeout(15_000)
    return opened
