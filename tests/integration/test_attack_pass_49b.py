"""Attack pass of session 49 (second engineer) on the session's changes (docs/security.md
"Attack pass (session 49, doors and leases)"): ``POST /v1/executions`` answered inside the
body bounds (api/bounds.py, api/run_route.py), SQLite's leases held without rows
(control/replicas/leases.py), the warm pool's 16 places (runner/sandbox/warm.py), and the
supervisor's watch of a started sandbox (runner/sandbox/supervise.py). Each test says whether
it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from local_runner import ended, local_runner, process_tag, tagger
from starlette.requests import ClientDisconnect

from shellyard.control.plane import ControlPlane
from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import RunnerExecState, StartRequest

pytestmark = pytest.mark.timeout(300)

#: other engineers' tests may run beside: every id names this process
TAG = process_tag()
eid = tagger(TAG)
WS = f"ws-atk49b-{TAG}"


@pytest.fixture
async def runner(tmp_path: Path) -> AsyncIterator[LocalRunner]:
    async with local_runner(tmp_path, WS) as local:
        yield local


# ------------------------------------------------ the supervisor's watch (reported bug)


@pytest.mark.parametrize("refusal", [errno.EMFILE, errno.ENOSYS])
async def test_a_sandbox_the_kernel_gives_no_pidfd_of_is_still_watched(
    runner: LocalRunner, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """Finding (fixed): when ``pidfd_open`` failed with anything but ESRCH (EMFILE at the
    descriptor limit, ENOSYS before Linux 5.3) after the sandbox had started, ``launch``
    raised with the workspace left in ``busy_workspaces`` and the sandbox unwatched: the
    start was answered as failed while its command ran, it never ended, and every later
    command of the workspace was refused as busy (E1, E3, E8). Now its end is polled and it
    finishes as any other. The kernel's refusal is injected (at the real descriptor limit
    the spawn's own pipes are refused first; ENOSYS needs an old kernel); the supervisor's
    kill of the sandbox's init (``processes.kill_and_wait``) gets the same refusal."""
    real = os.pidfd_open

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "pidfd_open", refused)
    first = eid(f"nopidfd-{refusal}")
    await runner.start(
        StartRequest(execution_id=first, workspace_id=WS, command="sleep 0.3; echo one > f")
    )
    record = await asyncio.wait_for(ended(runner, first), 60)
    assert (record.state, record.exit_code) == (RunnerExecState.finished, 0), record
    assert WS not in runner._runs.busy_workspaces
    monkeypatch.setattr(os, "pidfd_open", real)
    after = eid(f"nopidfd-after-{refusal}")
    await runner.start(StartRequest(execution_id=after, workspace_id=WS, command="cat f"))
    assert (await ended(runner, after)).exit_code == 0
    assert (runner.workspace_path(WS) / "f").read_text() == "one\n"


# ------------------------------------------------ POST /v1/executions inside the body bounds


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"command": "true", "env": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"command": "true", "env": ' + b'{"a": ' * 990 + b"1" + b"}" * 990 + b"}",
    ],
    ids=["deep-array", "deep-in-an-object", "just-past-the-limit"],
)
async def test_a_body_nested_past_the_parsers_depth_is_a_400_not_a_500(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str], body: bytes
) -> None:
    """Finding (fixed): a JSON body nested deeper than Python's parser goes (~1000 levels,
    well inside the 8 MiB bound) made ``json.loads`` raise RecursionError, not ValueError:
    sent as ``application/json`` it was a 500 in text ("Internal Server Error", the
    exception in the server's log) where the declared route, for the same body with a
    charset, answers 400 invalid_input in the API's error shape (E1). The lean path since
    its first version (session 33, then inside the body bounds since session 49) let it
    through; the server stayed up. Now such a body is left to the declared route."""
    client, _plane, admin = app_plane
    answers = []
    for content_type in ("application/json", "application/json; charset=utf-8"):
        answer = await client.post(
            "/v1/executions",
            content=body,
            headers={"Authorization": f"Bearer {admin}", "Content-Type": content_type},
        )
        answers.append(answer)
    lean, declared = answers
    assert lean.status_code == declared.status_code == 400, (lean.text, declared.text)
    assert lean.json() == declared.json()
    assert lean.json()["error"]["code"] == "invalid_input"
    ran = await client.post(
        "/v1/executions",
        json={"command": "echo alive"},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert ran.json()["stdout"] == "alive\n"


# ------------------------------------------------ SQLite's leases without rows


async def test_an_unknown_execution_is_still_reconciled_after_a_restart_on_sqlite(
    home: Path,
) -> None:
    """Finding (fixed): on SQLite an execution's lease has had no row since session 49, and
    the start-up's claim of unleased work takes only ``running`` executions and queued
    writers. An execution that was ``unknown`` when the server stopped (its runner
    unreachable, E9; here its daemon killed -9 while the start's answer was on its way) was
    adopted before by its lease row, watched, and reconciled once the runner answered
    (R3); without the row nobody watched it again: ``unknown`` for ever with its workspace's
    writer held, every later command of the agent refused as busy (E2, E3, E11). The plane
    is stopped cleanly here (a kill -9 leaves the same rows: none)."""
    from daemon_outage import held_start, killed_on_it, outage_yard

    from conftest import open_yard
    from shellyard.contract.executions import ExecutionState, RunShellRequest

    plane, daemon, remote = await outage_yard(home)
    try:
        # the daemon holds the start's answer
        result = await killed_on_it(daemon, await held_start(plane, remote))
        await plane.aclose()
        await daemon.restart()
        plane, _, _ = await open_yard(home, "local")
        deadline = time.monotonic() + 60
        view = await plane.executions.status(result.execution_id)
        while view.state == ExecutionState.unknown and view.finished_at is None:
            assert time.monotonic() < deadline, f"never reconciled after the restart: {view}"
            await asyncio.sleep(0.1)
            view = await plane.executions.status(result.execution_id)
        assert (view.state, view.exit_code, view.was_unknown) == (ExecutionState.completed, 4, True)
        again = await plane.executions.run_shell(
            RunShellRequest(command="cat runs.txt", runner_id="remote")
        )
        assert (again.state, again.stdout) == (ExecutionState.completed, "run\n")  # E10: once
    finally:
        await plane.aclose()
        await daemon.stop()


async def _asgi_post(app: Any, headers: list[tuple[bytes, bytes]], pieces: list[Any]) -> Any:
    """POST /v1/executions straight into the ASGI app, its body in ``pieces`` (each one
    ``http.request`` message; ``None``: the client goes away there). (status, body)."""
    messages: list[Any] = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        if piece is not None
        else {"type": "http.disconnect"}
        for i, piece in enumerate(pieces)
    ]
    sent: list[Any] = []

    async def receive() -> Any:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(3600)  # no more from this client

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/executions", "raw_path": b"/v1/executions",
        "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), 60)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return (start["status"] if start else None), body


async def test_the_lean_answer_keeps_every_check_of_the_route(
    app_plane: tuple[httpx.AsyncClient, ControlPlane, str],
) -> None:
    """Held (E4, docs/web.md): the lean answer inside the body bounds gives, for each attack,
    the answer the declared route gives the same request (sent with a charset, which the lean
    path leaves to it): the web login's cookie without its CSRF header 403; with it, as
    before, runs for its own session's agent only; another session's token naming our agent
    403; odd paths (a trailing slash 307, a doubled slash 404), HEAD and OPTIONS 405 with no
    run; a chunked body in a message per byte runs once; a client gone mid-body runs
    nothing."""
    client, _plane, admin = app_plane
    bearer = {"Authorization": f"Bearer {admin}"}
    one = (await client.post("/v1/sessions", headers=bearer)).json()
    two = (await client.post("/v1/sessions", headers=bearer)).json()
    tokens = []
    for session in (one, two):
        made = await client.post(
            "/v1/tokens", json={"kind": "session", "session_id": session["session_id"]},
            headers=bearer,
        )  # fmt: skip
        tokens.append(made.json()["token"])
    login = await client.post(
        "/v1/auth/login", json={"token": tokens[0]}, headers={"X-Shellyard-CSRF": "1"}
    )
    assert login.status_code == 200, login.text
    csrf = login.json()["csrf"]
    cookie = login.headers["set-cookie"].split(";")[0]
    client.cookies.clear()  # sent by hand below
    body = b'{"command": "echo ran >> runs.txt"}'
    cases = [
        ({"Cookie": cookie}, 403, None),
        ({"Cookie": cookie, "X-Shellyard-CSRF": "0" * 40}, 403, None),
        ({"Cookie": cookie, "X-Shellyard-CSRF": csrf}, 200, one["main_agent_id"]),
        ({"Cookie": cookie, "X-Shellyard-CSRF": csrf, "X-Shellyard-Agent": two["main_agent_id"]},
         403, None),
        ({"Authorization": f"Bearer {tokens[1]}", "X-Shellyard-Agent": one["main_agent_id"]},
         403, None),
        ({"Authorization": "Bearer sy_nope", "Cookie": cookie, "X-Shellyard-CSRF": csrf}, 401,
         None),
    ]  # fmt: skip
    for headers, status, agent in cases:
        answers = [
            await client.post(
                "/v1/executions", content=body, headers={**headers, "Content-Type": kind}
            )
            for kind in ("application/json", "application/json; charset=utf-8")
        ]
        lean, declared = answers
        assert lean.status_code == declared.status_code == status, (headers, lean.text)
        if status == 200:
            assert lean.json()["agent_id"] == declared.json()["agent_id"] == agent
        else:
            assert lean.json() == declared.json()
    for method, path, status in [
        ("POST", "/v1/executions/", 307),
        ("POST", "//v1/executions", 404),
        ("HEAD", "/v1/executions", 405),
        ("OPTIONS", "/v1/executions", 405),
    ]:
        odd = await client.request(
            method, path, content=body, headers={**bearer, "Content-Type": "application/json"}
        )
        assert odd.status_code == status, (method, path, odd.text)
    app = client._transport.app  # type: ignore[attr-defined]
    heads = [
        (b"authorization", f"Bearer {tokens[0]}".encode()),
        (b"content-type", b"application/json"),
        (b"transfer-encoding", b"chunked"),
    ]
    status, answer = await _asgi_post(app, heads, [bytes([byte]) for byte in body])
    assert status == 200, answer
    # the declared route reads the replayed disconnect, as before session 49: Starlette's
    # ClientDisconnect, which uvicorn drops (nothing answered, nothing run)
    with pytest.raises(ClientDisconnect):
        await _asgi_post(app, heads, [body[:9], None])
    ran = await client.post(
        "/v1/executions",
        json={"command": "cat runs.txt"},
        headers={"Authorization": f"Bearer {tokens[0]}"},
    )
    # the cookie's two runs (lean, declared) and the chunked one, each once
    assert ran.json()["stdout"] == "ran\n" * 3
