"""Attack pass of session 47 (second engineer) on the session's fixes (docs/security.md
"Attack pass (session 47)"): the HTTP server's unsupported ``Upgrade`` replayed to llhttp
and its body's time bounds (api/connections.py), ``shellyard mcp``'s wait for the answers
owed at stdin's end (mcp/stdio.py), and E13's end of input riding in the last data's FIFO
write (runner/sandbox/terminal.py).

From outside, through the doors a client has: raw sockets against a real ``shellyard serve``
(its own process and home), ``shellyard mcp`` as an agent host starts it. Each test says
whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from raw_http import answers, connect, received
from served_server import Served, served_server

from conftest import Yard
from shellyard.contract.executions import ExecutionLogsQuery, ExecutionWait
from shellyard.contract.interactive import ExecutionInputRequest
from shellyard.home import is_served, read_info
from shellyard.runner.sandbox.terminal import FRAME_DATA, PIPE_BUF

pytestmark = pytest.mark.timeout(300)

HOST = b"Host: 127.0.0.1\r\n"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_server() as server:
        yield server


@pytest.mark.parametrize("connection", [b"Upgrade, close", b"close, upgrade"])
def test_an_ignored_upgrade_that_asks_to_close_is_answered(
    served: Served, connection: bytes
) -> None:
    """Finding: ``Connection: Upgrade, close`` with ``Upgrade: h2c`` was never answered (a 408
    for slow headers 10 s later): llhttp ends the upgrade request's message, and with
    ``close`` its parser drops what follows (uvicorn's leniency for data after close), so
    the request replayed without its upgrade went nowhere. Now it is answered, then closed."""
    sock = connect(served)
    try:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\n" + HOST + b"Connection: " + connection + b"\r\n"
            b"Upgrade: h2c\r\n\r\n"
        )  # fmt: skip
        answer, closed = received(sock, 5)
    finally:
        sock.close()
    assert answers(answer) == [b"HTTP/1.1 200 OK"] and closed, answer


#: Input sizes at the FIFO's edges: the end of input rides in the last data's write up to
#: PIPE_BUF bytes (data of FRAME_DATA - 5 and less), goes alone just past it, and after a
#: full frame; none (the end of input alone); two frames and a piece.
EDGES = [0, 1, PIPE_BUF - 10, PIPE_BUF - 9, FRAME_DATA, FRAME_DATA + 1, 2 * FRAME_DATA + 3]


@pytest.mark.runner_kinds("local")
async def test_input_and_its_end_in_one_send_reach_the_program_whole(yard: Yard) -> None:
    """Held: each size at the FIFO's edges, sent with its end of input in one
    ``execution_input``, reaches ``wc -c`` whole and ends it; the bytes accepted are the
    bytes sent and the stdin log stream has them (E13)."""
    for size in EDGES:
        ran = await yard.run("wc -c", interactive=True, wait_ms=0)
        request = ExecutionInputRequest(text="x" * size if size else None, eof=True)
        sent = await yard.plane.executions.send_input(ran.execution_id, request, None)
        assert sent.accepted_bytes == size
        for _ in range(6):
            view = await yard.plane.executions.wait(ran.execution_id, ExecutionWait(timeout_s=10))
            if view.state.terminal:
                break
        assert view.exit_code == 0, (size, view)
        logs = await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())
        assert logs.data.strip() == str(size), size
        typed = await yard.plane.executions.logs(
            ran.execution_id, ExecutionLogsQuery(stream="stdin")
        )
        assert len(typed.data) == size


INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "attack", "version": "1"},
}


def lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(message).encode() + b"\n" for message in messages)


def call(number: int, **arguments: Any) -> dict[str, Any]:
    params = {"name": "run_shell", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}


#: More calls in flight than the MCP server's client opens connections to the control plane at
#: once (httpx's pool: 100), each answering at its wait's end: the last ones begin their wait
#: only when the first ones end.
QUEUED = 130


@pytest.mark.parametrize("stdin_kind", ["pipe", "file"])
def test_calls_in_flight_past_the_clients_pool_are_answered_after_stdins_end(
    home: Path, stdin_kind: str
) -> None:
    """Finding: a host that sent 130 ``run_shell`` calls (each waiting 20 s in line behind a
    running command) and closed stdin lost 30 answers (``Connection closed``): the wait for
    the answers owed ended EOF_WAIT_S after stdin's end, on the premise that every call
    answers within its ``wait_ms`` of it; the calls past the client's 100 connections began
    their wait 20 s late. Now the wait ends EOF_WAIT_S after stdin's end or the last answer,
    whichever is later: calls that keep answering are waited for. Both ways stdin is read:
    a pipe (the loop's transports) and a file (the package's threads)."""
    env = {**os.environ, "SHELLYARD_HOME": str(home)}
    command = [sys.executable, "-m", "shellyard", "mcp", "--home", str(home)]
    first = lines(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        call(2, command="sleep 300", wait_ms=0),
    )
    queued = lines(
        *(call(10 + n, command="true", wait_ms=20_000, queue=True) for n in range(QUEUED))
    )
    try:
        if stdin_kind == "pipe":
            mcp = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            assert mcp.stdin is not None and mcp.stdout is not None
            mcp.stdin.write(first)
            mcp.stdin.flush()
            started = [json.loads(mcp.stdout.readline()) for _ in range(2)]
            assert [answer["id"] for answer in started] == [1, 2], started
            mcp.stdin.write(queued)
            mcp.stdin.close()
            out = mcp.stdout.read()
            mcp.wait(timeout=60)
            mcp.stdout.close()
        else:
            requests = home / "requests.jsonl"
            requests.write_bytes(first + queued)
            with requests.open("rb") as stdin:
                done = subprocess.run(
                    command, stdin=stdin, capture_output=True, env=env, timeout=300
                )
            out = done.stdout
    finally:
        info = read_info(home)
        if info is not None and is_served(home):
            os.kill(info.pid, signal.SIGTERM)
    answers = {answer["id"]: answer for answer in map(json.loads, out.splitlines())}
    lost = [n for n, answer in answers.items() if "error" in answer]
    states = [
        answer["result"]["structuredContent"]["state"]
        for n, answer in answers.items()
        if n >= 10 and "result" in answer
    ]
    assert not lost and states == ["queued"] * QUEUED, (lost, answers.get(lost[0] if lost else 0))


@pytest.mark.runner_kinds("local")
async def test_a_sandbox_cannot_raise_its_scheduling(yard: Yard) -> None:
    """Held: a sandboxed command (and its children) cannot take a realtime policy (FIFO,
    RR: no capability, RLIMIT_RTPRIO 0) nor a nice below 0 (RLIMIT_NICE 0), and once it
    lowers itself to SCHED_IDLE it cannot come back: what it may change only yields the CPU
    to others (sched(7)). Its policy between SCHED_OTHER and SCHED_BATCH is its own to pick:
    the kernel lets any process move between the two, and neither preempts the host more."""
    ran = await yard.run(
        "for policy in -f -r; do chrt $policy -p 10 $$ 2>/dev/null && echo realtime; done; "
        "sh -c 'chrt -f -p 10 $$' 2>/dev/null && echo child-realtime; "
        "renice -n -1 -p $$ >/dev/null 2>&1 && echo niced; "
        "chrt -i -p 0 $$ && echo idle; chrt -o -p 0 $$ 2>/dev/null && echo back; "
        "chrt -p $$ | head -1",
        wait_ms=20_000,
    )
    logs = await yard.plane.executions.logs(ran.execution_id, ExecutionLogsQuery())
    said = logs.data.splitlines()
    assert said[:1] == ["idle"] and len(said) == 2 and said[1].endswith("SCHED_IDLE"), said
