"""Attack pass of session 51 (second engineer) on the fixes of session 51: a transfer's lease
let go in the transaction that makes it final (store/files.py ``finish_transfer``,
control/files/transfers.py ``_finish``), and a POST's broken connection as ``AnswerLost`` on
the SDK's paths (sdk/base.py ``_failed``) (docs/security.md "Attack pass (session 51)").

The hostile servers are real loopback sockets doing what each attack needs. Each test says
whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from sdk_paths import on_every_path
from store_records import running_transfer

from conftest import POSTGRES_URL
from shellyard.cli import entry
from shellyard.cli.exits import exit_code_of
from shellyard.errors import AnswerLost, RunnerUnavailable, ShellyardError
from shellyard.home import ensure_server, read_info
from shellyard.sdk.base import call
from shellyard.store import Store

pytestmark = pytest.mark.timeout(120)

ANY = TypeAdapter(dict[str, Any])
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

#: A request body far past what the sockets' buffers hold: its send is still going when the
#: server resets the connection, so the request never goes whole.
_BIG = 16 << 20


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0): what the client's next write and read meet."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def resetting_after_the_head() -> AsyncIterator[int]:
    """A loopback server that reads a request's head and a few bytes, then resets the
    connection: a request with a large body is refused half-sent; its port."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            await reader.read(1000)
        _reset(writer)

    listening = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with listening:
        yield int(listening.sockets[0].getsockname()[1])


async def test_a_post_reset_before_it_went_whole_is_retryable_on_every_path() -> None:
    """Finding (fixed): a POST whose send the server cut with a reset before the request went
    whole (a large body; a proxy or a server refusing it half-read) cannot have acted, and the
    lean path and ``shellyard run``'s fast path say "cannot reach ... retry" (exit 75). Since
    session 51's ``_failed`` the async httpx path and the blocking ``Client`` said
    ``AnswerLost`` (124, "the server may have acted"): httpcore suppresses the failed write
    and reads, and the read's reset or "Server disconnected" read as a break after the POST
    went whole. Now a failed write marks the call's clock (sdk/wire.py) and ``_failed`` keeps
    such a break retryable: the same break, the same exit code, on every path."""
    request = call("POST", "/v1/executions", ANY, body={"command": "x" * _BIG})
    async with resetting_after_the_head() as port:
        outcomes = await on_every_path(f"http://127.0.0.1:{port}", request)
        head = f"POST /v1/executions HTTP/1.1\r\ncontent-length: {_BIG}\r\n\r\n".encode()
        try:
            await asyncio.to_thread(entry._exchange, "127.0.0.1", port, head + b"x" * _BIG, 5)
        except ShellyardError as exc:
            outcomes.append(exc)
    paths = ("lean", "async httpx", "blocking", "fast run")
    for path, outcome in zip(paths, outcomes, strict=True):
        assert isinstance(outcome, RunnerUnavailable), (path, outcome)
        assert not isinstance(outcome, AnswerLost), (path, outcome)
        assert exit_code_of(outcome) == 75 and "retry" in str(outcome), (path, outcome)


async def _blocked_by(pid: int) -> int:
    """Sessions waiting, directly or behind another waiter, for a lock the session ``pid``
    holds (the second end waits for the first's locks on the transfer's files)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity "
            "WHERE cardinality(pg_blocking_pids(pid)) > 0"
        )
        waits = {int(row[0]): set(row[1]) for row in await cursor.fetchall()}
    behind, grew = {pid}, True
    while grew:
        more = {waiter for waiter, blockers in waits.items() if blockers & behind}
        grew = not more <= behind
        behind |= more
    return len(behind) - 1


async def test_a_transfer_finished_by_two_replicas_at_once_is_finished_once(
    pg_schema: str,
) -> None:
    """Finding (fixed): ``finish_transfer`` (store/files.py) read the transfer, then updated
    it unconditionally. Two replicas finishing it at once (the copying one, stalled past its
    lease, ends its copy as ``completed`` while another, whose ``cancel`` took the expired
    lease, ends it ``cancelled``: T3, control/files/transfers.py ``cancel``) both read it
    running on PostgreSQL (READ COMMITTED): both "finished" it, the second's state over the
    first's, and both posted their end (a ``completed`` notice for a cancelled transfer).
    Here a third session holds the row's lock so that both are in flight together, as a
    slower commit would. Now the row is read ``FOR UPDATE``: the second finds it final (None),
    as a finished execution's is (``_updated``)."""
    import psycopg

    replica_a = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    replica_b = await Store.open(POSTGRES_URL, schema_name=pg_schema)
    try:
        await running_transfer(replica_a, "tr_race")
        locker = await psycopg.AsyncConnection.connect(POSTGRES_URL)
        try:
            await locker.execute(
                f'SELECT id FROM "{pg_schema}".transfers WHERE id = %s FOR UPDATE',
                ("tr_race",),
            )
            pid = locker.info.backend_pid
            ends = asyncio.gather(
                replica_a.finish_transfer("tr_race", "completed", None, "not copied"),
                replica_b.finish_transfer("tr_race", "cancelled", None, "cancelled"),
            )
            waiting = 0
            for _ in range(600):  # both in flight: each waits for the lock
                waiting = await _blocked_by(pid)
                if waiting >= 2:
                    break
                await asyncio.sleep(0.05)
            assert waiting == 2, "the two ends never waited together"
            await locker.commit()
        finally:
            await locker.close()
        first, second = await ends
        finals = [f for f in (first, second) if f is not None]
        assert len(finals) == 1, [(f.state if f else None) for f in (first, second)]
        row = await replica_a.get_transfer("tr_race")
        assert row is not None and row.state == finals[0].state
        assert row.files_skipped == 1, row
    finally:
        await replica_a.close()
        await replica_b.close()


@pytest.mark.parametrize("path", ["fast", "sdk"])
def test_a_run_whose_following_breaks_is_an_outcome_unknown(served_home: Path, path: str) -> None:
    """Finding (fixed): ``shellyard run`` whose command outlives ``--wait-ms`` follows it with
    GETs (cli/executions.py ``finish_run``, on the fast path and the SDK path alike). The
    server killed then (kill -9, E11 keeps the command running) made the follow's GET
    "cannot reach the control plane ... retry", exit 75: a script retrying on 75 ran the
    command a second time, while the same kill before the POST's answer is exit 124 since
    session 51. The command was started: now a break while following is ``AnswerLost``
    (124), naming the execution to look at first."""
    ensure_server(served_home)
    info = read_info(served_home)
    assert info is not None
    # ``--cwd`` is not the fast path's: the typer verb posts through the SDK.
    extra = [] if path == "fast" else ["--cwd", "."]
    words = ["run", "--wait-ms", "200", *extra, "--", "sh", "-c", "echo started; sleep 6"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "shellyard", *words],
        env={**os.environ, "SHELLYARD_HOME": str(served_home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert cli.stdout is not None
        assert cli.stdout.readline() == "started\n"  # followed live: past the POST's answer
        os.kill(info.pid, signal.SIGKILL)
        _out, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 124, err
    assert "answer_lost" in err and "ex_" in err and "retry" not in err, err
