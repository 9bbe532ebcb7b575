"""A command joins its workspace's network namespace by a descriptor the runner opened and
checked (netns.py ``WorkspaceNetworks.open``, launch.c ``--netns-fd``; R2), never by a path
opened later: the holder of a namespace may die between the check and the join and its
path then name something else (a pid reused by a process on the host's network, a mount
gone). Here what the path names is swapped for the host's own namespace (a bind mount of
this process's ``/proc/self/ns/net`` over the workspace's namespace file) at the two points
of the race: before the runner opens it (the command is refused clearly, nothing runs, the
next command gets a fresh namespace) and after (the command runs in the namespace checked).
Never in the host's. Root needed (a root runner's namespace files), skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard
from shellyard.errors import ShellyardError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.runner_kinds("local"),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("nsenter") is None,
        reason="a network namespace per workspace file needs root and util-linux's nsenter",
    ),
]

HOST = os.readlink("/proc/self/ns/net")
PRINT_NS = "readlink /proc/self/ns/net"


@pytest.fixture(autouse=True, params=["launcher", "chain"])
def no_warm(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """No warm sandbox: it would be in the namespace already, and the next command take it.
    Both ways in front of bwrap: the launcher (launch.c) and the chain (nsenter, setpriv)."""
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")
    if request.param == "chain":
        monkeypatch.setenv("SHELLYARD_LAUNCHER", "chain")


def _host_netns_over(path: Path) -> None:
    """What the path names becomes the host's network namespace (stacked on the old one)."""
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(path)], check=True)


async def _first(yard: Yard) -> tuple[str, str, Any]:
    first = await yard.run(PRINT_NS)
    assert first.exit_code == 0, first
    namespace = first.stdout.strip()
    assert namespace.startswith("net:[") and namespace != HOST, first
    return first.workspace_id, namespace, yard.runner._sandboxes


async def test_a_namespace_swapped_before_the_check_refuses_the_command_clearly(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace_id, _, box = await _first(yard)
    networks = box.networks
    acquire = networks.acquire

    def acquire_then_die(workspace: str, sandbox_id: str) -> Path:
        path: Path = acquire(workspace, sandbox_id)
        _host_netns_over(path)  # the holder died, and its path names the host's now
        return path

    monkeypatch.setattr(networks, "acquire", acquire_then_die)
    refused: str | None = None
    try:
        done = await yard.run(PRINT_NS + "; echo ran")
        assert "ran" not in done.stdout, done  # never a run, least of all on the host's
        refused = f"{done.error}"
    except ShellyardError as exc:
        refused = exc.message
    assert "network namespace went away" in refused, refused
    monkeypatch.setattr(networks, "acquire", acquire)
    again = await yard.run(PRINT_NS)
    assert again.exit_code == 0 and again.workspace_id == workspace_id, again
    fresh = again.stdout.strip()
    assert fresh.startswith("net:[") and fresh != HOST, again


async def test_a_namespace_swapped_after_the_check_is_not_the_one_joined(
    yard: Yard, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace_id, namespace, box = await _first(yard)
    prepare = box.prepare_bwrap
    swapped: list[Path] = []

    def prepare_then_die(**options: Any) -> Any:
        pending = prepare(**options)
        _host_netns_over(pending.network)  # between the runner's check and the launcher
        swapped.append(pending.network)
        return pending

    monkeypatch.setattr(box, "prepare_bwrap", prepare_then_die)
    # and no descriptor of a namespace reaches the sandbox (launch.c and bwrap close them)
    leaked = "ls -l /proc/self/fd/ /proc/1/fd/ 2>/dev/null | grep -c 'net:\\[\\|user:\\[' || true"
    try:
        done = await yard.run(f"{PRINT_NS}; {leaked}")
    finally:
        for path in swapped:
            subprocess.run(["umount", str(path)], check=True)
    assert swapped, "the spawn went another way"
    assert done.exit_code == 0 and done.workspace_id == workspace_id, done
    joined, descriptors = done.stdout.split()
    assert joined == namespace != HOST, done
    assert descriptors == "0", done
