"""docs/files-and-transfers.md, "Names that are not UTF-8", over MCP (W2, W3, T1): MCP's
wire is strict UTF-8 JSON, so a name holding a byte that is not UTF-8 is answered in its
marked form ``/`` + escape (``/n/caf\\xe9.txt``) with ``not_utf8`` set, and the same form
names it back to file_read, file_move, workspace_transfer and file_delete; never an
exception. The official MCP client over stdio against a served home."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from shellyard.sdk.client import _home_server


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_mcp_lists_reads_moves_transfers_and_deletes_names_that_are_not_utf8(
    served_home: Path,
) -> None:
    url, token = _home_server(served_home)
    made = httpx.post(
        f"{url}/v1/executions",
        json={"command": "mkdir -p n && printf data > n/$(printf 'caf\\351.txt')"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert made.status_code == 200, made.text
    workspace = made.json()["workspace_id"]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(served_home)],
        env={**os.environ, "SHELLYARD_HOME": str(served_home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listing = await call(session, "file_list", path="n")
        [entry] = listing["entries"]
        assert entry["path"] == "/n/caf\\xe9.txt" and entry["not_utf8"] is True
        text = await call(session, "file_read", path=entry["path"])
        assert text["data"] == "data"
        await call(session, "file_move", source=entry["path"], destination="m/caf\\xe9.txt")
        moved = await call(session, "file_list", path="m")
        assert [e["path"] for e in moved["entries"]] == ["m/caf\\xe9.txt"]  # a real name
        await call(session, "file_move", source="m/caf\\xe9.txt", destination="/m/caf\\xe9.txt")
        back = await call(session, "file_list", path="m")
        assert [e["path"] for e in back["entries"]] == ["/m/caf\\xe9.txt"]
        started = await call(
            session,
            "workspace_transfer",
            action="start",
            source_workspace_id=workspace,
            paths=["m"],
            target_workspace_id=workspace,
            target_folder="copy",
        )
        transfer_id = started["transfer_id"]
        for _ in range(120):
            view = await call(
                session, "workspace_transfer", action="query", transfer_id=transfer_id
            )
            if view["state"] not in ("queued", "running"):
                break
            import asyncio

            await asyncio.sleep(0.5)
        assert view["state"] == "completed", view
        assert "/copy/m/caf\\xe9.txt" in [f["target_path"] for f in view["files"]]
        copied = await call(session, "file_read", path="/copy/m/caf\\xe9.txt")
        assert copied["data"] == "data"
        await call(session, "file_delete", path="/copy/m/caf\\xe9.txt")
        gone = await call(session, "file_list", path="copy/m")
        assert gone["entries"] == []
