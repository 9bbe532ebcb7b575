"""Attack pass of session 52 (second engineer) on the launcher's detach (launch.c ``--detach``,
bwrap.py ``Detach``): holding only an agent's powers (command text, ``env`` names and values,
``cwd``, the workspace's files), change what the launcher unmounts or keeps before bwrap copies
the table, so that a host path shows in the sandbox (R2 "Host paths"), another workspace's data
shows, or the host loses a mount (docs/security.md "Attack pass (session 52, the launcher's
detach)"). Real overlays, a real launcher, a real runner with bubblewrap; root needed.

Each test says whether it is a finding (fixed here) or a property that held."""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from leftover_mounts import remove_home
from local_runner import ended, local_runner, process_tag, tagger
from mount_table import points_below

from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import StartRequest
from shellyard.runner.sandbox import launch

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
]

eid = tagger(process_tag())
_count = itertools.count()


@pytest.fixture(params=["plain", "linked"])
async def busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[LocalRunner, str]]:
    """A root runner with four other workspaces running (their trees and homes mounted: the
    launcher detaches from 4 mounts below the runner's folder on) and a fifth, the agent's;
    the runner's folder named plainly, or through a link (bwrap binds from the link's
    spelling, mountinfo shows the real one: the keeps are translated, bwrap.py ``Detach``)."""
    # what a stopped runner leaves mounted for its next start stays on this host otherwise,
    # copied into every later sandbox of the suite
    request.addfinalizer(lambda: remove_home(tmp_path))
    base = tmp_path
    if request.param == "linked":
        (tmp_path / "real").mkdir()
        base = tmp_path / "link"
        base.symlink_to(tmp_path / "real")
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")
    others = [eid(f"other{i}") for i in range(4)]
    mine = eid("mine")
    async with local_runner(base, *others, mine) as local:
        started = []
        for workspace in others:
            execution = eid(f"ex-{workspace}")
            await local.start(StartRequest(execution_id=execution, workspace_id=workspace,
                                           command="sleep 120"))  # fmt: skip
            started.append(execution)
        try:
            root = os.path.realpath(local.root)
            if os.path.realpath(local.workspace_path(others[0])) not in points_below(
                Path("/proc/self/mountinfo").read_text(), root
            ):
                pytest.skip("this kernel mounted no overlay per workspace (own mounts off)")
            yield local, mine
        finally:
            for execution in started:
                await local.cancel(execution)


async def _run(local: LocalRunner, workspace: str, command: str, **options: Any) -> str:
    execution = eid(f"ex{next(_count)}")
    request = StartRequest(
        execution_id=execution, workspace_id=workspace, command=command, **options
    )
    await local.start(request)
    record = await ended(local, execution)
    out = (await local.read_log(execution, "stdout", 0, 1 << 20)).data.decode()
    err = (await local.read_log(execution, "stderr", 0, 1 << 20)).data.decode()
    assert record.exit_code == 0, (out, err)
    return out


def _no_host_path(text: str, local: LocalRunner) -> None:
    for root in {str(local.root), os.path.realpath(local.root)}:
        assert root not in text, text


async def test_an_env_value_of_two_dashes_keeps_the_workspace_overlay(
    busy: tuple[LocalRunner, str],
) -> None:
    """Finding (R2 "Host paths"): the keeps were read from bwrap's argv up to its first
    ``--``; the caller's ``--setenv`` pairs come before the workspace's bind, so an ``env``
    value ``--`` cut the list there: the launcher unmounted the sandbox's own tree overlay and
    bwrap bound the plain folder, whose host path the sandbox's mountinfo then showed (field 4)."""
    local, mine = busy
    seen = await _run(local, mine, 'cat /proc/self/mountinfo; printf "<%s>" "$CUT"',
                      env={"CUT": "--", "AFTER": "--bind"})  # fmt: skip
    _no_host_path(seen, local)
    # E1: the value reached the command (bwrap's options by memfd ended at it: refused)
    assert seen.endswith("<-->"), seen


def test_on_a_shared_host_a_runner_folder_with_escapes_keeps_every_mount(tmp_path: Path) -> None:
    """Held (R2): on a host whose / is shared (``mount --make-rshared /``, as systemd makes
    it; this test host's is private, so a mount namespace of the test's own), the launcher's
    unmounts reach no peer, and a runner's folder whose path mountinfo escapes (a space, a
    backslash: ``\040``, ``\134``) is read right: the bound mount stays, the others go."""
    launcher = launch.build(tmp_path / "bin")
    assert launcher is not None, "the host's C compiler built no launcher"
    root = tmp_path / "run ner\\x"
    folders = [root / f"ws {i}" for i in range(5)]
    mine = folders[0] / "file"
    inside = f"cat /proc/self/mountinfo; cat {shlex.quote(str(mine))}"
    script = [
        "set -e",
        "mount --make-rshared /",
        *(f"mkdir -p {shlex.quote(str(f))}; mount -t tmpfs t {shlex.quote(str(f))}"
          for f in folders),
        f"echo mine > {shlex.quote(str(mine))}",
        shlex.join([str(launcher), "--detach", str(root), "--keep", str(mine),
                    "--", "/bin/sh", "-c", inside]),
        "echo '#host'",
        "cat /proc/self/mountinfo",
    ]  # fmt: skip
    unshare = ["unshare", "-m", "--propagation", "unchanged", "sh", "-c", "\n".join(script)]
    done = subprocess.run(unshare, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    sandbox, host = done.stdout.split("#host\n")

    def escaped(path: Path) -> str:
        return str(path).replace("\\", "\\134").replace(" ", "\\040")

    assert points_below(sandbox, escaped(root)) == {escaped(folders[0])}, sandbox
    assert "mine" in sandbox
    assert points_below(host, escaped(root)) == {escaped(f) for f in folders}, host


async def test_odd_names_links_and_a_read_view_change_nothing_of_what_is_kept(
    busy: tuple[LocalRunner, str],
) -> None:
    """Held (R2): what the agent controls in its workspace (a file named like a mount point
    of another workspace, with a space, a backslash and a newline; a link to another
    workspace's folder; a ``cwd`` below them) changes nothing of the launcher's table: the
    keeps are the runner's bind sources, matched as texts against mountinfo. The writer and
    a read-only execution (its view, W2) see their own files, no host path, nothing of
    another workspace."""
    local, mine = busy
    other = local.workspace_path(eid("other0"))
    (other / "theirs").write_text("theirs\n")
    odd = "odd dir\\x\nline"
    await _run(
        local,
        mine,
        f"mkdir -p {shlex.quote(odd)}/sub && echo mine > data && ln -s {shlex.quote(str(other))} "
        f"link && ln -s {shlex.quote(str(other))} {shlex.quote(odd)}/l",
    )
    for read_only in (False, True):
        seen = await _run(
            local,
            mine,
            "cat /proc/self/mountinfo; cat /workspace/data; cat link/theirs 2>&1 || true",
            cwd=f"{odd}/sub",
            read_only=read_only,
        )
        _no_host_path(seen, local)
        assert "mine\n" in seen and "theirs" not in seen.replace("link/theirs", ""), seen
