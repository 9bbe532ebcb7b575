"""Ports for the host and the shared workspace network in its other modes (issue 17 items 2
and 3), with real sandboxes, network namespaces and relay processes, on the local runner and
on a runner daemon (the ``yard`` fixture: R1, the control plane cannot tell them apart).

A forward binds HOST_PORT on a loopback address of the workspace's own (127.X.Y.Z, never
127.0.0.1, the web page's host) of the runner's host (the daemon's host for a remote
runner, here the same machine) and relays into the workspace's own network namespace; only
the workspace's own agent opens it; it is gone when closed or when the workspace's last
execution ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from host_listener import host_listener
from runner_daemon_fixture import start_daemon

from conftest import Yard, sy
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
    RunShellResult,
)
from shellyard.contract.ports import PortListQuery, PortView
from shellyard.errors import InvalidInput, NotFound
from shellyard.home import ensure_server, is_served
from shellyard.runner.network.ports import FORWARD_BLOCK, workspace_address
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.snapshots import views as readview
from shellyard.sdk.client import Client

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nsenter") is None,
    reason="a network namespace per workspace needs root and util-linux's nsenter",
)

PORT = 8766


async def _wait_for_log(yard: Yard, execution_id: str, text: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = await yard.plane.executions.logs(execution_id, ExecutionLogsQuery())
        if text in logs.data:
            return
        if logs.state.terminal:
            view = await yard.plane.executions.status(execution_id)
            raise AssertionError(f"{execution_id} ended before printing {text!r}: {view}")
        await asyncio.sleep(0.05)
    raise AssertionError(f"{execution_id} did not print {text!r} within {timeout_s} s")


SERVER = (
    "echo served-live > live.txt; echo listening; "
    "exec python3 -m http.server {port} --bind 127.0.0.1 --directory /workspace"
)


async def _server(yard: Yard, port: int = PORT) -> RunShellResult:
    """The workspace's HTTP server on 127.0.0.1:``port`` of its own network, serving it."""
    server = await yard.run(SERVER.format(port=port), background=True)
    await _wait_for_log(yard, server.execution_id, "listening")
    return server


def _get(url: str, attempts: int = 100) -> str:
    """What ``url`` answers from this host (no proxy), retrying while the server starts."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    error: Exception | None = None
    for _ in range(attempts):
        try:
            with opener.open(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError as exc:
            error = exc
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer: {error}")


def _refused(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing accepts on host:port of this host (or it closes at once)."""
    with socket.socket() as probe:
        probe.settimeout(2)
        if probe.connect_ex((host, port)) != 0:
            return True
        probe.sendall(b"GET /live.txt HTTP/1.0\r\n\r\n")
        try:
            return probe.recv(100) == b""
        except OSError:
            return True


def _proc_hex(address: str) -> str:
    """An IPv4 address as /proc/net/tcp spells it (little-endian hex)."""
    return socket.inet_aton(address)[::-1].hex().upper()


def _listening_addresses(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} spell them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hexport = fields[1].rsplit(":", 1)
            if int(hexport, 16) == port and fields[3] == "0A":  # TCP_LISTEN
                found.append(address)
    return found


def _relay_uids(port: int | None) -> list[int]:
    """The real uids of the relay processes forwarding to ``port`` (from /proc); None: the
    egress relays (to the proxy's socket)."""
    uids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if not any(a.endswith(b"relay.py") for a in argv) or b"--hold" in argv:
            continue
        if port is None:
            wanted = b"--unix" in argv
        else:
            wanted = b"--tcp-port" in argv and argv[argv.index(b"--tcp-port") + 1] == b"%d" % port
        if wanted:
            uids.append(int(status.split("\nUid:")[1].split()[0]))
    return uids


@pytest.mark.runner_kinds("local", "direct", "ssh")
async def test_forwarded_port_reaches_the_server_until_closed(yard: Yard) -> None:
    """Issue 17 item 3: the host cannot reach the workspace's server without a forward; with
    one it fetches a file from it; the forward listens on loopback only, is listed, and is
    gone once closed."""
    server = await _server(yard)
    workspace = server.workspace_id
    ports = yard.plane.ports
    try:
        assert _refused(PORT)  # the server is in the workspace's network, not the host's
        view = await ports.open(PORT, workspace_id=workspace)
        assert view.port == PORT and view.host_port > 0
        # The workspace's own loopback address, never the web page's 127.0.0.1 (docs/web.md)
        assert view.host == workspace_address(workspace) != "127.0.0.1"
        assert ipaddress.ip_address(view.host) in ipaddress.ip_network(FORWARD_BLOCK)
        assert view.url == f"http://{view.host}:{view.host_port}/"
        assert _refused(view.host_port)  # nothing on 127.0.0.1 at that port
        assert view.runner_id == yard.runner_id and view.workspace_id == workspace
        assert _get(view.url + "live.txt") == "served-live\n"
        # that loopback address only
        assert _listening_addresses(view.host_port) == [_proc_hex(view.host)]
        if os.geteuid() == 0:  # a root runner's relay keeps no privilege
            assert set(_relay_uids(PORT)) == {61000}, _relay_uids(PORT)  # the sandbox uid
        again = await ports.open(PORT, workspace_id=workspace)  # the same forward
        assert again.host_port == view.host_port
        with pytest.raises(InvalidInput, match="already forwarded"):
            await ports.open(PORT, view.host_port + 1, workspace_id=workspace)
        listed = await ports.list(PortListQuery(workspace_id=workspace))
        assert [(p.port, p.host_port) for p in listed] == [(PORT, view.host_port)]
        closed = await ports.close(PORT, workspace_id=workspace)
        assert closed.host_port == view.host_port
        assert _refused(view.host_port, view.host)
        assert await ports.list(PortListQuery(workspace_id=workspace)) == []
        with pytest.raises(NotFound, match="not forwarded"):
            await ports.close(PORT, workspace_id=workspace)
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


async def test_ports_go_with_the_last_execution(yard: Yard) -> None:
    """Issue 17: a forward lives while the workspace has a live execution (here a reader
    outlives the server), and is gone, relay and all, when the last one ends; a workspace
    with no running execution has no network to forward into."""
    with pytest.raises(InvalidInput, match="no running execution"):
        await yard.plane.ports.open(PORT)  # the default: the agent's own local workspace
    server = await _server(yard)
    workspace = server.workspace_id
    reader = await yard.run("echo up; sleep 60", read_only=True, background=True)
    await _wait_for_log(yard, reader.execution_id, "up")
    view = await yard.plane.ports.open(PORT, workspace_id=workspace, runner_id=yard.runner_id)
    assert _get(view.url + "live.txt") == "served-live\n"
    await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
    # the reader still runs: the namespace and the forward stay (nothing listens behind it)
    assert [p.port for p in await yard.plane.ports.list(PortListQuery(workspace_id=workspace))] == [
        PORT
    ]
    await yard.plane.executions.cancel(reader.execution_id, ExecutionCancelQuery(wait_s=30))
    assert await yard.plane.ports.list(PortListQuery(workspace_id=workspace)) == []
    assert _refused(view.host_port, view.host)


async def test_another_agent_can_neither_open_nor_reach_the_forward(yard: Yard) -> None:
    """Issue 17, T1: another session's agent cannot open a port on this workspace (it is
    reported missing, as every workspace not its own), and its own sandbox does not reach the
    host's forwarded port (its network is its own); a child agent reads its parent's files
    but does not open its ports."""
    server = await _server(yard)
    workspace = server.workspace_id
    try:
        view = await yard.plane.ports.open(PORT, workspace_id=workspace)
        other = await yard.plane.sessions.create()
        with pytest.raises(NotFound):
            await yard.plane.ports.open(PORT, workspace_id=workspace, agent_id=other.main_agent_id)
        with pytest.raises(NotFound):
            await yard.plane.ports.list(
                PortListQuery(workspace_id=workspace), agent_id=other.main_agent_id
            )
        probe = (
            f"exec 3<>/dev/tcp/{view.host}/{view.host_port} && echo REACHED || echo UNREACHABLE; "
            f"exec 4<>/dev/tcp/127.0.0.1/{PORT} && echo REACHED || echo UNREACHABLE"
        )
        result = await yard.plane.executions.run_shell(
            RunShellRequest(command=probe, runner_id=yard.runner_id), other.main_agent_id
        )
        assert result.workspace_id != workspace
        assert result.stdout == "UNREACHABLE\nUNREACHABLE\n", result.stderr
        assert _get(view.url + "live.txt") == "served-live\n"  # still ours
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


async def test_host_network_has_no_forwards(yard_factory: Any) -> None:
    """Network ``host``: the workspace's server listens on the host's own network, so a
    forward is refused with that said (docs/decisions.md)."""
    yard: Yard = await yard_factory(SandboxPolicy(network="host"))
    server = await yard.run("echo up; sleep 60", background=True)
    await _wait_for_log(yard, server.execution_id, "up")
    try:
        with pytest.raises(InvalidInput, match="host's own network"):
            await yard.plane.ports.open(PORT, workspace_id=server.workspace_id)
        assert await yard.plane.ports.list(PortListQuery(workspace_id=server.workspace_id)) == []
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))


# ------------------------------------------------------------------ egress


@pytest.fixture
def host_server() -> Iterator[int]:
    """An HTTP listener on this host's 127.0.0.1 (the egress proxy's operator exception)."""
    with host_listener(b"from-host\n") as port:
        yield port


#: From inside a sandbox: the workspace's own server at localhost, retried while it starts.
LOCAL = "for i in $(seq 200); do curl -sf http://127.0.0.1:{port}/{path} && break; sleep 0.05; done"
#: From inside a sandbox: what the URL answers through the proxy variables ($HTTP_PROXY).
PROXIED = "curl -sS -m 10 --noproxy '' {url} 2>&1 || echo FAILED $?"


@pytest.mark.skipif(shutil.which("socat") is None, reason="egress needs socat (Debian socat)")
async def test_shared_network_under_egress(yard_factory: Any, host_server: int) -> None:
    """Issue 17 item 2, R2 ``egress``: the executions of a workspace share one namespace
    (a reader reaches the background server at localhost), and each of them still reaches
    the outside only through the runner's proxy (its relay lives with the namespace, so two
    executions at once both use it, and it outlives the one that came first); the host's
    forward works too. The proxy refuses what the policy refuses."""
    exception = f"127.0.0.1:{host_server}"
    yard: Yard = await yard_factory(SandboxPolicy(network="egress", egress_exceptions=[exception]))
    server = await _server(yard)
    try:
        reader = await yard.run(
            LOCAL.format(port=PORT, path="live.txt")
            + "; "
            + PROXIED.format(url=f"http://127.0.0.1:{host_server}/")
            + "; "
            + PROXIED.format(url="http://127.0.0.1:9/"),
            read_only=True,
            wait_ms=30_000,
        )
        assert reader.state == ExecutionState.completed, reader.stderr
        lines = reader.stdout.splitlines()
        assert lines[:2] == ["served-live", "from-host"], reader.stdout + reader.stderr
        assert "127.0.0.0/8" in reader.stdout.split("from-host\n")[1]  # the proxy's refusal
        writer_client = await yard.run(
            PROXIED.format(url=f"http://127.0.0.1:{host_server}/"), read_only=True
        )
        assert writer_client.stdout == "from-host\n"
        view = await yard.plane.ports.open(PORT, workspace_id=server.workspace_id)
        assert _get(view.url + "live.txt") == "served-live\n"
        if os.geteuid() == 0:  # a root runner's egress relay keeps no privilege either
            assert set(_relay_uids(None)) == {61000}, _relay_uids(None)  # the sandbox uid
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
    # A fresh namespace (the last execution ended) gets a fresh relay.
    alone = await yard.run(PROXIED.format(url=f"http://127.0.0.1:{host_server}/"))
    assert alone.stdout == "from-host\n", alone.stdout


# ------------------------------------------------------------------ restarts (E11)


def _kill9(pid: int, served: Path | None = None) -> None:
    os.kill(pid, signal.SIGKILL)
    if served is None:
        return
    deadline = time.monotonic() + 10
    while is_served(served) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_served(served)


@pytest.mark.parametrize("runner", ["local", "direct"])
async def test_kill9_keeps_server_reader_network_and_forward(
    served_home: Path, runner: str
) -> None:
    """Issue 17, E11: kill -9 of the control plane (for ``local`` the runner dies with it)
    while a server, a read-only client and a forward run: after the restart both executions
    are re-attached, the client ends with the server's answer, the shared network still
    works for a new reader, the forward still answers and is still listed; once the server
    ends it is gone."""
    home = served_home
    daemon = None
    runner_id = None
    if runner == "direct":
        daemon = await start_daemon(home / "daemon", SandboxPolicy(), subprocess=True)
        runner_id = "remote"
    client = Client.for_home(home)
    if daemon is not None:
        client.add_runner("remote", daemon.url, daemon.token)
    server = client.run(SERVER.format(port=PORT), background=True, runner_id=runner_id)
    reader = client.run(
        "sleep 3; " + LOCAL.format(port=PORT, path="live.txt"),
        read_only=True,
        background=True,
        runner_id=runner_id,
    )
    view: PortView = client.open_port(PORT, workspace_id=server.workspace_id)
    assert _get(view.url + "live.txt") == "served-live\n"
    _kill9(ensure_server(home).pid, home)
    assert _get(view.url + "live.txt") == "served-live\n"  # the relay is its own process
    client = Client.for_home(home)  # a new control plane on the same home
    try:
        done = client.wait(reader.execution_id, 30)
        assert done.state == ExecutionState.completed and done.exit_code == 0
        assert client.logs(reader.execution_id).data == "served-live\n"
        assert client.status(server.execution_id).state == ExecutionState.running
        again = client.run(
            LOCAL.format(port=PORT, path="live.txt"),
            read_only=True,
            wait_ms=30_000,
            runner_id=runner_id,
        )
        assert again.stdout == "served-live\n", again.stderr
        listed = client.ports(workspace_id=server.workspace_id)
        assert [(p.port, p.host_port) for p in listed] == [(PORT, view.host_port)]
        assert _get(view.url + "live.txt") == "served-live\n"
    finally:
        client.cancel(server.execution_id)
        assert client.wait(server.execution_id, 30).state == ExecutionState.cancelled
    try:
        assert client.ports(workspace_id=server.workspace_id) == []
        assert _refused(view.host_port, view.host)
    finally:
        if daemon is not None:
            await daemon.stop()


def test_cli_port_open_list_close(served_home: Path) -> None:
    """Issue 17: ``shellyard port WS PORT`` prints the url the host opens; ``port list``
    and ``port close`` as documented; bad input says what to give."""
    server = sy(served_home, "run", "--background", "--", SERVER.format(port=PORT)).stdout.strip()
    try:
        client = Client.for_home(served_home)
        workspace = client.status(server).workspace_id
        url = sy(served_home, "port", workspace, str(PORT))
        assert url.returncode == 0, url.stderr
        assert url.stdout.startswith("http://127.") and "127.0.0.1" not in url.stdout
        assert _get(url.stdout.strip() + "live.txt") == "served-live\n"
        listed = sy(served_home, "port", "list", workspace, "--json")
        assert listed.returncode == 0 and f'"port": {PORT}' in listed.stdout
        bad = sy(served_home, "port", workspace, "http")
        assert bad.returncode == 2 and "PORT must be a number" in bad.stderr
        closed = sy(served_home, "port", "close", workspace, str(PORT))
        assert closed.returncode == 0 and "closed" in closed.stdout
        printed = urlsplit(url.stdout.strip())
        assert printed.hostname is not None and printed.port is not None
        assert _refused(printed.port, printed.hostname)
    finally:
        sy(served_home, "cancel", server)


# ------------------------------------------------------------------ shared read views


async def test_readers_share_one_view_per_snapshot(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 benchmark fix, W2: concurrent readers of one committed snapshot see the same
    view (one folder, the same inode at /workspace), a reader after a writer that changed
    nothing reuses it, a reader after a change sees the new files, and no view is left
    behind but the head's (local runner: its views/ folder)."""
    await yard.run(
        "mkdir -p d && echo one > d/a.txt && printf '#!/bin/sh\\necho ran\\n' > x.sh "
        "&& chmod +x x.sh"
    )
    first = await yard.run(
        "stat -c %i /workspace; echo up; sleep 60", read_only=True, background=True
    )
    await _wait_for_log(yard, first.execution_id, "up")
    try:
        second = await yard.run("stat -c %i /workspace; cat d/a.txt; ./x.sh", read_only=True)
        inode = second.stdout.splitlines()[0]
        assert second.stdout == f"{inode}\none\nran\n", second.stderr
        logs = await yard.plane.executions.logs(first.execution_id, ExecutionLogsQuery())
        assert logs.data.splitlines()[0] == inode  # the same folder, bound twice
    finally:
        await yard.plane.executions.cancel(first.execution_id, ExecutionCancelQuery(wait_s=30))
    assert (await yard.run("true")).state == ExecutionState.completed  # nothing changed
    third = await yard.run("stat -c %i /workspace", read_only=True)
    assert third.stdout == f"{inode}\n"
    built: list[int] = []  # local runner (in this process): count the full builds
    real_materialise = readview.materialise

    def counted(*args: Any, **kwargs: Any) -> int:
        built.append(1)
        return real_materialise(*args, **kwargs)

    monkeypatch.setattr(readview, "materialise", counted)
    await yard.run("echo two > d/a.txt")
    fourth = await yard.run("cat d/a.txt", read_only=True)
    assert fourth.stdout == "two\n"
    # The next head's view is the unused one patched: a folder turned into a file, a file
    # into a folder, an executable no longer executable, a symlink, a removal, an addition.
    await yard.run(
        "rm -r d && echo file > d && mkdir x2 && mv x.sh x2/ && chmod -x x2/x.sh && "
        "ln -s x2/x.sh link && mkdir -p e/f && : > e/f/empty"
    )
    patched = await yard.run(
        "find . | sort; cat d; test -x x2/x.sh && echo exec || echo plain; readlink link; "
        "stat -c %s e/f/empty; touch d 2>/dev/null || echo read-only",
        read_only=True,
    )
    assert patched.stdout == (
        ".\n./d\n./e\n./e/f\n./e/f/empty\n./link\n./x2\n./x2/x.sh\n"
        "file\nplain\nx2/x.sh\n0\nread-only\n"
    ), patched.stderr
    again = await yard.run("cat x2/x.sh d", read_only=True)
    assert again.stdout == "#!/bin/sh\necho ran\nfile\n"
    if yard.runner_id == "local":
        assert built == []  # every later head's view was the previous one, patched
    if yard.runner_id == "local":
        views = yard.plane.settings.local_runner_root / "views"
        assert len(list(views.iterdir())) == 1  # the head's only


# ------------------------------------------------------------------ a runner that is not root

NOBODY = 65534


def _chown_tree(root: Path, uid: int) -> None:
    for folder, _dirs, files in os.walk(root):
        os.chown(folder, uid, uid)
        for name in files:
            os.chown(os.path.join(folder, name), uid, uid)


def _nobody_root(root: Path) -> tuple[str, ...]:
    """Make ``root`` a runner folder (with its token) owned by nobody; the prefix that starts
    the daemon as nobody."""
    from runner_daemon_fixture import load_or_create_token

    root.mkdir(mode=0o755)
    load_or_create_token(root / "token")
    _chown_tree(root, NOBODY)
    return ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run as nobody")
@pytest.mark.runner_kinds("local")  # the control plane's own runner plays no part
@pytest.mark.parametrize("network", ["off", "egress"])
async def test_unprivileged_runner_shares_the_network(
    yard_factory: Any, network: str, host_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 item 2: a runner daemon that is not root (here: nobody) gives a workspace one
    network too (a holder process in a user namespace of its own, netns_holder.py): a reader
    reaches the background server at localhost, another workspace does not, the host reaches
    it through a forward only, and under egress both still reach the outside through the
    proxy. When the last execution ends the holder and the forward are gone."""
    # Namespaces are counted below: the daemon lets each go when its last execution ends
    # instead of keeping it NETWORK_LINGER_S for the next command.
    monkeypatch.setenv("SHELLYARD_NETWORK_LINGER_S", "0")
    yard: Yard = await yard_factory()  # the control plane (root); its runner is the daemon
    root = yard.home / "nobody-runner"
    as_nobody = _nobody_root(root)
    policy = SandboxPolicy(network=network, egress_exceptions=[f"127.0.0.1:{host_server}"])
    daemon = await start_daemon(root, policy, subprocess=True, prefix=as_nobody)
    try:
        await yard.plane.runners.add_direct("nobody", daemon.url, daemon.token)
        yard = Yard(yard.plane, "nobody", yard.home)
        server = await _server(yard)
        try:
            proxied = (
                PROXIED.format(url=f"http://127.0.0.1:{host_server}/")
                if network == "egress"
                else "echo from-host"
            )
            reader = await yard.run(
                LOCAL.format(port=PORT, path="live.txt") + "; id -u; " + proxied,
                read_only=True,
                wait_ms=30_000,
            )
            assert reader.stdout == f"served-live\n{NOBODY}\nfrom-host\n", reader.stderr
            assert _refused(PORT)
            view = await yard.plane.ports.open(PORT, workspace_id=server.workspace_id)
            assert _get(view.url + "live.txt") == "served-live\n"
            other = await yard.plane.sessions.create()
            probe = await yard.plane.executions.run_shell(
                RunShellRequest(
                    command=f"exec 3<>/dev/tcp/127.0.0.1/{PORT} && echo REACHED || echo NO",
                    runner_id="nobody",
                ),
                other.main_agent_id,
            )
            assert probe.stdout == "NO\n"
            # The probe's own holder goes after its run has answered (seen still there once
            # under CI load): wait for it, 10 s at most.
            deadline = time.monotonic() + 10
            while True:
                holders = [h.stem for h in (root / "sandbox" / "netns").glob("*.json")]
                if holders == [server.workspace_id] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert holders == [server.workspace_id]
        finally:
            await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
        assert await yard.plane.ports.list(PortListQuery(workspace_id=server.workspace_id)) == []
        assert _refused(view.host_port, view.host)
        assert list((root / "sandbox" / "netns").glob("*.json")) == []
    finally:
        await daemon.stop()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run as nobody")
@pytest.mark.runner_kinds("local")  # the control plane's own runner plays no part
async def test_a_killed_holder_is_replaced_inside_the_same_network(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17 on a runner that is not root: the process holding a workspace's network is
    killed -9 while the workspace's server runs. The next command gets a new holder that
    joined the same namespace (through the running server's sandbox), so it still reaches
    the server on localhost, and a forward opened afterwards reaches it too; one holder is
    recorded, and it goes with the last execution."""
    monkeypatch.setenv("SHELLYARD_NETWORK_LINGER_S", "0")
    yard: Yard = await yard_factory()
    root = yard.home / "nobody-runner"
    as_nobody = _nobody_root(root)
    daemon = await start_daemon(root, SandboxPolicy(), subprocess=True, prefix=as_nobody)
    try:
        await yard.plane.runners.add_direct("nobody", daemon.url, daemon.token)
        yard = Yard(yard.plane, "nobody", yard.home)
        server = await _server(yard)
        try:
            (record,) = list((root / "sandbox" / "netns").glob("*.json"))
            first = json.loads(record.read_text())
            os.kill(int(first["pid"]), signal.SIGKILL)
            # SIGKILL is delivered asynchronously: under load the holder was seen alive by the
            # next start and gone when its launcher opened /proc/PID/ns/net. The case here is
            # a holder that is dead, so wait for its death (10 s at most).
            deadline = time.monotonic() + 10
            while Path(f"/proc/{first['pid']}/ns/net").exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            reader = await yard.run(
                LOCAL.format(port=PORT, path="live.txt"), read_only=True, wait_ms=30_000
            )
            assert reader.stdout == "served-live\n", reader.stderr
            again = json.loads(record.read_text())
            assert again["pid"] != first["pid"]  # a new holder ...
            assert again["net"] == first["net"]  # ... of the same namespace
            view = await yard.plane.ports.open(PORT, workspace_id=server.workspace_id)
            assert _get(view.url + "live.txt") == "served-live\n"
        finally:
            await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
        assert list((root / "sandbox" / "netns").glob("*.json")) == []
    finally:
        await daemon.stop()


def _holding(inode: int) -> list[str]:
    """Every process and descriptor on this host that holds the network namespace ``inode``
    (its /proc ns link or an open descriptor of it): none once it is gone."""
    needle = f"net:[{inode}]"
    found = []
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        links = [f"/proc/{pid}/ns/net"]
        with contextlib.suppress(OSError):
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        for link in links:
            with contextlib.suppress(OSError):
                if os.readlink(link) == needle:
                    found.append(link)
    return found


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to run as nobody")
@pytest.mark.runner_kinds("local")  # the control plane's own runner plays no part
@pytest.mark.parametrize("while_", ["running", "lingering"])
async def test_a_killed_holder_under_egress_leaves_a_working_network_and_no_namespace(
    yard_factory: Any, while_: str, host_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2 on a runner that is not root (nobody), network ``egress``: the holder of the
    workspace's namespace (which also runs its egress relay) is killed -9, while a command
    of the workspace runs or while its namespace only lingers after the last one. The next
    command still reaches the outside through the proxy (a new holder, in the same namespace
    when a process is still in it, else a fresh one); once everything ended and the linger
    passed, no holder is recorded and no process or descriptor on the host (the daemon's
    own kept ones included) holds any of the workspace's namespaces."""
    monkeypatch.setenv("SHELLYARD_NETWORK_LINGER_S", "2")
    yard: Yard = await yard_factory()
    root = yard.home / "nobody-runner"
    as_nobody = _nobody_root(root)
    policy = SandboxPolicy(network="egress", egress_exceptions=[f"127.0.0.1:{host_server}"])
    daemon = await start_daemon(root, policy, subprocess=True, prefix=as_nobody)
    proxied = PROXIED.format(url=f"http://127.0.0.1:{host_server}/")
    try:
        await yard.plane.runners.add_direct("nobody", daemon.url, daemon.token)
        yard = Yard(yard.plane, "nobody", yard.home)
        first = await yard.run(proxied, wait_ms=30_000)
        assert first.stdout == "from-host\n", first.stdout + first.stderr
        background = None
        if while_ == "running":
            background = await yard.run("echo up; sleep 120", background=True)
            await _wait_for_log(yard, background.execution_id, "up")
        (record,) = list((root / "sandbox" / "netns").glob("*.json"))
        killed = json.loads(record.read_text())
        namespaces = {int(killed["net"])}
        os.kill(int(killed["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{killed['pid']}/ns/net").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        try:
            after = await yard.run(proxied, read_only=background is not None, wait_ms=30_000)
            assert after.stdout == "from-host\n", after.stdout + after.stderr
            again = json.loads(record.read_text())
            assert again["pid"] != killed["pid"]
            namespaces.add(int(again["net"]))
            if while_ == "running":
                assert again["net"] == killed["net"]  # rejoined through the running sandbox
        finally:
            if background is not None:
                await yard.plane.executions.cancel(
                    background.execution_id, ExecutionCancelQuery(wait_s=30)
                )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            held = [link for inode in namespaces for link in _holding(inode)]
            recorded = list((root / "sandbox" / "netns").glob("*.json"))
            if not held and not recorded:
                break
            await asyncio.sleep(0.1)
        assert recorded == [] and held == [], (recorded, held)
    finally:
        await daemon.stop()


@pytest.mark.runner_kinds("local")  # the daemon is started here, as root or as nobody
@pytest.mark.parametrize("user", ["root", "nobody"])
async def test_kill9_of_the_runner_daemon_keeps_network_and_forward(
    yard_factory: Any, user: str
) -> None:
    """Issue 17, E11 on a runner daemon: kill -9 of the daemon itself while a server and a
    read-only client run; restarted on the same folder, it re-attaches both, the client ends
    with the server's answer, a new reader still reaches the server on localhost (the same
    namespace: mounted on a file as root, held by its holder process as nobody), and the
    forward kept answering throughout; the last execution's end takes both away."""
    yard: Yard = await yard_factory()
    # The service's own backoff (the suites shorten it): a restart of a few seconds is an
    # outage of fewer than E9's five failed queries, so no record turns unknown meanwhile.
    yard.plane.executions.retry_base_s = 0.5
    root = yard.home / f"{user}-runner"
    prefix: tuple[str, ...] = ()
    if user == "nobody":
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to run the daemon as nobody")
        prefix = _nobody_root(root)
    daemon = await start_daemon(root, SandboxPolicy(), subprocess=True, prefix=prefix)
    try:
        await yard.plane.runners.add_direct("far", daemon.url, daemon.token)
        yard = Yard(yard.plane, "far", yard.home)
        server = await _server(yard)
        reader = await yard.run(
            "sleep 3; " + LOCAL.format(port=PORT, path="live.txt"),
            read_only=True,
            background=True,
        )
        view = await yard.plane.ports.open(PORT, workspace_id=server.workspace_id)
        assert _get(view.url + "live.txt") == "served-live\n"
        daemon.kill()
        assert _get(view.url + "live.txt") == "served-live\n"  # the relay is its own process
        await daemon.restart()
        # E9: while the daemon was down the record may have turned unknown; once it answers
        # again the record is reconciled to the real outcome (R3)
        done = await yard.plane.executions.wait(reader.execution_id, ExecutionWait(timeout_s=60))
        assert done.state == ExecutionState.completed and done.exit_code == 0, done
        server_view = await yard.plane.executions.status(server.execution_id)
        assert server_view.state == ExecutionState.running, server_view
        logs = await yard.plane.executions.logs(reader.execution_id, ExecutionLogsQuery())
        assert logs.data == "served-live\n"
        again = await yard.run(
            LOCAL.format(port=PORT, path="live.txt"), read_only=True, wait_ms=30_000
        )
        assert again.stdout == "served-live\n", again.stderr
        listed = await yard.plane.ports.list(PortListQuery(workspace_id=server.workspace_id))
        assert [p.host_port for p in listed] == [view.host_port]
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
        ended = await yard.plane.executions.wait(server.execution_id, ExecutionWait(timeout_s=60))
        assert ended.state == ExecutionState.cancelled, ended
        assert await yard.plane.ports.list(PortListQuery(workspace_id=server.workspace_id)) == []
        assert _refused(view.host_port, view.host)
    finally:
        await daemon.stop()


async def test_a_reader_keeps_its_view_while_the_head_moves(yard: Yard) -> None:
    """W2 with shared views: a long reader keeps seeing the snapshot it started on while a
    writer commits a change; a reader after the change sees the new files; when the long
    reader ends its old view goes (local runner: only the head's view is left)."""
    await yard.run("echo old > f.txt")
    long = await yard.run(
        "cat f.txt; echo started; sleep 2; cat f.txt", read_only=True, background=True
    )
    await _wait_for_log(yard, long.execution_id, "started")
    await yard.run("echo new > f.txt")
    fresh = await yard.run("cat f.txt", read_only=True)
    assert fresh.stdout == "new\n"
    done = await yard.plane.executions.wait(long.execution_id, ExecutionWait(timeout_s=30))
    assert done.state == ExecutionState.completed
    assert (
        await yard.plane.executions.logs(long.execution_id, ExecutionLogsQuery())
    ).data == "old\nstarted\nold\n"
    if yard.runner_id == "local":
        views = sorted((yard.plane.settings.local_runner_root / "views").iterdir())
        head = await yard.runner.head(long.workspace_id)
        assert [v.name.split(".")[1] for v in views] == [head.root_hash]
