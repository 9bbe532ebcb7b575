"""Attack pass of session 49 (second engineer) on the SDK's bounds on a JSON answer
(sdk/bounds.py: at most ``max_json_bytes``, within ``timeout_s`` plus a second per 64 KiB),
``shellyard run``'s fast path, and the watcher of a start whose answer never came
(control/executions/unstarted.py, E9-E11) with a real runner daemon (docs/security.md "Attack
pass (session 49)").

Each hostile server here is a real loopback socket answering with the raw bytes the attack
needs (the SDK may be pointed at any URL a user gives, and ``http://`` has no integrity). Each
test says whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemon_outage import (
    closed_while_unknown,
    held_start,
    held_start_ran_once,
    killed_on_it,
    outage_yard,
    until,
)
from proc_memory import peak_resident, reset_peak, resident
from pydantic import TypeAdapter
from runner_daemon_fixture import start_daemon
from sdk_paths import chunked, on_every_path, port_of, serving, wakes_on_both

from conftest import POSTGRES_URL, open_yard
from shellyard.cli import entry
from shellyard.cli.exits import exit_code_of
from shellyard.config import Settings
from shellyard.contract.executions import ExecutionState, RunShellRequest
from shellyard.control.plane import build
from shellyard.errors import AnswerLost, RunnerUnavailable, ShellyardError
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.transport.client import RemoteRunner
from shellyard.sdk import sessions
from shellyard.sdk.base import call
from shellyard.sdk.client import AsyncClient, Client

pytestmark = pytest.mark.timeout(300)

ANY = TypeAdapter(dict[str, Any])
#: an empty, not final, deflate stored block (what a sync flush ends with): decodes to nothing
EMPTY_BLOCK = b"\x00\x00\x00\xff\xff"


async def test_framing_dripped_without_body_does_not_earn_the_answer_time() -> None:
    """Finding (fixed): the httpx paths (blocking ``Client``, the async client on https or a
    foreign loop) counted every byte off the wire as the answer's progress, the lean path
    only bytes of body. A chunked answer whose chunks carry 16 KB extensions and one byte of
    body each, 160 KB/s on the wire (above the 64 KiB/s that earns time) and ~10 bytes of
    body a second, earned more time than it spent: it was never cut, and its body would reach
    the size bound after years. Here it lasts 4 s (40 pieces 0.1 s apart) to a call of
    ``timeout_s`` 0.5: before the fix both httpx paths answered after the whole drip; now
    every path fails with the clock's message."""

    async def framing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b'{"'))
        for _ in range(40):
            writer.write(b"1;x=" + b"e" * 16000 + b"\r\nz\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(chunked(b'":1}') + b"0\r\n\r\n")
        await writer.drain()

    async with serving(framing) as url:
        outcomes = await on_every_path(url, call("GET", "/v1/x", ANY, timeout_s=0.5))
    for outcome in outcomes:
        assert isinstance(outcome, RunnerUnavailable), outcome
        assert "did not complete within 0.5 s" in str(outcome)


async def test_empty_deflate_blocks_do_not_earn_the_answer_time() -> None:
    """Finding (fixed), the same through ``Content-Encoding: gzip`` (httpx asks for it and
    decodes it): empty stored blocks (5 bytes each, no output) at 160 KB/s earned the answer
    time without a byte of body. Before the fix both httpx paths answered ``{"a": 1}`` after
    the 4 s drip; now they fail at the clock. The lean client neither asks for nor decodes a
    coding: its answer is not JSON, an error either way."""

    async def empty_blocks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gzip = zlib.compressobj(wbits=31)
        start = gzip.compress(b'{"a": 1}') + gzip.flush(zlib.Z_SYNC_FLUSH)
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-encoding: gzip\r\n\r\n"
        writer.write(head + chunked(start))
        for _ in range(40):
            writer.write(chunked(EMPTY_BLOCK * 3200))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(chunked(gzip.flush()) + b"0\r\n\r\n")
        await writer.drain()

    async with serving(empty_blocks) as url:
        outcomes = await on_every_path(url, call("GET", "/v1/x", ANY, timeout_s=0.5))
    assert not isinstance(outcomes[0], dict), outcomes[0]
    for outcome in outcomes[1:]:
        assert isinstance(outcome, RunnerUnavailable), outcome
        assert "did not complete within 0.5 s" in str(outcome)


async def test_a_gzip_bomb_is_bounded_on_its_decoded_bytes() -> None:
    """Held: httpx decodes gzip, and the bound is on the decoded body, so 1 GiB of zeros in
    ~1 MiB of gzip fails at ``max_json_bytes`` (32 MiB here) naming it, and the peak RSS grows
    by the bound plus one inflated read (a 64 KiB read of zeros inflates to 64 MiB, zlib's
    output buffer up to twice that: 194 MiB measured, both paths), never by the 1 GiB."""
    gzip = zlib.compressobj(9, wbits=31)
    block = b"0" * (1 << 20)
    bomb = gzip.compress(b'{"x": "') + b"".join(gzip.compress(block) for _ in range(1024))
    bomb += gzip.compress(b'"}') + gzip.flush()

    async def bombing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = f"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: {len(bomb)}\r\n"
        writer.write(head.encode() + b"\r\n" + bomb)
        await writer.drain()

    async with serving(bombing) as url:
        reset_peak()
        base = resident()
        outcomes: list[Any] = []
        async with AsyncClient(url, "tok") as client:
            client._lean = None  # the async httpx path (the lean client asks for no coding)
            client.max_json_bytes = 32 << 20
            try:
                outcomes.append(await client._send(call("GET", "/v1/x", ANY)))
            except Exception as exc:
                outcomes.append(exc)

        def blocking() -> Any:
            with Client(url, "tok") as client:
                client.max_json_bytes = 32 << 20
                try:
                    return client._send(call("GET", "/v1/x", ANY))
                except Exception as exc:
                    return exc

        outcomes.append(await asyncio.to_thread(blocking))
        growth = peak_resident() - base
    for outcome in outcomes:
        assert isinstance(outcome, ShellyardError), outcome
        assert "passed 33,554,432 bytes" in str(outcome)
    assert growth < 320 << 20, f"peak RSS grew {growth >> 20} MiB"


async def test_the_fast_run_path_fails_clearly_on_a_cut_or_bad_answer() -> None:
    """``shellyard run``'s own socket (cli/entry.py): an answer that closes mid-chunk, one
    shorter than its ``Content-Length``, and a chunk size that is not hex each end in the
    SDK's "cut or not HTTP" error (RunnerUnavailable, shown as one line by ``say_error``),
    never a ValueError's traceback nor a truncated body handed to the JSON parser."""
    answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b'{"a": 1') + b"5\r\nab",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b'{"a": 1}'),
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b'HTTP/1.1 200 OK\r\ncontent-length: 40\r\n\r\n{"a": 1}',
    ]
    for answer in answers:

        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(answer)  # noqa: B023 - served before the loop moves on
            await writer.drain()
            writer.close()

        async with serving(cut) as url:
            port = port_of(url)
            request = b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
            with pytest.raises(RunnerUnavailable, match="cut or not HTTP"):
                await asyncio.to_thread(entry._exchange, "127.0.0.1", port, request, 5)


@pytest.mark.parametrize("shape", ["endless line", "endless event"])
async def test_the_wake_stream_bounds_one_event(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding (fixed): the wake stream (server-sent events, no read timeout: it waits for
    wakes) read lines whole through httpx and gathered an event's lines until its blank line,
    without a bound: a ``data:`` line without end, or ``data:`` lines without the blank line,
    grew the client's memory for ever (and each ``data`` line copied the event so far). Now
    an event has a JSON answer's bound (sessions.MAX_EVENT_BYTES, 4 MiB here): 48 MiB of
    either fails on the blocking and async clients naming the bound, the peak RSS grows by a
    few times the bound. (Before: both clients read all 48 MiB and ended with no error; the
    two cases took 126 s together, the endless event's copies most of it.)"""
    monkeypatch.setattr(sessions, "MAX_EVENT_BYTES", 4 << 20, raising=False)
    piece = b"x" * (1 << 20) if shape == "endless line" else b"data: " + b"x" * 16384 + b"\n"

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        writer.write(head + b"transfer-encoding: chunked\r\n\r\n" + chunked(b"data: "))
        for _ in range((48 << 20) // len(piece)):
            writer.write(chunked(piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with serving(endless) as url:
        reset_peak()
        base = resident()
        outcomes = await wakes_on_both(url)
        growth = peak_resident() - base
    for outcome in outcomes:
        assert isinstance(outcome, ShellyardError), outcome
        assert "passed 4,194,304 bytes" in str(outcome)
    assert growth < 64 << 20, f"peak RSS grew {growth >> 20} MiB"


async def test_a_start_timed_out_on_a_stopped_daemon_runs_once_and_reads_so(home: Path) -> None:
    """Held (E9/E10): the daemon is stopped (SIGSTOP) so the start waits unread in its socket
    and the plane's start call times out (1.5 s here): unknown at once. The watcher's
    questions queue behind the start; resumed (SIGCONT), the daemon takes the start first
    (uvicorn accepts and reads in arrival order; ``LocalRunner.start`` makes the folder before
    its first await), so the watcher never reads "no trace" for a start still to come: the
    record is completed, the command ran once."""
    plane, daemon, remote = await outage_yard(home)
    try:
        remote._slow = httpx.Timeout(1.5, connect=1.5)
        assert daemon.process is not None
        os.kill(daemon.process.pid, signal.SIGSTOP)
        request = RunShellRequest(
            command="echo run >> runs.txt", runner_id="remote", background=True
        )
        result = await plane.executions.run_shell(request)
        assert result.state == ExecutionState.unknown
        await asyncio.sleep(3)  # the watcher asks twice meanwhile, unanswered
        os.kill(daemon.process.pid, signal.SIGCONT)
        done = {ExecutionState.completed, ExecutionState.failed}
        view = await until(plane, result.execution_id, done)
        assert view.state == ExecutionState.completed and view.was_unknown, view
        remote._slow = httpx.Timeout(60, connect=10)
        after = await plane.executions.run_shell(
            RunShellRequest(command="cat runs.txt", runner_id="remote")
        )
        assert after.stdout == "run\n"
    finally:
        await plane.aclose()
        await daemon.stop()


async def test_a_plane_restarted_in_the_unknown_window_keeps_asking(home: Path) -> None:
    """Held (E11): the daemon dies while it holds a started command's answer, the plane is
    closed while the record is unknown, the daemon comes back, and a new plane on the same
    home picks the record up from the store (unknown, no start time: the start still to be
    confirmed), asks the runner and records the real end once (exit 4, ran once)."""
    daemon, execution_id = await closed_while_unknown(home)
    await daemon.restart()
    again, _, _ = await open_yard(home, "local")
    try:
        await held_start_ran_once(again, execution_id, again)
    finally:
        await again.aclose()
        await daemon.stop()


async def test_two_planes_on_postgresql_resolve_an_unknown_start_once(
    home: Path, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held (E9-E11, replicas): two planes on one PostgreSQL schema, the daemon killed -9
    while it holds plane A's started command's answer; back, both planes run their lease
    rounds (1 s leases here) while A's watcher asks: the record ends completed with the
    command's exit code, the command ran once, and no watcher started it again."""
    monkeypatch.setenv("SHELLYARD_LEASE_TTL_S", "1")
    planes = []
    for name in ("a", "b"):
        settings = Settings(home=home / name, local_policy=SandboxPolicy())
        settings.database_url, settings.database_schema = POSTGRES_URL, pg_schema
        planes.append(await build(settings))
    a, b = planes
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    try:
        await a.runners.add_direct("remote", daemon.url, daemon.token)
        warm = await a.executions.run_shell(RunShellRequest(command="true", runner_id="remote"))
        assert warm.state == ExecutionState.completed
        remote = a.runners.get("remote")
        assert isinstance(remote, RemoteRunner)
        result = await killed_on_it(daemon, await held_start(a, remote))
        await asyncio.sleep(3)  # leases renewed and claimed meanwhile, the runner away
        await daemon.restart()
        await held_start_ran_once(b, result.execution_id, a)
    finally:
        for plane in planes:
            await plane.aclose()
        await daemon.stop()


async def test_a_post_cut_by_its_clock_does_not_advise_sending_it_again() -> None:
    """Finding (fixed): an answer cut by its whole-answer clock came after the request was
    sent whole, so a POST (``run_shell``: the command runs) may have taken effect; the error
    said "retry", and a caller following it (a new call, no idempotency key) ran the command
    twice. Now a POST's error says the server may have acted on it and how to look first, on
    every path and on ``shellyard run``'s fast path, and is ``AnswerLost``, exit code 124 (the
    outcome unknown; it was 75, "try again later"); a GET's still says retry (75)."""
    body = json.dumps({"x": "y" * 150}).encode()
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode()

    async def dripping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for byte in body:
            await asyncio.sleep(0.05)
            writer.write(bytes([byte]))
            await writer.drain()

    async with serving(dripping) as url:
        posts = await on_every_path(url, call("POST", "/v1/executions", ANY, timeout_s=0.5))
        gets = await on_every_path(url, call("GET", "/v1/x", ANY, timeout_s=0.5))
        port = port_of(url)
        request = b"POST /v1/executions HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
        with pytest.raises(RunnerUnavailable) as fast:
            await asyncio.to_thread(entry._exchange, "127.0.0.1", port, request, 0.5)
    for outcome in [*posts, fast.value]:
        assert isinstance(outcome, AnswerLost), outcome
        assert "may have acted on this POST" in str(outcome) and "retry" not in str(outcome)
        # the CLI's exit code says "unknown" (as run's 124), not 75's "try again later"
        assert exit_code_of(outcome) == 124, outcome
    for outcome in gets:
        assert isinstance(outcome, RunnerUnavailable) and "retry" in str(outcome), outcome
        assert not isinstance(outcome, AnswerLost) and exit_code_of(outcome) == 75, outcome
