"""Fixtures of the support modules that a test takes by name, as a parameter, with no import:
``tests/conftest.py`` registers this module as a pytest plugin (``pytest_plugins``). Imported
into a test module, a fixture taken as a parameter there is a redefinition to ruff (F811).

The plugin is a module of its own, not the helper module a fixture uses: conftest.py imports
those helpers before pytest loads its plugins, and a plugin imported already is one whose
asserts pytest cannot rewrite (it warns). Fixtures here may take conftest's (``home``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from sshd_fixture import SshServer, sshd_or_skip, start_sshd

if TYPE_CHECKING:
    from shellyard.control.plane import ControlPlane


@pytest.fixture
async def sshd(home: Path) -> AsyncIterator[SshServer]:
    """A real sshd on loopback started in ``home/sshd`` for one test, SIGKILLed afterwards
    with every session it forked; the test is skipped where OpenSSH is not installed."""
    sshd_or_skip()
    server = await start_sshd(home / "sshd")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres() -> None:
    """The machine's PostgreSQL at 127.0.0.1:5432; the test is skipped where none runs
    (replica tests: ``pytestmark = pytest.mark.usefixtures("postgres")``)."""
    from replicas_fixture import postgres_or_skip

    postgres_or_skip()


@pytest.fixture
async def app_plane(home: Path) -> AsyncIterator[tuple[httpx.AsyncClient, ControlPlane, str]]:
    """A real control plane behind the REST app, reached in-process through httpx's ASGI
    transport (no server process): (client, plane, the admin token)."""
    # imported when used: the plugin loads before any test, and most never build a plane
    from shellyard.api.app import create_app
    from shellyard.config import Settings
    from shellyard.control.plane import build

    plane = await build(Settings(home=home / "home"))
    admin = await plane.tokens.ensure_admin_file(plane.settings.home)
    transport = httpx.ASGITransport(app=create_app(plane))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        yield client, plane, admin
    await plane.aclose()
