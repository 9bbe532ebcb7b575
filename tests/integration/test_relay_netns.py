"""The relays that live with a workspace's network namespace (a forwarded port, the egress
relay: runner/network/ports.py) enter it by the descriptor the runner checked and kept when
the namespace got its first user (netns.py ``WorkspaceNetworks.duplicate``; R2, T1), never by
the namespace file's path, which a mount over it may have made another namespace by then.
Here the path is swapped for the host's own namespace (a bind mount of this process's
``/proc/self/ns/net`` over the workspace's namespace file, as in test_netns_join.py) after the
namespace exists: a forward opened afterwards reaches the workspace's server, never a
server on the host's loopback at the same port; an egress relay started afterwards listens
in the workspace's namespace, never on the host's 127.0.0.1:3128 (and the command, whose
namespace path names the host's now, is refused, not run there). Root needed (a root
runner's namespace files), skipped otherwise."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from host_listener import host_listener
from test_ports import (
    _get,
    _listening_addresses,
    _proc_hex,
    _server,
    _wait_for_log,
)

from conftest import Yard
from shellyard.contract.executions import ExecutionCancelQuery
from shellyard.errors import ShellyardError
from shellyard.runner.network.egress_proxy import SANDBOX_PORT
from shellyard.runner.protocol import SandboxPolicy

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.runner_kinds("local"),  # the in-process runner's namespaces are swapped here
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("nsenter") is None,
        reason="a network namespace per workspace file needs root and util-linux's nsenter",
    ),
]

HOST_NS = os.stat("/proc/self/ns/net").st_ino


@pytest.fixture(autouse=True)
def no_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")


def _host_netns_over(path: Path) -> None:
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(path)], check=True)


def _unmount_ours(path: Path) -> None:
    """Our bind mount, if the runner did not drop it itself (only while it is on top)."""
    try:
        on_top = os.stat(path).st_ino == HOST_NS
    except OSError:
        return
    if on_top:
        subprocess.run(["umount", str(path)], check=True)


#: This file's own port: its decoy listens on the host's 127.0.0.1 here while test_ports.py,
#: on another worker, asserts its own port refused on the host.
PORT = 8769


@pytest.fixture
def host_decoy() -> Iterator[None]:
    """An HTTP server on the host's 127.0.0.1:PORT: what a relay in the host's network
    would reach instead of the workspace's server."""
    with host_listener(b"from-host\n", PORT):
        yield


async def test_a_forward_opened_after_the_namespace_file_was_swapped_reaches_the_workspace(
    yard: Yard, host_decoy: None
) -> None:
    server = await _server(yard, PORT)
    workspace = server.workspace_id
    path = yard.runner._sandboxes.networks.path(workspace)
    _host_netns_over(path)
    try:
        view = await yard.plane.ports.open(PORT, workspace_id=workspace)
        # the workspace's server, never the host's decoy on the same port
        assert _get(view.url + "live.txt") == "served-live\n"
    finally:
        await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
        _unmount_ours(path)


def _listening_in(fd: int, port: int) -> list[str]:
    """The local addresses listening on ``port`` in the network namespace of ``fd``."""
    done = subprocess.run(
        ["nsenter", f"--net=/proc/self/fd/{fd}", "cat", "/proc/net/tcp"],
        pass_fds=[fd],
        capture_output=True,
        text=True,
        check=True,
    )
    found = []
    for line in done.stdout.splitlines()[1:]:
        fields = line.split()
        address, hexport = fields[1].rsplit(":", 1)
        if int(hexport, 16) == port and fields[3] == "0A":  # TCP_LISTEN
            found.append(address)
    return found


async def test_an_egress_relay_started_after_the_swap_listens_in_the_workspace(
    yard_factory: Any,
) -> None:
    yard: Yard = await yard_factory(SandboxPolicy(network="egress"))
    networks = yard.runner._sandboxes.networks
    loopback = _proc_hex("127.0.0.1")
    assert loopback not in _listening_addresses(SANDBOX_PORT), "3128 is taken on this host"
    swapped: list[Path] = []
    seen: dict[str, list[str]] = {}

    def swap(workspace: str, path: Path) -> None:  # before the relay starts
        _host_netns_over(path)
        swapped.append(path)

    def look(workspace: str, path: Path) -> None:  # once it runs
        seen["host"] = _listening_addresses(SANDBOX_PORT)
        fds = networks.duplicate(workspace)
        assert fds is not None
        try:
            seen["workspace"] = _listening_in(fds[1], SANDBOX_PORT)
        finally:
            os.close(fds[1])

    networks.on_ready.insert(0, swap)
    networks.on_ready.append(look)
    try:
        try:
            done = await yard.run("readlink /proc/self/ns/net; echo RAN-HERE")
            outcome = f"{done.stdout} {done.error}"
        except ShellyardError as exc:
            outcome = exc.message
    finally:
        networks.on_ready.remove(swap)
        networks.on_ready.remove(look)
        for path in swapped:
            _unmount_ours(path)
    assert swapped, "the namespace was never made"
    assert loopback not in seen["host"], seen  # no relay on the host's 127.0.0.1:3128
    assert seen["workspace"] == [loopback], seen  # it listens in the workspace's network
    # the command's own join checks the path: it names the host's now, so nothing ran
    assert "RAN-HERE" not in outcome and "network namespace went away" in outcome, outcome
    again = await yard.run("readlink /proc/self/ns/net")  # a fresh namespace, a fresh relay
    assert again.exit_code == 0 and again.stdout.strip() != os.readlink("/proc/self/ns/net")


async def test_an_egress_relay_killed_while_the_namespace_is_in_use_is_started_again(
    yard_factory: Any, host_decoy: None
) -> None:
    """R2 under ``egress`` on a root runner: the namespace's relay to the proxy is killed -9
    while a command of the workspace runs (so the namespace stays). The next command joining
    the namespace starts it again (its sandbox has no relay of its own: bwrap.py), and so
    still reaches the outside (here the host's server, an operator exception) through the
    proxy."""
    exception = f"127.0.0.1:{PORT}"
    yard: Yard = await yard_factory(SandboxPolicy(network="egress", egress_exceptions=[exception]))
    background = await yard.run("echo up; sleep 120", background=True)
    proxied = f"curl -sS -m 10 --noproxy '' http://{exception}/ 2>&1 || echo FAILED $?"
    try:
        await _wait_for_log(yard, background.execution_id, "up")
        relays = yard.runner._relays
        assert relays is not None
        file = relays.directory / background.workspace_id / "egress.json"
        record = json.loads(file.read_text())
        os.kill(int(record["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{record['pid']}/ns/net").exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        after = await yard.run(proxied, read_only=True, wait_ms=30_000)
        assert after.stdout == "from-host\n", after.stdout + after.stderr
    finally:
        await yard.plane.executions.cancel(background.execution_id, ExecutionCancelQuery(wait_s=30))
