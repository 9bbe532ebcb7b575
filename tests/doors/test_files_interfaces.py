"""Files, history, transfers and artifacts through every interface of a real server on the
embedded default (SQLite + local runner): the CLI verbs (``shellyard files|transfer|artifact``),
the Python client over REST (streamed uploads and downloads, ranges), and the official MCP
client over stdio (``workspace_transfer`` and the file, snapshot and artifact tools)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from shellyard.errors import NotFound, PathRefused
from shellyard.sdk.client import Client

pytestmark = pytest.mark.timeout(240)


def sy(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "shellyard", *args],
        env={**os.environ, "SHELLYARD_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def ok(result: subprocess.CompletedProcess[bytes]) -> Any:
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    return json.loads(text) if text.strip().startswith(("{", "[")) else text


def test_cli_files_history_transfer_and_artifact_verbs(served_home: Path, tmp_path: Path) -> None:
    """The CLI verbs a user runs: put (a file, a folder), ls, cat, get, history, diff,
    restore, transfer start (followed to the end), artifact declare/list/get, gc; bad input
    exits 2 with the error's text."""
    home = served_home
    payload = os.urandom(3 << 20)
    (tmp_path / "in.bin").write_bytes(payload)
    folder = tmp_path / "proj"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.txt").write_text("alpha\n")
    (folder / "b.txt").write_text("beta\n")
    (folder / "link").symlink_to("b.txt")

    assert "new snapshot 1" in ok(sy(home, "files", "put", str(tmp_path / "in.bin"), "data/in.bin"))
    assert "new snapshot 2" in ok(sy(home, "files", "put", str(folder)))
    listing = {e["path"]: e for e in ok(sy(home, "files", "ls", "-r", "--json"))}
    assert listing["proj/sub/a.txt"]["size"] == 6 and listing["proj/link"]["target"] == "b.txt"
    assert sy(home, "files", "cat", "data/in.bin").stdout == payload
    assert (
        sy(home, "files", "cat", "data/in.bin", "--offset", "10", "--length", "5").stdout
        == (payload[10:15])
    )
    ok(sy(home, "files", "get", "proj", str(tmp_path / "out")))
    assert (tmp_path / "out" / "sub" / "a.txt").read_text() == "alpha\n"
    assert os.readlink(tmp_path / "out" / "link") == "b.txt"
    ok(sy(home, "files", "get", "data/in.bin", str(tmp_path / "copy.bin")))
    assert (tmp_path / "copy.bin").read_bytes() == payload

    ran = sy(home, "run", "--", "echo changed > data/in.bin")
    assert ran.returncode == 0, ran.stderr
    history = ok(sy(home, "files", "history", "--json"))
    kinds = [s["made_by_kind"] for s in history["snapshots"]]
    assert kinds == ["created", "edit", "edit", "execution"]
    diff = ok(sy(home, "files", "diff", "2", "--json"))
    assert [(c["path"], c["change"], c["new_size"]) for c in diff] == [
        ("data/in.bin", "changed", 8)
    ]
    assert "new snapshot 4" in ok(sy(home, "files", "restore", "2"))
    assert sy(home, "files", "cat", "data/in.bin").stdout == payload

    (workspace,) = ok(sy(home, "transfer", "discover", "--json"))
    ws = workspace["workspace_id"]
    started = ok(
        sy(home, "transfer", "start", ws, "proj", "--to", ws, "--folder", "copy", "--json")
    )
    assert started["state"] == "completed" and started["files_copied"] == 5
    outcomes = ok(sy(home, "transfer", "files", started["transfer_id"], "--json"))
    assert {o["target_path"] for o in outcomes} >= {"copy/proj/sub/a.txt", "copy/proj/link"}
    assert [t["transfer_id"] for t in ok(sy(home, "transfer", "list", "--json"))] == [
        started["transfer_id"]
    ]

    declared = ok(sy(home, "artifact", "declare", "copy/proj/b.txt", "--name", "beta", "--json"))
    assert declared["sha256"] == hashlib.sha256(b"beta\n").hexdigest()
    assert [a["name"] for a in ok(sy(home, "artifact", "list", "--json"))] == ["beta"]
    ok(sy(home, "artifact", "get", declared["artifact_id"], str(tmp_path / "beta.txt")))
    assert (tmp_path / "beta.txt").read_text() == "beta\n"

    bad = sy(home, "files", "cat", "../etc/passwd")
    assert bad.returncode == 2 and b"path_refused" in bad.stderr and not bad.stdout
    busy = sy(home, "files", "rm", "proj")
    assert busy.returncode == 2 and b"recursive" in busy.stderr
    assert "new snapshot" in ok(sy(home, "files", "rm", "-r", "proj"))
    gc = ok(sy(home, "files", "gc", "--keep-last", "1", "--grace-s", "0", "--json"))
    assert gc["keep_last"] == 1 and not gc["errors"]


def test_python_client_streams_uploads_downloads_and_ranges(served_home: Path) -> None:
    """The SDK over REST: a 40 MB upload from a generator, a ranged download, text and
    base64 reads, a folder as a tar stream, a tar upload, a transfer, and errors that come
    back as the same class."""
    block = os.urandom(1 << 20)
    digest = hashlib.sha256()

    def generate() -> Iterator[bytes]:
        for _ in range(40):
            digest.update(block)
            yield block

    with Client.for_home(served_home) as client:
        edit = client.write_file("big/data.bin", generate(), mode=0o640)
        assert edit.written[0].sha256 == digest.hexdigest() and edit.written[0].mode == 0o640
        back = hashlib.sha256()
        size = 0
        for chunk in client.iter_file("big/data.bin"):
            assert len(chunk) <= 1 << 20
            back.update(chunk)
            size += len(chunk)
        assert size == 40 << 20 and back.hexdigest() == digest.hexdigest()
        assert b"".join(client.iter_file("big/data.bin", offset=(1 << 20) - 2, length=4)) == (
            block[-2:] + block[:2]
        )
        client.write_file("notes/é.txt", "héllo wörld\n".encode())
        text = client.read_text("notes/é.txt", offset=0, limit=2)  # never half a character
        assert (text.encoding, text.data, text.next_offset) == ("utf-8", "h", 1)
        text = client.read_text("notes/é.txt", offset=1, limit=4)
        assert (text.encoding, text.data, text.next_offset) == ("utf-8", "éll", 5)
        binary = client.read_text("big/data.bin", limit=16)
        assert binary.encoding == "base64"

        archive = b"".join(client.iter_archive("notes"))
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert tar.getnames() == ["notes", "notes/é.txt"]
        unpacked = client.upload_archive(archive, "restored")
        assert any(w.path == "restored/notes/é.txt" for w in unpacked.written)

        ws = edit.workspace_id
        transfer = client.transfer_start(ws, ["notes/*.txt"], ws, "globbed", batch_files=1)
        while not transfer.terminal:
            transfer = client.transfer_wait(transfer.transfer_id, 5)
        assert transfer.state == "completed" and transfer.files_copied == 1
        assert client.stat("globbed/é.txt").size == len("héllo wörld\n".encode())

        with pytest.raises(PathRefused, match="absolute"):
            client.write_file("/etc/x", b"x")
        with pytest.raises(NotFound, match="no file 'nope'"):
            b"".join(client.iter_file("nope"))
        history = client.history()
        assert history.snapshots[-1].made_by_kind == "transfer"


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def test_mcp_stdio_file_snapshot_transfer_and_artifact_tools(served_home: Path) -> None:
    """The official MCP client over stdio: workspace_transfer (discover, start, query, list,
    cancel of a finished one), file_write/file_read/file_list, snapshot_list/diff/restore,
    artifact_declare/list, and errors as tool errors that say what to do."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "shellyard", "mcp", "--tools", "all", "--home", str(served_home)],
        env={**os.environ, "SHELLYARD_HOME": str(served_home)},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {
            "workspace_transfer",
            "file_list",
            "file_read",
            "file_write",
            "file_delete",
            "file_move",
            "snapshot_list",
            "snapshot_diff",
            "snapshot_restore",
            "artifact_declare",
            "artifact_list",
        } <= names

        wrote = await call(session, "file_write", path="src/main.py", content="print(42)\n")
        assert wrote["snapshot_seq"] == 1 and wrote["new_snapshot"]
        ran = await call(session, "run_shell", command="python3 src/main.py > out.txt")
        assert ran["state"] == "completed"
        text = await call(session, "file_read", path="out.txt")
        assert (text["data"], text["complete"], text["encoding"]) == ("42\n", True, "utf-8")
        listing = await call(session, "file_list", recursive=True)
        assert {e["path"] for e in listing["entries"]} == {"src", "src/main.py", "out.txt"}

        found = await call(session, "workspace_transfer", action="discover")
        (ws,) = [w["workspace_id"] for w in found["workspaces"]]
        started = await call(
            session,
            "workspace_transfer",
            action="start",
            source_workspace_id=ws,
            paths=["src", "out.txt"],
            target_workspace_id=ws,
            target_folder="backup",
        )
        assert started["transfer_id"].startswith("tr_")
        query: dict[str, Any] = {}
        for _ in range(200):
            query = await call(
                session, "workspace_transfer", action="query", transfer_id=started["transfer_id"]
            )
            if query["state"] not in ("queued", "running"):
                break
            await asyncio.sleep(0.05)
        assert query["state"] == "completed" and query["files_copied"] == 3
        assert {f["outcome"] for f in query["files"]} == {"copied"}
        listed = await call(session, "workspace_transfer", action="list")
        assert [t["transfer_id"] for t in listed["transfers"]] == [started["transfer_id"]]
        again = await call(
            session, "workspace_transfer", action="cancel", transfer_id=started["transfer_id"]
        )
        assert again["state"] == "completed"  # a finished transfer comes back unchanged

        history = await call(session, "snapshot_list")
        kinds = [s["made_by_kind"] for s in history["snapshots"]]
        assert kinds == ["created", "edit", "execution", "transfer"]
        diff = await call(session, "snapshot_diff", from_seq=1)
        assert {c["path"] for c in diff["changes"]} >= {"out.txt", "backup/out.txt"}
        restored = await call(session, "snapshot_restore", seq=1)
        assert restored["kind"] == "restore"
        gone = await session.call_tool("file_read", {"path": "out.txt"})
        assert gone.is_error and "not_found" in gone.content[0].text  # type: ignore[union-attr]

        art = await call(session, "artifact_declare", path="src/main.py", name="program")
        assert art["sha256"] == hashlib.sha256(b"print(42)\n").hexdigest()
        assert [a["name"] for a in (await call(session, "artifact_list"))["artifacts"]] == [
            "program"
        ]

        bad = await session.call_tool("workspace_transfer", {"action": "mirror"})
        assert bad.is_error and "discover, start, list, query, cancel" in bad.content[0].text  # type: ignore[union-attr]
        escape = await session.call_tool("file_read", {"path": "../../etc/passwd"})
        text_of = escape.content[0].text  # type: ignore[union-attr]
        assert escape.is_error and "path_refused" in text_of and "leave the workspace" in text_of
        missing = await session.call_tool(
            "workspace_transfer", {"action": "start", "source_workspace_id": ws}
        )
        assert missing.is_error and "needs paths" in missing.content[0].text  # type: ignore[union-attr]


def test_rest_lists_moves_and_transfers_names_that_are_not_utf8(served_home: Path) -> None:
    """docs/files-and-transfers.md, "Names that are not UTF-8", over REST: a name with a
    byte that is not UTF-8 is listed as the JSON escape ``\\udcNN`` with ``not_utf8`` set,
    the same string names it for a move, and a transfer copies it; never a 500."""
    import httpx

    from shellyard.sdk.client import _home_server

    url, token = _home_server(served_home)
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        made = http.post(
            "/v1/executions",
            json={"command": "mkdir -p n && printf data > n/$(printf 'caf\\351.txt')"},
        )
        assert made.status_code == 200, made.text
        listing = http.get("/v1/files", params={"path": "n"})
        assert listing.status_code == 200, listing.text
        assert b'"n/caf\\udce9.txt"' in listing.content
        [entry] = json.loads(listing.content)["entries"]
        assert entry["path"] == "n/caf\udce9.txt" and entry["not_utf8"] is True
        body = json.dumps({"source": entry["path"], "destination": "m/caf\udce9.txt"})
        moved = http.post(
            "/v1/files/move", content=body, headers={"Content-Type": "application/json"}
        )
        assert moved.status_code == 200, moved.text
        after = json.loads(http.get("/v1/files", params={"path": "m"}).content)
        assert [e["path"] for e in after["entries"]] == ["m/caf\udce9.txt"]
        workspace = made.json()["workspace_id"]
        started = http.post(
            "/v1/transfers",
            json={
                "source_workspace_id": workspace,
                "paths": ["m"],
                "target_workspace_id": workspace,
                "target_folder": "copy",
            },
        )
        assert started.status_code == 200, started.text
        transfer_id = started.json()["transfer_id"]
        done = http.get(f"/v1/transfers/{transfer_id}/wait", params={"timeout_s": 30})
        assert done.status_code == 200 and done.json()["state"] == "completed", done.text
        files = http.get(f"/v1/transfers/{transfer_id}/files")
        assert files.status_code == 200, files.text
        assert "copy/m/caf\udce9.txt" in [
            f["target_path"] for f in json.loads(files.content)["files"]
        ]


def test_rest_sends_a_sha256_header_only_when_it_is_the_real_sha256(served_home: Path) -> None:
    """docs/files-and-transfers.md "Snapshots", over REST: a download of a file holding a
    zero MiB (its content id a chunk list) sends ``X-Shellyard-Content-Id`` and no
    ``X-Shellyard-Sha256`` (before: the chunk-list id under that name), its stat has
    ``sha256: null``; a dense file's download sends both, equal to hashlib's over its body."""
    import httpx

    from shellyard.sdk.client import _home_server

    url, token = _home_server(served_home)
    auth = {"Authorization": f"Bearer {token}"}
    command = (
        "head -c 1048576 /dev/urandom > holey.bin && truncate -s 3M holey.bin"
        " && printf end >> holey.bin && head -c 2097152 /dev/urandom > solid.bin"
    )
    with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
        made = http.post("/v1/executions", json={"command": command, "wait_ms": 30_000})
        assert made.status_code == 200 and made.json()["exit_code"] == 0, made.text
        for name, dense in (("holey.bin", False), ("solid.bin", True)):
            got = http.get("/v1/files/content", params={"path": name})
            assert got.status_code == 200, got.text
            real = hashlib.sha256(got.content).hexdigest()
            stat = http.get("/v1/files/stat", params={"path": name}).json()
            assert got.headers["X-Shellyard-Content-Id"] == stat["content_id"]
            if dense:
                assert got.headers["X-Shellyard-Sha256"] == stat["sha256"] == real
                assert stat["content_id"] == real
            else:
                assert "X-Shellyard-Sha256" not in got.headers, got.headers
                assert stat["sha256"] is None and stat["content_id"] != real
