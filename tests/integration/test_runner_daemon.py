"""The runner daemon (daemon.py) and RemoteRunner (remote.py): a real daemon around a real
LocalRunner, driven through the real client (R1, E9, E10, E6 over the wire)."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from runner_daemon_fixture import RunnerDaemon, running_daemon, start_daemon

from shellyard.errors import (
    InvalidInput,
    NotFound,
    RunnerUnavailable,
    ShellyardError,
    Unauthorized,
    WorkspaceBusy,
)
from shellyard.runner.protocol import (
    MAX_READ_CHUNK,
    Runner,
    RunnerExecState,
    RunnerExecution,
    SandboxPolicy,
    StartRequest,
)
from shellyard.runner.transport.client import RemoteRunner
from shellyard.runner.transport.daemon import READY_PREFIX, load_or_create_token
from shellyard.runner.transport.signing import body_digest, signed_headers

pytestmark = pytest.mark.timeout(120)

POLICY = SandboxPolicy(network="off", cancel_grace_s=1.0)


@pytest.fixture
def runner_root() -> Iterator[Path]:
    """A runner home the sandbox uid can traverse (pytest's tmp_path is 0700 under /tmp)."""
    base = Path(tempfile.mkdtemp(prefix="shellyard-daemon-test-"))
    base.chmod(0o711)
    try:
        yield base / "runner"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def daemon(runner_root: Path) -> AsyncIterator[RunnerDaemon]:
    async with running_daemon(runner_root, POLICY) as d:
        yield d


async def run_to_end(
    runner: Runner, execution_id: str, command: str, ws: str = "ws"
) -> RunnerExecution:
    await runner.ensure_workspace(ws)
    await runner.start(StartRequest(execution_id=execution_id, workspace_id=ws, command=command))
    record = await runner.wait(execution_id, 60)
    assert record.state == RunnerExecState.finished, record
    return record


# --- authentication: signed requests (R4) ---


def signed(
    daemon: RunnerDaemon, path: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """Headers that sign a raw request to ``daemon`` the way RemoteRunner does."""
    headers = signed_headers(daemon.token.encode(), "POST", path, body_digest(body), now=now)
    return {**headers, "Content-Type": "application/json"}


async def test_unsigned_and_wrongly_signed_requests_refused(daemon: RunnerDaemon) -> None:
    """R4: only requests signed with the runner's key pass; the key is never sent."""
    token_file = daemon.root / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert load_or_create_token(token_file) == daemon.token  # created once, then reused

    async with httpx.AsyncClient(base_url=daemon.url) as raw:
        bearer = {"Authorization": f"Bearer {daemon.token}"}  # the old scheme: the key in clear
        for headers in ({}, {"Authorization": "Basic abc"}, bearer):
            r = await raw.post("/v1/info", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"
            assert "signed requests" in r.json()["error"]["message"]
            assert r.headers["www-authenticate"] == "Shellyard-HMAC-SHA256"
        # Every endpoint is guarded, before its body is even looked at.
        for method in ("read_log", "read_file", "start", "wait", "cancel", "commit"):
            assert (await raw.post(f"/v1/{method}", json={})).status_code == 401
        # No interactive docs or schema are served at all.
        for path in ("/docs", "/openapi.json"):
            assert (await raw.get(path)).status_code == 404

    wrong = daemon.client(token=daemon.token + "x")
    try:
        with pytest.raises(Unauthorized, match="bad signature"):
            await wrong.status("e1")
    finally:
        await wrong.aclose()

    info = await daemon.runner.info()
    assert info.sandbox == "bubblewrap"
    assert info.network == "off"


async def test_replayed_stale_and_altered_requests_refused(daemon: RunnerDaemon) -> None:
    """R4: a replayed signed request, a stale timestamp and a body changed in flight are each
    refused; the same request signed afresh passes."""
    await daemon.runner.ensure_workspace("ws")
    body = b'{"execution_id": "e1"}'
    async with httpx.AsyncClient(base_url=daemon.url) as raw:
        headers = signed(daemon, "/v1/status", body)
        first = await raw.post("/v1/status", content=body, headers=headers)
        assert first.status_code == 200 and first.json()["state"] == "lost"
        again = await raw.post("/v1/status", content=body, headers=headers)
        assert again.status_code == 401 and "replayed" in again.json()["error"]["message"]

        old = signed(daemon, "/v1/status", body, now=time.time() - 31)
        stale = await raw.post("/v1/status", content=body, headers=old)
        assert stale.status_code == 401 and "stale" in stale.json()["error"]["message"]
        ahead = signed(daemon, "/v1/status", body, now=time.time() + 31)
        assert (await raw.post("/v1/status", content=body, headers=ahead)).status_code == 401

        # The body changed on the way, its signed digest kept: refused, nothing runs.
        start = b'{"execution_id": "x", "workspace_id": "ws", "command": "true"}'
        evil = b'{"execution_id": "x", "workspace_id": "ws", "command": "touch pwned"}'
        altered = await raw.post(
            "/v1/start", content=evil, headers=signed(daemon, "/v1/start", start)
        )
        assert altered.status_code == 401
        assert "not the one that was signed" in altered.json()["error"]["message"]
        # ...and with a digest of the new body but the old signature: a bad signature.
        forged = {
            **signed(daemon, "/v1/start", start),
            "X-Shellyard-Content-SHA256": body_digest(evil),
        }
        r = await raw.post("/v1/start", content=evil, headers=forged)
        assert r.status_code == 401 and "bad signature" in r.json()["error"]["message"]
        # A signature is for one path: moved to another endpoint it does not verify.
        moved = signed(daemon, "/v1/status", start)
        assert (await raw.post("/v1/start", content=start, headers=moved)).status_code == 401
    assert (await daemon.runner.status("x")).state == RunnerExecState.lost
    assert await daemon.runner.stat_path("ws", None, "pwned") is None


# --- errors cross intact ---


async def test_errors_cross_the_wire_as_the_same_class(daemon: RunnerDaemon) -> None:
    runner = daemon.runner
    with pytest.raises(NotFound, match="no logs for execution nope"):
        await runner.read_log("nope", "stdout", 0, 10)
    with pytest.raises(NotFound):
        await runner.head("no-such-workspace")
    with pytest.raises(InvalidInput, match="invalid execution id"):
        await runner.status("../etc")
    # An unknown execution is not an error for status: the runner reports it lost (E9).
    assert (await runner.status("never-started")).state == RunnerExecState.lost

    # details (here the holder, W1) survive too.
    await runner.ensure_workspace("ws")
    await runner.start(StartRequest(execution_id="long", workspace_id="ws", command="sleep 30"))
    try:
        with pytest.raises(WorkspaceBusy) as busy:
            await runner.start(
                StartRequest(execution_id="second", workspace_id="ws", command="true")
            )
        assert busy.value.details == {"holder": "long"}
        with pytest.raises(WorkspaceBusy):
            await runner.commit("ws")
    finally:
        await runner.cancel("long")
    assert (await runner.wait("long", 30)).cancelled


async def test_bad_request_body_is_invalid_input(daemon: RunnerDaemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url) as raw:
        bad = b'{"execution_id": "e", "offset": "x"}'
        r = await raw.post("/v1/read_log", content=bad, headers=signed(daemon, "/v1/read_log", bad))
        assert r.status_code == 400
        body = r.json()["error"]  # the one envelope of every door (shellyard.errors)
        assert body["code"] == "invalid_input"
        assert "offset" in body["message"] and "stream" in body["message"]
        r = await raw.post("/v1/no_such_method", json={})
        assert r.status_code == 404 and "versions match" in r.json()["error"]["message"]
    with pytest.raises(InvalidInput, match="unknown log stream"):
        await daemon.runner.read_log("e", "stdall", 0, 1)  # type: ignore[arg-type]


# --- executions over the wire ---


async def test_start_wait_and_idempotent_start(daemon: RunnerDaemon) -> None:
    runner = daemon.runner
    await runner.ensure_workspace("ws")
    request = StartRequest(execution_id="e1", workspace_id="ws", command="sleep 2; exit 3")
    first = await runner.start(request)
    assert first.state == RunnerExecState.running
    # E10: the same id again returns the same execution, no second process.
    again = await runner.start(request)
    assert again.execution_id == "e1" and again.started_at == first.started_at

    # A short long-poll returns while it still runs; a long one as soon as it ends.
    t0 = time.monotonic()
    assert (await runner.wait("e1", 0.1)).state == RunnerExecState.running
    assert time.monotonic() - t0 < 5
    done = await runner.wait("e1", 60)
    assert time.monotonic() - t0 < 10
    assert done.state == RunnerExecState.finished and done.exit_code == 3
    assert done.snapshot is not None
    assert await runner.status("e1") == done


async def test_several_mb_log_paged_with_offsets(daemon: RunnerDaemon) -> None:
    size = 5 * MAX_READ_CHUNK + 12345
    line = b"0123456789abcdef\n"
    expected = (line * (size // len(line) + 1))[:size]
    await run_to_end(daemon.runner, "big", f"yes 0123456789abcdef | head -c {size}; echo err >&2")

    assert await daemon.runner.log_size("big", "stdout") == size
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = await daemon.runner.read_log("big", "stdout", offset, 10 * MAX_READ_CHUNK)
        assert chunk.offset == offset
        assert len(chunk.data) <= MAX_READ_CHUNK  # the runner caps a chunk; the client pages
        assert chunk.next_offset == offset + len(chunk.data)
        assert chunk.size == size
        chunks.append(chunk.data)
        offset = chunk.next_offset
        if chunk.complete:
            break
    assert len(chunks) == 6
    assert b"".join(chunks) == expected

    # An offset in the middle and an odd limit; a read past the end is empty and complete.
    middle = await daemon.runner.read_log("big", "stdout", 3 * MAX_READ_CHUNK + 7, 1000)
    assert middle.data == expected[3 * MAX_READ_CHUNK + 7 : 3 * MAX_READ_CHUNK + 1007]
    assert not middle.complete
    end = await daemon.runner.read_log("big", "stdout", size + 100, 10)
    assert end.data == b"" and end.complete
    err = await daemon.runner.read_log("big", "stderr", 0, 100)
    assert err.data == b"err\n" and err.complete


async def test_files_and_snapshots_over_the_wire(daemon: RunnerDaemon) -> None:
    runner = daemon.runner
    payload = bytes(range(256)) * 4096  # every byte value, 1 MiB: raw bytes, not text
    await run_to_end(
        runner,
        "write",
        "mkdir -p d && printf hello > d/a.txt && "
        "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256))*4096)' > bin",
    )
    head = await runner.head("ws")
    assert head.files >= 2

    entry = await runner.stat_path("ws", None, "d/a.txt")
    assert entry is not None and entry.kind == "file" and entry.size == 5
    assert await runner.stat_path("ws", head.seq, "missing") is None

    chunk = await runner.read_file("ws", head.seq, "d/a.txt", 1, 100)
    assert (chunk.data, chunk.offset, chunk.next_offset, chunk.size) == (b"ello", 1, 5, 5)
    data = b""
    offset = 0
    while offset < len(payload):
        c = await runner.read_file("ws", None, "bin", offset, 300_000)
        assert c.size == len(payload) and c.offset == offset
        data += c.data
        offset = c.next_offset
    assert data == payload
    with pytest.raises(ShellyardError):
        await runner.read_file("ws", None, "../outside", 0, 10)

    again = await runner.commit("ws")
    assert again.seq >= head.seq


# --- unavailable daemon (E9) ---


async def test_runner_unavailable_when_nothing_listens(runner_root: Path) -> None:
    daemon = await start_daemon(runner_root, POLICY)
    url, token = daemon.url, daemon.token
    await daemon.stop()
    runner = RemoteRunner(url, token, timeout_s=2)
    try:
        t0 = time.monotonic()
        with pytest.raises(RunnerUnavailable, match="cannot be reached"):
            await runner.status("e1")
        assert time.monotonic() - t0 < 5
        with pytest.raises(RunnerUnavailable):
            await runner.wait("e1", 5)
    finally:
        await runner.aclose()


async def test_gateway_error_without_body_is_runner_unavailable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>Bad Gateway</html>")

    runner = RemoteRunner("http://runner.invalid", "t", transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(RunnerUnavailable, match="HTTP 502"):
            await runner.status("e1")
    finally:
        await runner.aclose()


async def test_daemon_killed_then_restarted(runner_root: Path) -> None:
    """SIGKILL the daemon process during a long poll: the client gets RunnerUnavailable, the
    sandbox keeps running (E11); a new daemon on the same root re-attaches and reports the
    real outcome (R3)."""
    async with running_daemon(runner_root, POLICY, subprocess=True) as daemon:
        runner = daemon.runner
        await runner.ensure_workspace("ws")
        await runner.start(
            StartRequest(
                execution_id="survivor", workspace_id="ws", command="sleep 2; echo done; exit 7"
            )
        )
        waiting = asyncio.create_task(runner.wait("survivor", 60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        daemon.kill()
        with pytest.raises(RunnerUnavailable):
            await waiting
        with pytest.raises(RunnerUnavailable):
            await runner.status("survivor")

        await daemon.restart()
        record = await runner.wait("survivor", 30)  # the same client reconnects
        assert record.state == RunnerExecState.finished
        assert record.exit_code == 7
        assert (await runner.read_log("survivor", "stdout", 0, 100)).data == b"done\n"


async def test_token_file_written_before_first_start(runner_root: Path) -> None:
    runner_root.mkdir(parents=True)
    path = runner_root / "token"
    token = load_or_create_token(path)
    assert len(token) >= 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    path.write_text("")
    with pytest.raises(InvalidInput, match="empty"):
        load_or_create_token(path)


def test_every_protocol_method_has_an_endpoint_and_a_client_method() -> None:
    """R1: the daemon and the client follow the protocol one method to one endpoint, so a
    method added to ``Runner`` without them fails here."""
    from shellyard.runner.transport.daemon import API_PREFIX, create_runner_app

    methods = {
        name
        for name, value in vars(Runner).items()
        if inspect.iscoroutinefunction(value) and not name.startswith("_")
    }
    app = create_runner_app(RemoteRunner("http://unused", "t"), "t")
    routes = {getattr(route, "path", "") for route in app.routes}
    assert {f"{API_PREFIX}/{name}" for name in methods - {"aclose"}} <= routes
    for name in methods:
        remote = inspect.signature(getattr(RemoteRunner, name))
        assert remote == inspect.signature(getattr(Runner, name)), name
    assert isinstance(RemoteRunner("http://unused", "t"), Runner)


async def test_run_runner_daemon_cli_hook(runner_root: Path) -> None:
    """What ``shellyard runner serve`` calls: token file created where asked, network policy
    applied, SIGTERM stops it cleanly."""
    token_file = runner_root.parent / "elsewhere" / "runner.token"
    token_file.parent.mkdir()
    code = (
        "from pathlib import Path; "
        "from shellyard.runner.transport.daemon import run_runner_daemon; "
        f"run_runner_daemon(Path({str(runner_root)!r}), '127.0.0.1', 0, "
        f"Path({str(token_file)!r}), 'off')"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        url = ""
        while not url:
            line = (await asyncio.wait_for(process.stderr.readline(), 30)).decode()
            assert line, "the daemon ended before it was ready"
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX) :].strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert not (runner_root / "token").exists()
        async with RemoteRunner(url, token_file.read_text().strip()) as runner:
            assert (await runner.info()).network == "off"
    finally:
        process.terminate()
        _, rest = await asyncio.wait_for(process.communicate(), 30)
    # uvicorn shuts down gracefully (the LocalRunner closed), then re-raises the signal.
    assert b"Application shutdown complete" in rest
    assert process.returncode in (0, -signal.SIGTERM)
