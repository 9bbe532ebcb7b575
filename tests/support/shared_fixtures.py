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

import pytest
from sshd_fixture import SshServer, sshd_or_skip, start_sshd


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
