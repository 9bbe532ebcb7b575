"""Start a real runner daemon around a real LocalRunner and drive it through RemoteRunner.

Import from tests (``tests/support`` is on ``sys.path`` under pytest)::

    from runner_daemon_fixture import running_daemon, start_daemon

    async with running_daemon(root, policy) as daemon:
        runner = daemon.runner          # a RemoteRunner: the whole Runner protocol over HTTP

Two modes:
- in a thread (default): uvicorn with its own event loop in a daemon thread of the test
  process; fast, and the LocalRunner lives in that loop, not the test's. That loop is the one
  ``runner serve`` would choose (``shellyard.loops``: uvloop unless ``SHELLYARD_LOOP`` says
  otherwise).
- ``subprocess=True``: ``python -m shellyard.runner.transport.daemon`` as a child process,
  waited for by its ready line. ``kill()`` SIGKILLs it and ``restart()`` starts it again on the
  same port and token, for fault tests (E9, R3).

The port is bound before the server starts (port 0), so there is no free-port race.

``ssh=SshServer`` (sshd_fixture): the daemon listens on a Unix socket instead and ``runner`` is
an ssh runner reaching it through that sshd (R1: the same RemoteRunner path as direct).
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
from sshd_fixture import SshServer

from shellyard import loops
from shellyard.runner.protocol import Runner, SandboxPolicy
from shellyard.runner.transport.client import RemoteRunner
from shellyard.runner.transport.daemon import (
    READY_PREFIX,
    TOKEN_FILE_NAME,
    bind_socket,
    bind_unix_socket,
    create_runner_app,
    load_or_create_token,
    socket_url,
)
from shellyard.runner.transport.ssh import ssh_runner
from shellyard.runner.transport.tls import pinned_transport

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
    #: The sshd in front of the daemon (ssh mode); ``url`` is then ``unix:<socket>``.
    ssh: SshServer | None = None
    #: (certificate, key) the daemon serves HTTPS with (subprocess mode); ``restart`` uses
    #: the current value, so a test can swap the certificate.
    tls: tuple[Path, Path] | None = None
    #: Subprocess mode: the command prefix it runs under (``ip netns exec NS``) and its host.
    prefix: tuple[str, ...] = ()
    host: str = "127.0.0.1"

    def client(self, token: str | None = None, timeout_s: float = 30) -> RemoteRunner:
        """Another RemoteRunner on this daemon, e.g. with a wrong token; caller closes it."""
        key = self.token if token is None else token
        if self.ssh is not None:
            return _ssh_client(self.ssh, self.url, key, timeout_s=timeout_s)
        return RemoteRunner(self.url, key, timeout_s=timeout_s)

    @property
    def address(self) -> str:
        """What ``runner add`` takes: the http URL, or the ssh:// address in ssh mode."""
        if self.ssh is not None:
            return self.ssh.address(self.url.removeprefix("unix:"))
        return self.url

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
        if self.ssh is not None:
            self.process = await _spawn(
                self.root, self.policy, 0, self.output, _socket(self.root), prefix=self.prefix
            )
        else:
            self.process = await _spawn(
                self.root,
                self.policy,
                self.port,
                self.output,
                tls=self.tls,
                prefix=self.prefix,
                host=self.host,
            )


async def start_daemon(
    root: Path,
    policy: SandboxPolicy | None = None,
    *,
    token: str | None = None,
    subprocess: bool = False,
    runner: Runner | None = None,
    ssh: SshServer | None = None,
    tls: tuple[Path, Path] | None = None,
    prefix: tuple[str, ...] = (),
    host: str = "127.0.0.1",
) -> RunnerDaemon:
    """Start a daemon serving ``root`` and return it with a connected RemoteRunner.

    ``token`` None uses ``<root>/token`` (created on first start, as the real daemon does).
    ``runner`` (thread mode only) serves that object instead of a new ``LocalRunner``.
    ``ssh``: the daemon listens on a Unix socket reached through that sshd.
    """
    policy = policy or SandboxPolicy()
    root.mkdir(parents=True, exist_ok=True)
    unix = _socket(root) if ssh is not None else None
    if subprocess:
        if runner is not None or token is not None:
            raise ValueError("subprocess mode serves a LocalRunner with <root>/token")
        token = load_or_create_token(root / TOKEN_FILE_NAME)
        output: list[str] = []
        process = await _spawn(root, policy, 0, output, unix, tls=tls, prefix=prefix, host=host)
        url = _url_from_output(output)
        if tls is not None:
            client = RemoteRunner(url, token, transport=pinned_transport(tls[0].read_text()))
        else:
            client = _ssh_client(ssh, url, token) if ssh else RemoteRunner(url, token)
        return RunnerDaemon(
            url,
            token,
            root,
            policy,
            client,
            process=process,
            output=output,
            ssh=ssh,
            tls=tls,
            prefix=prefix,
            host=host,
        )
    if token is None:
        token = load_or_create_token(root / TOKEN_FILE_NAME)
    if runner is None:
        from shellyard.runner.local import LocalRunner

        runner = LocalRunner(root, policy)
    server, thread, url = await _serve_in_thread(runner, token, unix)
    client = _ssh_client(ssh, url, token) if ssh else RemoteRunner(url, token)
    return RunnerDaemon(url, token, root, policy, client, _thread=thread, _server=server, ssh=ssh)


def _socket(root: Path) -> Path:
    return root.parent / f"{root.name}.sock"


def _ssh_client(ssh: SshServer, url: str, token: str, **options: object) -> RemoteRunner:
    address = ssh.address(url.removeprefix("unix:"))
    return ssh_runner(address, token, ssh.identity, ssh.known_hosts, **options)


@asynccontextmanager
async def running_daemon(
    root: Path,
    policy: SandboxPolicy | None = None,
    *,
    token: str | None = None,
    subprocess: bool = False,
    runner: Runner | None = None,
    ssh: SshServer | None = None,
) -> AsyncIterator[RunnerDaemon]:
    daemon = await start_daemon(
        root, policy, token=token, subprocess=subprocess, runner=runner, ssh=ssh
    )
    try:
        yield daemon
    finally:
        await daemon.stop()


# --- thread mode ---


async def _serve_in_thread(
    runner: Runner, token: str, unix: Path | None = None
) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = bind_unix_socket(unix) if unix else bind_socket("127.0.0.1", 0)
    url = f"unix:{unix}" if unix else socket_url(sock)
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
            # the loop `runner serve` ships with (uvloop by default): the tests of direct and
            # ssh runners exercise the LocalRunner on it
            loops.run(server.serve(sockets=[sock]))
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
    root: Path,
    policy: SandboxPolicy,
    port: int,
    output: list[str],
    unix: Path | None = None,
    *,
    tls: tuple[Path, Path] | None = None,
    prefix: tuple[str, ...] = (),
    host: str = "127.0.0.1",
) -> sp.Popen[bytes]:
    argv = [
        *prefix,
        sys.executable, "-m", "shellyard.runner.transport.daemon",
        "--root", str(root),
        "--host", host,
        "--port", str(port),
        "--token-file", str(root / TOKEN_FILE_NAME),
        "--policy-json", policy.model_dump_json(),
        "--log-level", "warning",
        *(["--socket", str(unix)] if unix else []),
        *(["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []),
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
