"""V5 through the REST door when a start's answer never came (E9, E10, R3): a real control plane
and a real runner daemon (a process of its own), an execution on an environment whose start is
on the daemon when it is killed -9. Whether the command runs is then not known, so the
environment stays held: an install waits (``waiting``, naming the execution in ``waiting_for``)
instead of swapping the prefix under a command that may be running, and proceeds once the
runner is back and the execution resolved.

Between the plane and the daemon is a relay standing for the network to the runner's host
(``Outage``). Once the daemon is dead it refuses a new start (as a dead daemon's port does) and
holds every other question unanswered (as a black-holed route does): the watcher's first
question about the start then stays pending for its whole timeout, which is the moment an
install can come before any question failed. A plain kill (every question refused at once)
would count a failed question within milliseconds and hide that window; ``_holders`` counts
such a record from its start (store/environments.py, since ecd3e03)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from env_fixtures import host_prefix, make_slow_sdist, make_wheel
from runner_daemon_fixture import RunnerDaemon, start_daemon

from conftest import open_yard
from shellyard.api.app import create_app
from shellyard.control.plane import ControlPlane
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.transport.client import RemoteRunner

pytestmark = pytest.mark.timeout(240)

ENDED = {"completed", "failed", "cancelled"}


@dataclass
class Outage:
    """A TCP relay from the plane to the daemon's port; ``cut()`` makes it the dead host's
    network (see the module's text), ``mend()`` relays again."""

    target: int
    server: asyncio.Server | None = None
    cut_off: bool = False
    held: list[asyncio.StreamWriter] = field(default_factory=list)
    #: The request line of each question held since the cut (``POST /log_size HTTP/1.1``).
    asked: list[bytes] = field(default_factory=list)
    live: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    def cut(self) -> None:
        """Every relayed connection dies at once (kept-alive ones too, so none is used again
        and answered by a half-closed socket's error): from here on questions are held."""
        self.cut_off = True
        for writer in list(self.live):
            writer.transport.abort()

    def mend(self) -> None:
        """Relay again; the questions held meanwhile are reset (their asker asks again)."""
        self.cut_off = False
        for writer in self.held:
            writer.transport.abort()
        self.held.clear()

    async def close(self) -> None:
        self.mend()
        for writer in list(self.live):
            writer.transport.abort()
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_off:
            line = await reader.readline()
            if b"/start " in line:
                writer.transport.abort()  # refused: a start is never held by the relay
            else:
                self.asked.append(line)
                self.held.append(writer)  # no answer, no close: the asker's timeout decides
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        self.live.update((writer, up_writer))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        self.live.difference_update((writer, up_writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends; an end is passed on as a reset, as a killed peer's is."""
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()


@dataclass
class Door:
    plane: ControlPlane
    daemon: RunnerDaemon
    remote: RemoteRunner
    outage: Outage
    client: httpx.AsyncClient

    async def post(self, path: str, **body: Any) -> dict[str, Any]:
        answer = await self.client.post(path, json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    async def get(self, path: str) -> dict[str, Any]:
        answer = await self.client.get(path, timeout=120)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    async def start_never_answered(self, *, cut: bool, **body: Any) -> dict[str, Any]:
        """``run_shell`` of ``body`` on ``remote`` sent while the daemon is stopped (SIGSTOP:
        the start waits unread), the daemon then killed -9 (``cut``: its network cut first):
        the answer, ``unknown`` since the start's answer never came."""
        assert self.daemon.process is not None
        os.kill(self.daemon.process.pid, signal.SIGSTOP)
        submit = asyncio.create_task(self.post("/v1/executions", runner_id="remote", **body))
        await asyncio.sleep(1.0)
        assert not submit.done()
        if cut:
            self.outage.cut()
        self.daemon.kill()  # SIGKILL ends a stopped process too
        result = await submit
        assert result["state"] == "unknown", result
        return result

    async def unknown_on(self, environment_id: str) -> str:
        """The id of the execution on the environment once its record says ``unknown``."""
        while True:
            answer = await self.client.get("/v1/executions")
            assert answer.status_code == 200, answer.text
            listed = answer.json()
            for view in listed if isinstance(listed, list) else listed["executions"]:
                if view["environment_id"] == environment_id and view["state"] == "unknown":
                    return str(view["execution_id"])
            await asyncio.sleep(0.05)

    async def change_end(self, change_id: str) -> dict[str, Any]:
        change = await self.get(f"/v1/environment-changes/{change_id}")
        while change["state"] in ("waiting", "running"):
            await asyncio.sleep(0.1)
            change = await self.get(f"/v1/environment-changes/{change_id}")
        return change


@pytest.fixture
async def door(home: Path) -> AsyncIterator[Door]:
    """A plane on ``home`` behind its REST app (in-process, admin token), with runner
    ``remote`` a daemon process reached through an ``Outage`` relay, and a ready python
    environment ``main`` there."""
    plane, _, _ = await open_yard(home, "local")
    daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
    outage = Outage(daemon.port)
    await outage.open()
    admin = await plane.tokens.ensure_admin_file(plane.settings.home)
    transport = httpx.ASGITransport(app=create_app(plane))
    client = httpx.AsyncClient(
        transport=transport,
        base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {admin}"},
    )
    try:
        await plane.runners.add_direct("remote", outage.url, daemon.token)
        remote = plane.runners.get("remote")
        assert isinstance(remote, RemoteRunner)
        yield Door(plane, daemon, remote, outage, client)
    finally:
        await client.aclose()
        await plane.aclose()
        await outage.close()
        await daemon.stop()


async def _environment(door: Door, home: Path) -> tuple[str, dict[str, Any]]:
    """A ready python environment on ``remote``, and the install body of a local wheel."""
    created = await door.post(
        "/v1/environments", name="main", runner_id="remote", language="python", wait_ms=30_000
    )
    made = await door.change_end(created["change_id"])
    assert made["state"] == "succeeded", made
    wheels = home / "wheels"
    make_wheel(wheels, "sy-late", "1.0", modules={"sy_late.py": "VALUE = 'late'\n"})
    body = {
        "manager": "pip",
        "specs": ["sy-late==1.0"],
        "find_links": [str(wheels)],
        "index_url": "none",
        "wait_ms": 0,
    }
    warm = await door.post("/v1/executions", command="true", runner_id="remote", wait_ms=30_000)
    assert warm["state"] == "completed", warm  # the workspace exists: the outage hits start
    return str(created["environment_id"]), body


async def _install_waits_until_resolved(
    door: Door, environment_id: str, body: dict[str, Any], execution_id: str
) -> dict[str, Any]:
    """The install through the door while the execution is unknown: ``waiting`` for it, and
    still waiting on every look until the execution ended (the runner is let back after a few
    of the change's re-checks, WAITING_POLL_S); then its end."""
    change = await door.post(f"/v1/environments/{environment_id}/install", **body)
    while change["state"] == "waiting" and not change["waiting_for"]:  # its first check
        await asyncio.sleep(0.05)
        change = await door.get(f"/v1/environment-changes/{change['change_id']}")
    assert change["state"] == "waiting", change  # V5: not claimed, the prefix untouched
    assert change["waiting_for"] == [execution_id], change
    for _ in range(30):  # ~3 s of the change re-checking the holders, the runner still away
        await asyncio.sleep(0.1)
        seen = await door.get(f"/v1/environment-changes/{change['change_id']}")
        assert seen["state"] == "waiting" and seen["waiting_for"] == [execution_id], seen
    view = await door.get(f"/v1/executions/{execution_id}")
    assert view["state"] == "unknown", view
    door.outage.mend()
    await door.daemon.restart()
    while True:
        # the change read first: while the execution it then reads has not ended, it waited
        seen = await door.get(f"/v1/environment-changes/{change['change_id']}")
        view = await door.get(f"/v1/executions/{execution_id}")
        if view["state"] in ENDED:
            break
        assert seen["state"] == "waiting", (seen, view)
        await asyncio.sleep(0.05)
    done = await door.change_end(change["change_id"])
    assert done["state"] == "succeeded" and done["revision"] == 2, done
    return view


async def test_an_install_waits_for_a_start_whose_answer_never_came(door: Door, home: Path) -> None:
    """V5/E9/E11: the daemon held the start's answer while the command ran on environment
    ``main`` and is killed -9: the record is unknown (the command runs on: R3). An install
    through REST waits for it while the runner is away; back, the runner's answer makes the
    record running, then completed with the command's own exit code (it ran once, on
    revision 1), and only then does the install run and record revision 2."""
    environment_id, body = await _environment(door, home)
    door.remote.start_wait_s = 30.0  # the daemon holds the answer while the command runs
    submit = asyncio.create_task(
        door.post(
            "/v1/executions",
            command="echo run >> runs.txt; sleep 8; exit 4",
            runner_id="remote",
            environment_id=environment_id,
            wait_ms=30_000,
        )
    )
    await asyncio.sleep(1.5)
    assert not submit.done()
    door.outage.cut()
    door.daemon.kill()
    execution_id = await door.unknown_on(environment_id)
    view = await _install_waits_until_resolved(door, environment_id, body, execution_id)
    result = await submit
    assert result["execution_id"] == execution_id, result
    assert result["state"] == "unknown" and "start" in (result["error"] or ""), result
    assert result["environment_revision"] == 1, result
    assert view["state"] == "completed" and view["exit_code"] == 4, view
    after = await door.post(
        "/v1/executions",
        command="cat runs.txt; python -c 'import sy_late; print(sy_late.VALUE)'",
        runner_id="remote",
        environment_id=environment_id,
        wait_ms=30_000,
    )
    assert after["stdout"] == "run\nlate\n", after  # E10: ran once; the install landed
    assert after["environment_revision"] == 2, after


async def test_an_install_waits_for_a_start_the_daemon_never_took(door: Door, home: Path) -> None:
    """V5/E9/E10: the daemon is stopped (SIGSTOP) so the start waits unread, then killed -9:
    nothing ran, but the plane cannot know that until the runner answers, so the install
    waits; back, the runner holds no trace (failed, "never started") and the install runs."""
    environment_id, body = await _environment(door, home)
    result = await door.start_never_answered(
        cut=True, command="echo run >> runs.txt", environment_id=environment_id, background=True
    )
    view = await _install_waits_until_resolved(door, environment_id, body, result["execution_id"])
    assert view["state"] == "failed" and "never started" in (view["error"] or ""), view
    after = await door.post(
        "/v1/executions",
        command="cat runs.txt || echo none",
        runner_id="remote",
        environment_id=environment_id,
        wait_ms=30_000,
    )
    assert after["stdout"].strip().endswith("none"), after  # never run late
    assert after["environment_revision"] == 2, after


async def test_removing_the_runner_ends_an_unknown_start_and_lets_its_environment_go(
    door: Door, home: Path
) -> None:
    """E9/V5, a runner removed while a start's answer is unknown (docs/runners.md "Health"):
    nothing can ask it any more, so the removal ends the record, ``unknown`` (never a false
    outcome) with the reason; that releases its hold on the environment. The runner added
    again under its name answers "never started", which does not reopen the record, and an
    install through REST runs at once (it waits for nothing)."""
    environment_id, body = await _environment(door, home)
    result = await door.start_never_answered(
        cut=False, command="echo run >> runs.txt", environment_id=environment_id, background=True
    )
    execution_id = result["execution_id"]
    removed = await door.post("/v1/runners/remove", runner_id="remote")
    assert removed["runner_id"] == "remote", removed
    view = await door.get(f"/v1/executions/{execution_id}")
    assert view["state"] == "unknown" and view["finished_at"] is not None, view
    assert "removed" in (view["error"] or ""), view
    await door.daemon.restart()
    await door.post(
        "/v1/runners", runner_id="remote", address=door.outage.url, token=door.daemon.token
    )
    change = await door.post(f"/v1/environments/{environment_id}/install", **body)
    done = await door.change_end(change["change_id"])
    assert done["state"] == "succeeded" and done["revision"] == 2, done
    assert done["waiting_for"] == [], done
    again = await door.get(f"/v1/executions/{execution_id}")
    assert again["state"] == "unknown" and again["error"] == view["error"], again


async def test_a_foreground_run_whose_start_never_answered_answers_without_its_runner(
    door: Door,
) -> None:
    """E9/E11: a foreground ``run_shell`` whose start's answer never came answers ``unknown``
    with the reason without asking the runner it just lost for the command's output: it did,
    and that question was held for the runner client's whole request timeout (30 s) before
    the caller, whose budget was 2 s, got its answer."""
    warm = await door.post("/v1/executions", command="true", runner_id="remote", wait_ms=30_000)
    assert warm["state"] == "completed", warm  # the workspace exists: the outage hits start
    result = await door.start_never_answered(cut=True, command="echo hi", wait_ms=2000)
    assert "start" in (result["error"] or ""), result
    assert not any(b"log" in line for line in door.outage.asked), door.outage.asked


async def test_an_environment_change_on_a_removed_runner_ends_with_the_reason(
    door: Door, home: Path
) -> None:
    """V8 (docs/runners.md "Health"): a runner removed while an install runs on it (a build
    that hangs there). Nobody can answer about the change any more: it was asked about for
    ever (a retry every 30 s), holding its environment and whatever queued behind it. Now it
    ends ``failed`` with the reason and what to do, the environment at its revision."""
    environment_id, _body = await _environment(door, home)
    prefix = host_prefix(door.daemon.root, environment_id)
    sdists = home / "sdists"
    make_slow_sdist(sdists, "shellyard-hang", "1.0", prefix, "hang")
    started = await door.post(
        f"/v1/environments/{environment_id}/install",
        manager="pip",
        specs=["shellyard-hang==1.0"],
        find_links=[str(sdists)],
        index_url="none",
        wait_ms=0,
    )
    while not (prefix / ".build-started").exists():  # the build runs on the runner
        await asyncio.sleep(0.1)
    removed = await door.post("/v1/runners/remove", runner_id="remote")
    assert removed["runner_id"] == "remote", removed
    done = await door.change_end(started["change_id"])
    assert done["state"] == "failed", done
    assert "runner remote was removed" in (done["error"] or ""), done
    assert "runner add" in (done["error"] or ""), done
    shown = await door.get(f"/v1/environments/{environment_id}")
    assert shown["revision"] == 1, shown
