"""``environment_create --from python-base`` (issue 20) through every door of a real server:
the CLI (``shellyard env create NAME --from python-base``), the SDK over REST
(``environment_create(name, base=...)``) and the official MCP client over stdio
(``environment_create`` with ``base``); and the refusals: an unknown base (bad input, exit 2)
and a base not prepared on the runner (the error names ``shellyard env prepare``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard import Client
from shellyard.errors import NotFound
from shellyard.runner.environments import bases

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def bases_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="shellyard-bases-doors-", dir="/tmp"))
    root.chmod(0o755)
    asyncio.run(bases.prepare(bases.PYTHON_BASE, root=root))
    yield root
    bases._make_writable(root)
    shutil.rmtree(root, ignore_errors=True)


def test_every_door_creates_from_python_base(
    served_home: Path, bases_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20: the same request through the CLI, the SDK and MCP gives a ready environment
    at revision 1 whose first record is python-base; commands in it import numpy."""
    monkeypatch.setenv("SHELLYARD_BASES", str(bases_root))  # the server started below sees it
    home = served_home
    made = sy(home, "env", "create", "cli-sci", "--from", "python-base", "--json")
    assert made.returncode == 0, made.stderr
    view = json.loads(made.stdout)
    assert (view["state"], view["revision"]) == ("ready", 1)
    ran = sy(
        home, "run", "--env", "cli-sci", "--", "python -c 'import numpy; print(numpy.__name__)'"
    )
    assert (ran.returncode, ran.stdout) == (0, "numpy\n"), ran.stderr
    bad = sy(home, "env", "create", "x", "--from", "julia-base")
    assert bad.returncode == 2 and "python-base" in bad.stderr

    client = Client.for_home(home)
    sdk = client.environment_create("sdk-sci", base="python-base", wait_ms=30_000)
    revision = client.environment_revisions(sdk.environment_id, revision=1)[0]
    assert any(p.manager == "base" and p.name == "python-base" for p in revision.packages)
    assert any(p.name == "numpy" for p in revision.packages)

    async def over_mcp() -> dict[str, object]:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "shellyard", "mcp", "--home", str(home)],
            env={**os.environ, "SHELLYARD_HOME": str(home)},
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert "base" in json.dumps(tools["environment_create"].input_schema)
            result = await session.call_tool(
                "environment_create", {"name": "mcp-sci", "base": "python-base", "wait_ms": 30000}
            )
            assert not result.is_error, result.content
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    created = asyncio.run(over_mcp())
    assert (created["state"], created["revision"]) == ("ready", 1)


def test_from_a_base_not_prepared_says_how(served_home: Path) -> None:
    """The suites' SHELLYARD_BASES is empty: the create fails (exit 1 in the CLI, NotFound in
    the SDK) with the command that prepares the base, and no environment is usable."""
    done = sy(served_home, "env", "create", "sci", "--from", "python-base")
    assert done.returncode != 0
    assert "shellyard env prepare" in done.stderr + done.stdout
    with pytest.raises(NotFound) as caught:
        Client.for_home(served_home).environment_create("sci2", base="python-base")
    assert "shellyard env prepare" in caught.value.message
