"""Managed environments through every interface of a real server (SQLite + local runner): the
official MCP client over stdio (environment_create / _install and run_shell with
environment_id, §3), the Python SDK over REST (sync and async), and the CLI ``shellyard env``
with ``--json`` and its exit codes (0 done, 1 the change failed, 2 bad input)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conda_channel import build_test_channel, build_test_channel_sync
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import sy
from shellyard import AsyncClient, Client
from shellyard.contract.environments import ChangeView, EnvironmentView, RevisionView
from shellyard.errors import Conflict, InvalidInput, NotFound
from shellyard.home import ensure_server

pytestmark = pytest.mark.timeout(300)


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_mcp_stdio_create_install_and_run(served_home: Path) -> None:
    """§3: the contract's tool names; environment_create → environment_id and revision;
    environment_install → the change with its new revision; run_shell with environment_id →
    environment_revision; a failed change and bad input are tool errors that say what to do."""
    home = served_home
    channel = await build_test_channel(home / "channel")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(home)],
        env={**os.environ, "SHELLYARD_HOME": str(home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert {
            "environment_create",
            "environment_install",
            "environment_uninstall",
            "environment_list",
            "environment_show",
            "environment_revisions",
            "environment_change_status",
        } <= set(tools)
        teaching = tools["environment_install"].description or ""
        assert "read-only" in teaching and "waiting_for" in teaching

        created = await call(session, "environment_create", name="tools", wait_ms=30_000)
        assert created["environment_id"].startswith("env_") and created["revision"] == 1
        environment_id = created["environment_id"]
        change = await call(
            session,
            "environment_install",
            environment_id=environment_id,
            manager="conda",
            specs=["shellyard-hello==1.0"],
            channels=[channel.as_uri()],
            wait_ms=30_000,
        )
        assert change["state"] == "succeeded" and change["revision"] == 2
        assert change["waiting_for"] == [] and change["error"] is None

        ran = await call(
            session, "run_shell", command="shellyard-hello", environment_id=environment_id
        )
        assert ran["stdout"] == "hello 1.0\n" and ran["environment_revision"] == 2
        status = await call(session, "execution_status", execution_id=ran["execution_id"])
        assert status["environment_revision"] == 2

        listed = await call(session, "environment_list")
        assert [e["environment_id"] for e in listed["environments"]] == [environment_id]
        shown = await call(session, "environment_show", environment_id=environment_id)
        assert [r["revision"] for r in shown["revisions"]] == [1, 2]
        full = await call(
            session, "environment_revisions", environment_id=environment_id, revision=2
        )
        assert [p["name"] for p in full["revisions"][0]["packages"] if p["manager"] == "conda"] == [
            "shellyard-hello"
        ]
        followed = await call(session, "environment_change_status", change_id=change["change_id"])
        assert followed["state"] == "succeeded"

        removed = await call(
            session,
            "environment_uninstall",
            environment_id=environment_id,
            manager="conda",
            specs=["shellyard-hello"],
            wait_ms=30_000,
        )
        assert removed["state"] == "succeeded" and removed["revision"] == 3

        missing = await session.call_tool(
            "environment_install",
            {
                "environment_id": environment_id,
                "manager": "conda",
                "specs": ["shellyard-nope"],
                "channels": [channel.as_uri()],
                "wait_ms": 30_000,
            },
        )
        assert missing.is_error
        text = missing.content[0].text  # type: ignore[union-attr]
        assert "unchanged (still revision 3)" in text and "chg_" in text
        bad = await session.call_tool(
            "environment_install",
            {"environment_id": environment_id, "manager": "brew", "specs": ["x"]},
        )
        assert bad.is_error and "unknown manager 'brew'" in bad.content[0].text  # type: ignore[union-attr]
        pip_in_command = await call(
            session,
            "run_shell",
            command="pip install --no-index anything",
            environment_id=environment_id,
        )
        assert pip_in_command["exit_code"] != 0  # V7: the read-only prefix, nothing intercepted


async def test_sdk_rest_round_trip(served_home: Path) -> None:
    """REST through the sync and async SDK: create, install, show, revisions, change status,
    uninstall, run with environment_id; errors come back as the same classes."""
    channel = build_test_channel_sync(served_home / "channel")
    with Client.for_home(served_home) as client:
        created = client.environment_create("sdk", wait_ms=30_000)
        assert isinstance(created, EnvironmentView) and created.revision == 1
        assert created.change_id is not None
        change = client.environment_install(
            created.environment_id,
            "conda",
            ["shellyard-hello"],
            channels=[channel.as_uri()],
            wait_ms=30_000,
        )
        assert isinstance(change, ChangeView) and change.revision == 2
        status = client.environment_change_status(change.change_id, wait_s=1)
        assert status.state == "succeeded"
        revisions = client.environment_revisions(created.environment_id)
        assert all(isinstance(r, RevisionView) for r in revisions)
        assert revisions[1].request["specs"] == ["shellyard-hello"]
        assert {p.name for p in revisions[1].packages if p.manager == "conda"} == {
            "shellyard-hello"
        }
        only = client.environment_revisions(created.environment_id, revision=1)
        assert [r.revision for r in only] == [1]
        ran = client.run("shellyard-hello", environment_id=created.environment_id)
        assert ran.stdout == "hello 2.0\n" and ran.environment_revision == 2
        with pytest.raises(Conflict, match="already exists"):
            client.environment_create("sdk")
        with pytest.raises(InvalidInput, match="language must be 'python' or 'r'"):
            client.environment_create("other", language="julia")
        with pytest.raises(NotFound, match="no environment change"):
            client.environment_change_status("chg_nope")
        with pytest.raises(NotFound, match="has no revision 9"):
            client.environment_revisions(created.environment_id, revision=9)

    info = ensure_server(served_home)
    async with AsyncClient(info.url, info.token) as aclient:
        listed = await aclient.environment_list()
        assert [e.name for e in listed] == ["sdk"]
        shown = await aclient.environment_show(created.environment_id)
        assert shown.revision == 2 and shown.prefix
        removed = await aclient.environment_uninstall(
            created.environment_id, "conda", ["shellyard-hello"], wait_ms=30_000
        )
        assert removed.state == "succeeded" and removed.revision == 3


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cli_env_verbs(served_home: Path) -> None:
    """``shellyard env create|install|uninstall|list|show|revisions|status`` with --json,
    ``shellyard run --env``; exit codes 0 done, 1 change failed, 2 bad input."""
    home = served_home
    channel = build_test_channel_sync(home / "channel").as_uri()
    created = ok_json(sy(home, "env", "create", "cli", "--json"))
    assert created["state"] == "ready" and created["revision"] == 1
    environment_id = created["environment_id"]

    installed = ok_json(
        sy(
            home,
            "env",
            "install",
            "cli",
            "conda",
            "shellyard-hello==1.0",
            "-c",
            channel,
            "--json",
            timeout=180,
        )
    )
    assert installed["state"] == "succeeded" and installed["revision"] == 2
    text = sy(
        home,
        "env",
        "install",
        environment_id,
        "conda",
        "shellyard-words",
        "-c",
        channel,
        timeout=180,
    )
    assert text.returncode == 0, text.stderr
    assert "now at revision 3" in text.stdout

    listed = ok_json(sy(home, "env", "list", "--json"))
    assert [(e["name"], e["revision"]) for e in listed] == [("cli", 3)]
    shown = ok_json(sy(home, "env", "show", "cli", "--json"))
    assert [r["manager"] for r in shown["revisions"]] == [None, "conda", "conda"]
    human = sy(home, "env", "show", "cli")
    assert human.returncode == 0 and "shellyard-words" in human.stdout
    revisions = ok_json(sy(home, "env", "revisions", "cli", "--revision", "2", "--json"))
    assert [p["name"] for p in revisions[0]["packages"] if p["manager"] == "conda"] == [
        "shellyard-hello"
    ]
    status = ok_json(sy(home, "env", "status", installed["change_id"], "--json"))
    assert status["state"] == "succeeded" and status["revision"] == 2

    ran = sy(home, "run", "--env", "cli", "--json", "--", "shellyard-hello")
    view = json.loads(ran.stdout)
    assert view["stdout"] == "hello 1.0\n" and view["environment_revision"] == 3

    removed = ok_json(sy(home, "env", "uninstall", "cli", "conda", "shellyard-words", "--json"))
    assert removed["revision"] == 4

    failed = sy(
        home, "env", "install", "cli", "conda", "shellyard-nope", "-c", channel, timeout=180
    )
    assert failed.returncode == 1, failed.stderr
    assert "unchanged (still revision 4)" in failed.stderr
    # The same words when the failure is followed rather than met within the first call's
    # wait (a loaded CI saw "the environment is unchanged" alone on that path).
    failed_id = re.search(r"chg_[0-9a-f]+", failed.stderr)
    assert failed_id, failed.stderr
    followed = sy(home, "env", "status", failed_id.group(0), "--wait")
    assert followed.returncode == 1 and "unchanged (still revision 4)" in followed.stderr, (
        followed.stderr
    )
    bad = sy(home, "env", "install", "cli", "brew", "x")
    assert bad.returncode == 2 and "unknown manager 'brew'" in bad.stderr
    unknown = sy(home, "env", "show", "nothing-here")
    assert unknown.returncode == 2 and "no environment named 'nothing-here'" in unknown.stderr
    assert ok_json(sy(home, "env", "show", "cli", "--json"))["revision"] == 4
