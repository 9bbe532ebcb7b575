"""Start a real runner daemon around a real LocalRunner and drive it through RemoteRunner.

Import from tests (``tests/support`` is on ``sys.path`` under pytest)::

    from runner_daemon_fixture import running_daemon, start_daemon

    async with running_daemon(root, policy) as daemon:
        runner = daemon.runner          # a RemoteRunner: the whole Runner protocol over HTTP

Two modes:
- in a thread (default): uvicorn with its own event loop in a daemon thread of the test
  process; fast, and the LocalRunner lives in that loop, not the test's.
- ``subprocess=True``: ``python -m shellyard.runner.daemon`` as a child process, waited for by
  its ready line. ``kill()`` SIGKILLs it and ``restart()`` starts it again on the same port
  and token, for fault tests (E9, R3).

The port is bound before the server starts (port 0), so there is no free-port race.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess as sp
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from shellyard.runner.daemon import (
    READY_PREFIX,
    TOKEN_FILE_NAME,
    bind_socket,
    create_runner_app,
    load_or_create_token,
    socket_url,
)
from shellyard.runner.protocol import Runner, SandboxPolicy
from shellyard.runner.remote import RemoteRunner

START_TIMEOUT_S = 30.0


@dataclass
class RunnerDaemon:
    """A running daemon: ``runner`` is a RemoteRunner connected to it."""

    url: str
    token: str
    root: Path
    policy: SandboxPolicy
    runner: RemoteRunner
    _thread: threading.Thread | None = None
    _server: uvicorn.Server | None = None
    process: sp.Popen[bytes] | None = None
    #: The subprocess's stderr lines (debugging help when a test fails).
    output: list[str] = field(default_factory=list)

    def client(self, token: str | None = None, timeout_s: float = 30) -> RemoteRunner:
        """Another RemoteRunner on this daemon, e.g. with a wrong token; caller closes it."""
        return RemoteRunner(self.url, self.token if token is None else token, timeout_s=timeout_s)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def stop(self) -> None:
        """Graceful stop (the LocalRunner's ``aclose`` runs); closes ``runner`` too."""
        await self.runner.aclose()
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            await asyncio.to_thread(self._thread.join, START_TIMEOUT_S)
            self._server = self._thread = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(self.process.wait, START_TIMEOUT_S)
                except sp.TimeoutExpired:
                    self.process.kill()
                    await asyncio.to_thread(self.process.wait)
            self.process = None

    def kill(self) -> None:
        """SIGKILL the daemon process (subprocess mode): its sandboxes keep running."""
        if self.process is None:
            raise RuntimeError("kill() needs a daemon started with subprocess=True")
        self.process.kill()
        self.process.wait()

    async def restart(self) -> None:
        """Start the daemon process again on the same port and token (subprocess mode).

        ``runner`` stays usable: it reconnects on its next call."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the daemon is still running; kill() or stop() it first")
        self.process = await _spawn(self.root, self.policy, self.port, self.output)


async def start_daemon(
    root: Path,
    policy: SandboxPolicy | None = None,
    *,
    token: str | None = None,
    subprocess: bool = False,
    runner: Runner | None = None,
) -> RunnerDaemon:
    """Start a daemon serving ``root`` and return it with a connected RemoteRunner.

    ``token`` None uses ``<root>/token`` (created on first start, as the real daemon does).
    ``runner`` (thread mode only) serves that object instead of a new ``LocalRunner``.
    """
    policy = policy or SandboxPolicy()
    root.mkdir(parents=True, exist_ok=True)
    if subprocess:
        if runner is not None or token is not None:
            raise ValueError("subprocess mode serves a LocalRunner with <root>/token")
        token = load_or_create_token(root / TOKEN_FILE_NAME)
        output: list[str] = []
        process = await _spawn(root, policy, 0, output)
        url = _url_from_output(output)
        return RunnerDaemon(
            url, token, root, policy, RemoteRunner(url, token), process=process, output=output
        )
    if token is None:
        token = load_or_create_token(root / TOKEN_FILE_NAME)
    if runner is None:
        from shellyard.runner.local import LocalRunner

        runner = LocalRunner(root, policy)
    server, thread, url = await _serve_in_thread(runner, token)
    return RunnerDaemon(
        url, token, root, policy, RemoteRunner(url, token), _thread=thread, _server=server
    )


@asynccontextmanager
async def running_daemon(
    root: Path,
    policy: SandboxPolicy | None = None,
    *,
    token: str | None = None,
    subprocess: bool = False,
    runner: Runner | None = None,
) -> AsyncIterator[RunnerDaemon]:
    daemon = await start_daemon(root, policy, token=token, subprocess=subprocess, runner=runner)
    try:
        yield daemon
    finally:
        await daemon.stop()


# --- thread mode ---


async def _serve_in_thread(
    runner: Runner, token: str
) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = bind_socket("127.0.0.1", 0)
    url = socket_url(sock)
    startup_error: list[BaseException] = []
    hook: Callable[[], object] | None = getattr(runner, "startup", None)

    async def on_startup() -> None:
        try:
            if hook is not None:
                result = hook()
                if asyncio.iscoroutine(result):
                    await result
        except BaseException as e:
            startup_error.append(e)
            raise

    app = create_runner_app(runner, token, on_startup=on_startup, close_runner=True)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)

    def run() -> None:
        try:
            asyncio.run(server.serve(sockets=[sock]))
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"runner-daemon-{url}", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            if startup_error:
                raise startup_error[0]
            raise RuntimeError(f"the runner daemon at {url} did not start")
        await asyncio.sleep(0.005)
    return server, thread, url


# --- subprocess mode ---


async def _spawn(
    root: Path, policy: SandboxPolicy, port: int, output: list[str]
) -> sp.Popen[bytes]:
    argv = [
        sys.executable, "-m", "shellyard.runner.daemon",
        "--root", str(root),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--token-file", str(root / TOKEN_FILE_NAME),
        "--policy-json", policy.model_dump_json(),
        "--log-level", "warning",
    ]  # fmt: skip
    process = sp.Popen(argv, stdin=sp.DEVNULL, stdout=sp.DEVNULL, stderr=sp.PIPE)
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            output.append(line)
            if line.startswith(READY_PREFIX):
                ready.set()
        ready.set()  # the process ended: stop waiting

    threading.Thread(target=drain, name="runner-daemon-stderr", daemon=True).start()
    if not await asyncio.to_thread(ready.wait, START_TIMEOUT_S) or process.poll() is not None:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        raise RuntimeError("the runner daemon did not start:\n" + "\n".join(output[-40:]))
    return process


def _url_from_output(output: list[str]) -> str:
    for line in output:
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX) :].strip()
    raise RuntimeError("no ready line from the runner daemon")
