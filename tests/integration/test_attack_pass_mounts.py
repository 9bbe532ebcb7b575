"""Attack pass on the sandbox's own mounts (runner/own_mounts.py; R2, docs/security.md "Host
paths"): holding only an agent's powers, learn the home's path or make the runner (root)
misbehave through the overlay each workspace, home and read view now is.

Real bubblewrap sandboxes on the in-process local runner and a runner daemon; root needed
(the overlays are a root runner's), skipped with the reason otherwise."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from env_fixtures import backend_sdist

from conftest import Yard, kill_server, stop_server
from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
from shellyard.contract.executions import (
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellResult,
)
from shellyard.sdk.client import Client

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's own mounts are a root runner's"),
]


@pytest.fixture(autouse=True)
def own_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The overlays are on by default (SHELLYARD_OWN_MOUNTS); on here whatever the CI sets."""
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")


#: Every descriptor link a command can read: its own, its parent's, the sandbox's init's.
FD_LINKS = (
    "for f in /proc/self/fd/* /proc/$$/fd/* /proc/1/fd/* /proc/1/cwd /proc/1/root; do "
    'echo "$f $(readlink "$f")"; done'
)


async def _warm_for(yard: Yard, workspace_id: str) -> None:
    """The in-process runner's next sandbox of ``workspace_id`` is made ahead (warm.py)."""
    for _ in range(500):
        if workspace_id in yard.runner._runs.warm.waiting():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no warm sandbox was made for {workspace_id}")


def _no_home(text: str, yard: Yard) -> None:
    for root in {str(yard.home), str(yard.home.resolve())}:
        assert root not in text, text


async def test_the_log_descriptors_name_no_host_path(yard: Yard) -> None:
    """A sandbox's stdout and stderr are the runner's log files, inherited as descriptors:
    ``readlink /proc/self/fd/1`` printed ``<home>/runners/local/executions/ex_…/stdout`` (the
    kernel prints an open file's path up to the root of the mount it was opened through, the
    host's here). Opened through the runner's one detached copy of its root, made at its
    start before any of these folders existed (sandbox/log_root.py), the link reads
    ``/executions/<id>/stdout``: the same for a cold sandbox, a warm one (made in
    ``sandbox/warm/``, renamed to the execution's folder before its command is sent: never
    the warm folder's name), a read-only and a background one."""

    def link(done: RunShellResult, fd: int, stream: str) -> str:
        return f"/proc/1/fd/{fd} /executions/{done.execution_id}/{stream}"

    first = await yard.run(FD_LINKS)
    assert first.exit_code == 0, first
    _no_home(first.stdout + first.stderr, yard)
    assert link(first, 1, "stdout") in first.stdout.splitlines(), first.stdout
    assert link(first, 2, "stderr") in first.stdout.splitlines(), first.stdout
    if yard.daemon is None:  # the in-process runner: its pool is reachable
        await _warm_for(yard, first.workspace_id)
        warm_id = yard.runner._runs.warm.waiting()[first.workspace_id]
    warm = await yard.run(FD_LINKS)
    ro = await yard.run(FD_LINKS, read_only=True)
    for done in (warm, ro):
        assert done.exit_code == 0, done
        _no_home(done.stdout + done.stderr, yard)
        assert link(done, 1, "stdout") in done.stdout.splitlines(), done.stdout
        assert "/sandbox/warm/" not in done.stdout, done.stdout
    if yard.daemon is None:  # it was the warm one's, taken
        assert warm_id not in yard.runner._runs.warm.waiting().values()
        assert yard.runner._runs.warm.stats["taken"] >= 1
    bg = await yard.run(FD_LINKS + " >&2", background=True)
    view = await yard.plane.executions.wait(bg.execution_id, ExecutionWait(timeout_s=60))
    assert view.state == ExecutionState.completed, view
    logs = await yard.plane.executions.logs(bg.execution_id, ExecutionLogsQuery(stream="stderr"))
    _no_home(logs.data, yard)
    assert f"/proc/1/fd/2 /executions/{bg.execution_id}/stderr" in logs.data, logs.data


async def test_a_package_tools_log_descriptor_names_no_host_path(yard: Yard) -> None:
    """An environment change's tool (uv, here building an sdist whose in-tree backend is the
    probe) writes into the change's log, an inherited descriptor: through the runner's copy
    of its root its link reads ``/environments/changes/<change>/log``, no path of the home
    (runner/sandbox/log_root.py)."""
    body = """
    RESULT = {}
    for pid in os.listdir("/proc"):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                RESULT[f"{pid}/{fd}"] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    """
    sdist = base64.b64encode(backend_sdist("sy-links", "1.0", body)).decode()
    put = await yard.run(f"mkdir dist && echo {sdist} | base64 -d > dist/sy_links-1.0.tar.gz")
    assert put.exit_code == 0, put
    request = EnvironmentCreateRequest(
        name="links", language="python", runner_id=yard.runner_id, wait_ms=30_000
    )
    view = await yard.plane.environments.create(request)
    if view.state != "ready":
        assert view.change_id is not None, view
        await yard.plane.environments.wait(view.change_id, 120)
    body_ = EnvironmentChangeBody(
        manager="pip", specs=["sy-links"], index_url="none", find_links=["/workspace/dist"],
        wait_ms=30_000,
    )  # fmt: skip
    change = await yard.plane.environments.install(view.environment_id, body_)
    if not change.done:
        change = await yard.plane.environments.wait(change.change_id, 120)
    assert change.state == "succeeded", change
    seen = await yard.run(
        "python -c 'import sy_links; print(sy_links.RESULT)'", environment_id=view.environment_id
    )
    assert seen.exit_code == 0, seen
    links = json.loads(seen.stdout)
    # the tool's stdout and stderr; uv's locks in the prefix and cache are bound at their own
    # paths (V4, docs/security.md "Known limits")
    outputs = {fd: link for fd, link in links.items() if fd.rsplit("/", 1)[1] in ("1", "2")}
    _no_home(json.dumps(outputs), yard)
    logs = {link for link in outputs.values() if link.startswith("/environments/changes/")}
    assert logs == {f"/environments/changes/{change.change_id}/log"}, links


def _overlays_of(folder: Path) -> int:
    """How many mounts sit on ``folder`` in the host's namespace (this test's)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sum(1 for line in lines if line.split()[4] == str(folder))


@pytest.mark.parametrize("stop", ["kill9", "term"])
async def test_a_restart_keeps_one_overlay_and_commits_the_background_files(
    served_home: Path, stop: str
) -> None:
    """E11 beside R2's overlays: ``shellyard serve`` killed with SIGKILL (or stopped with
    SIGTERM, which unmounts only what no sandbox uses) while a background execution writes;
    the overlays stay mounted (the sandbox holds them), the restart mounts
    no second one over the same folder (overlayfs leaves two over one upper layer undefined),
    the files the execution wrote after the kill are in the next commit and in a read-only
    view, and a clean stop leaves no mount of the home behind."""
    home = served_home
    client = Client.for_home(home)
    first = client.run("echo before > a.txt", wait_ms=30000)
    assert first.exit_code == 0, first
    runner = home / "runners" / "local"
    folders = [runner / "workspaces" / first.workspace_id, runner / "homes" / first.workspace_id]
    assert [_overlays_of(f) for f in folders] == [1, 1]
    script = "sleep 2; for i in $(seq 50); do echo $i > f$i; done; echo done > bg.txt; echo h > ~/h"
    bg = client.run(script, background=True)
    if stop == "kill9":
        kill_server(home)
    else:
        stop_server(home)
    assert [_overlays_of(f) for f in folders] == [1, 1]  # held by the running sandbox
    client = Client.for_home(home)  # a new serve on the same home: the runner's restart
    assert client.wait(bg.execution_id, 30).exit_code == 0
    assert [_overlays_of(f) for f in folders] == [1, 1]
    seen = client.run("cat bg.txt ~/h; ls | wc -l", wait_ms=30000)
    assert seen.stdout == "done\nh\n52\n", seen
    committed = client.run("cat bg.txt f50; ls | wc -l", wait_ms=30000, read_only=True)
    assert committed.stdout == "done\n50\n52\n", committed
    stop_server(home)
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left = [line for line in mounts if str(home) in line]
    assert not left, left


#: What a sandbox tries on its overlay's upper layer (the workspace folder itself): a
#: whiteout (a 0:0 character device, which anyone may make since Linux 5.8) would hide a
#: name from the runner, trusted.overlay.* xattrs would make a folder opaque or redirect it;
#: user.overlay.* ones mean something only to an overlay mounted with ``userxattr``.
SPECIAL = r"""
import os, socket
tried = {}
def attempt(what, call):
    try:
        call()
        tried[what] = "ok"
    except OSError as exc:
        tried[what] = exc.errno
attempt("whiteout", lambda: os.mknod("wo", 0o600 | 0o020000, os.makedev(0, 0)))
os.mkdir("d"); open("d/in", "w").close(); open("x", "w").close()
attempt("trusted-opaque", lambda: os.setxattr("d", "trusted.overlay.opaque", b"y"))
attempt("trusted-redirect", lambda: os.setxattr("d", "trusted.overlay.redirect", b"/"))
attempt("user-opaque", lambda: os.setxattr("d", "user.overlay.opaque", b"y"))
attempt("user-whiteout", lambda: os.setxattr("x", "user.overlay.whiteout", b"y"))
attempt("fifo", lambda: os.mkfifo("fifo"))
attempt("socket", lambda: socket.socket(socket.AF_UNIX).bind("sock"))
attempt("hardlink", lambda: os.link("x", "x2"))
print(sorted(tried.items()))
print(sorted(os.listdir(".")), sorted(os.listdir("d")))
"""


async def test_special_files_on_the_upper_layer_change_nothing_for_the_runner(yard: Yard) -> None:
    """R2 (own_mounts.py): the workspace folder is the overlay's upper layer, so what a
    sandbox makes there is what the overlay reads the next time. A whiteout or a
    trusted.overlay.* xattr is refused (EPERM: no CAP_MKNOD, no CAP_SYS_ADMIN in the host's
    namespace); user.overlay.* xattrs, a FIFO, a socket and a hard link are made and change
    nothing: the runner still sees ``d/in`` (a file write lands in it), a commit and a
    read-only view hold the folder's files and skip the FIFO and the socket."""
    done = await yard.run(f"python3 - <<'EOF'\n{SPECIAL}EOF")
    assert done.exit_code == 0, done
    tried, listed = done.stdout.splitlines()
    assert "('whiteout', 1)" in tried and "('trusted-opaque', 1)" in tried, tried
    assert "('trusted-redirect', 1)" in tried and "('user-opaque', 'ok')" in tried, tried
    assert listed == "['d', 'fifo', 'sock', 'x', 'x2'] ['in']", listed
    await yard.plane.files.write("d/new", b"runner\n", workspace_id=done.workspace_id)
    seen = await yard.run("ls d; cat d/new", read_only=True)
    assert seen.stdout == "in\nnew\nrunner\n", seen
    top = await yard.run("ls", read_only=True)
    assert top.stdout.split() == ["d", "x", "x2"], top


async def test_runner_edits_between_commands_stay_coherent_through_the_overlay(
    yard: Yard,
) -> None:
    """overlayfs caches what it looked up (a name made beside it stays missing through it):
    every access goes through the one overlay, so a file a command made, deleted and made
    again, a folder it renamed, and the runner's write, tar upload, move, delete and
    restore in between are each seen at once by the next command and the next commit."""
    files = yard.plane.files
    first = await yard.run("echo one > a.txt; mkdir d; echo in > d/f")
    ws = first.workspace_id
    await files.write("a.txt", b"edited\n", workspace_id=ws)
    again = await yard.run("cat a.txt; rm a.txt; echo again > a.txt")
    assert again.stdout == "edited\n", again
    await files.write("a.txt", b"edited2\n", workspace_id=ws)
    moved = await yard.run("cat a.txt; mv d e")
    assert moved.stdout == "edited2\n", moved
    await files.write("e/f", b"in-e\n", workspace_id=ws)
    await files.write("d/g", b"in-new-d\n", workspace_id=ws)
    both = await yard.run("cat e/f d/g")
    assert both.stdout == "in-e\nin-new-d\n", both
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("t/x.txt", b"tx\n"), ("a.txt", b"tar-a\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    await files.upload_archive(buffer.getvalue(), "", workspace_id=ws)
    await files.move("t/x.txt", "t/y.txt", workspace_id=ws)
    await files.delete("e", recursive=True, workspace_id=ws)
    listed = await yard.run("find . | sort; cat a.txt t/y.txt")
    expected = [".", "./a.txt", "./d", "./d/g", "./t", "./t/y.txt", "tar-a", "tx"]
    assert listed.stdout.split() == expected, listed
    assert first.snapshot_seq is not None
    await files.restore(first.snapshot_seq, "", workspace_id=ws)
    back = await yard.run("find . | sort; cat a.txt", read_only=True)
    assert back.stdout.split() == [".", "./a.txt", "./d", "./d/f", "one"], back
