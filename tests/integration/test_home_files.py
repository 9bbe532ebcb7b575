"""The home's files are the service user's alone, and no host path of the home shows inside
the sandbox (docs/security.md "The home's files" and "Host paths"; R2).

Another local user (``nobody``, uid 65534) tries to read the database, its WAL, the token,
server.json, the log, the execution logs and to list the snapshot store of a home a real
``shellyard serve`` served: every attempt is refused by the kernel (EACCES). The sandbox uid
itself passes through the home's folders to bind a workspace, and reads nothing of them.
Runs as root (it switches uids with setpriv).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard, sy
from shellyard import filemodes
from shellyard.backup import backup, restore
from shellyard.config import Settings
from shellyard.contract.executions import RunShellRequest
from shellyard.control.plane import build
from shellyard.runner.policy import SandboxPolicy
from shellyard.runner.sandbox.bwrap import DEFAULT_SANDBOX_UID

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="switching to other uids needs root"),
]

NOBODY = 65534

#: Run as another uid: each (what, path) is tried, and what the kernel answered is printed.
PROBE = r"""
import errno, json, os, sys
out = {}
for what, path in json.loads(sys.argv[1]):
    try:
        if what == "list":
            os.listdir(path)
        else:
            with open(path, "rb") as handle:
                handle.read(1)
        out[path] = "ok"
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def probe(uid: int, attempts: list[tuple[str, Path]]) -> dict[str, str]:
    """What ``uid`` (its own group, no others) gets for each attempt."""
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-I",
            "-c",
            PROBE,
            json.dumps([(what, str(path)) for what, path in attempts]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        check=True,
    )
    result: dict[str, str] = json.loads(done.stdout)
    return result


def secrets_of(home: Path) -> list[tuple[str, Path]]:
    """Every file of the home that holds records, secrets or agent data, and the stores."""
    local = home / "runners" / "local"
    executions = sorted((local / "executions").iterdir())
    objects = [p for p in (local / "snapshots" / "objects").rglob("*") if p.is_file()]
    assert executions and objects, "the home ran nothing: the probe would prove nothing"
    attempts: list[tuple[str, Path]] = [
        ("read", home / "shellyard.db"),
        ("read", home / "shellyard.db-wal"),
        ("read", home / "admin.token"),
        ("read", home / "server.json"),
        ("read", home / "server.log"),
        ("list", home),
        ("list", local / "snapshots" / "objects"),
        ("list", local / "snapshots" / "workspaces"),
        ("list", local / "workspaces"),
        ("list", local / "executions"),
        ("read", objects[0]),
    ]
    for directory in executions:
        attempts += [("read", directory / "stdout"), ("read", directory / "meta.json")]
    return [(what, path) for what, path in attempts if path.exists()]


def test_another_user_reads_nothing_of_a_served_home(served_home: Path) -> None:
    """The issue's attacker: a local user lists and reads nothing (the database 0644 and the
    object store 0755 let it read every command and every committed file before)."""
    home = served_home
    done = sy(home, "run", "echo the-secret > notes.txt && cat notes.txt")
    assert done.returncode == 0, done.stderr
    assert "the-secret" in done.stdout  # the sandbox uid still reaches its workspace
    attempts = secrets_of(home)
    assert (home / "shellyard.db-wal").exists()  # served: the WAL holds the latest writes
    for uid in (NOBODY, DEFAULT_SANDBOX_UID):
        answers = probe(uid, attempts)
        assert answers == {str(path): "EACCES" for _, path in attempts}, (uid, answers)
    # and the server still works after the probes: a second command, read-only beside
    done = sy(home, "run", "--read-only", "cat notes.txt")
    assert done.returncode == 0 and "the-secret" in done.stdout, done.stderr


def shared_modes(home: Path, local: Path | None = None) -> list[str]:
    """Entries of the home (or of a runner daemon's root: ``local`` = ``home``) that give
    anything to group or others, outside what the sandbox must read through its modes
    (filemodes.runner_spare)."""
    wide = []
    local = local or home / "runners" / "local"
    spare = filemodes.runner_spare(local)
    for folder, dirs, files in os.walk(home):
        here = Path(folder)
        if here.is_relative_to(local) and here != local and spare(here) == "tree":
            dirs.clear()
            continue
        names = [] if here.is_relative_to(local / "snapshots" / "objects") else files
        for path in [here, *(here / n for n in names)]:
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) or stat.S_ISSOCK(mode):
                continue
            # a folder's group bits are its ACL's mask (the sandbox uid's --x): others only
            bits = 0o007 if stat.S_ISDIR(mode) else 0o077
            if mode & bits:
                wide.append(f"{oct(stat.S_IMODE(mode))} {path.relative_to(home)}")
    return wide


async def test_every_file_of_the_home_is_private(yard: Yard) -> None:
    """0700 folders, 0600 files (the database with its -wal and -shm, the execution records,
    the snapshot store's folders and manifests), after real executions."""
    home = yard.home / "home"
    done = await yard.run("mkdir d && echo x > d/f && cat d/f")
    assert done.exit_code == 0, done
    await yard.plane.tokens.ensure_admin_file(home)
    assert stat.S_IMODE(home.stat().st_mode) & 0o007 == 0
    for name in ("shellyard.db", "shellyard.db-wal", "shellyard.db-shm", "admin.token"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    assert shared_modes(home) == []
    if yard.daemon is not None:  # a runner daemon's --root: the same modes
        root = yard.daemon.root
        assert stat.S_IMODE(root.stat().st_mode) & 0o007 == 0
        assert shared_modes(root, root) == [], root


async def test_a_home_of_an_older_release_is_tightened_once(home: Path) -> None:
    """An upgrade: what an older release made world-readable is narrowed at the first start
    (docs/operations.md "Upgrades"); the marker keeps later starts from walking it again."""
    settings = Settings(home=home / "home")
    plane = await build(settings)
    try:
        done = await plane.executions.run_shell(RunShellRequest(command="echo hi > f"))
        assert done.exit_code == 0, done
    finally:
        await plane.aclose()
    # What the release before made: 0644 files, 0755 folders, the home 0755.
    for path in [settings.home, *settings.home.rglob("*")]:
        rel = path.relative_to(settings.home).parts
        if path.is_symlink() or "workspaces" in rel[3:4] or rel[2:3] in (("sandbox",), ("views",)):
            continue
        if path.is_dir():
            path.chmod(0o755)
        elif path.is_file() and "objects" not in rel:
            path.chmod(0o644)
    for marker in settings.home.rglob(filemodes.MARKER):
        marker.unlink()
    assert shared_modes(settings.home) != []
    plane = await build(settings)
    try:
        assert shared_modes(settings.home) == []
        assert (settings.home / filemodes.MARKER).is_file()
        assert (settings.local_runner_root / filemodes.MARKER).is_file()
        done = await plane.executions.run_shell(RunShellRequest(command="cat f"))
        assert done.exit_code == 0 and done.stdout == "hi\n", done
    finally:
        await plane.aclose()


async def test_a_restored_home_is_private(home: Path) -> None:
    """A restore makes the same modes as a served home, even from a backup whose files an
    older release made 0644 (before it is ever served)."""
    source = Settings(home=home / "a")
    plane = await build(source)
    try:
        done = await plane.executions.run_shell(RunShellRequest(command="echo hi > f"))
        assert done.exit_code == 0, done
    finally:
        await plane.aclose()
    saved = home / "backup"
    backup(source, saved)
    for path in saved.rglob("*"):
        if path.is_file() and not path.is_symlink() and "workspaces" not in path.parts:
            path.chmod(0o644)
    target = Settings(home=home / "b")
    restore(target, saved)
    assert stat.S_IMODE((target.home / "shellyard.db").stat().st_mode) == 0o600
    assert shared_modes(target.home) == []
    with sqlite3.connect(target.home / "shellyard.db") as db:  # the data came through
        assert db.execute("SELECT count(*) FROM executions").fetchone()[0] >= 1
    shutil.rmtree(saved)


@pytest.mark.parametrize(
    ("read_only", "network"), [(False, "off"), (True, "off"), (False, "egress")]
)
async def test_the_sandbox_sees_no_host_path_of_the_home(
    yard_factory: Any, read_only: bool, network: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2, docs/security.md "Host paths": pid 1's command line is bwrap's (``--args``: its
    options come from a descriptor), the environment is built from scratch, the files bwrap
    hides are its own, and the workspace (or read view) and its home at /home/agent are
    overlays of their own whose layers are named by descriptors (runner/own_mounts.py): no
    line of mountinfo names the home. A runner that is not root cannot mount them: there the
    two binds still show their paths. With ``egress`` the proxy's socket, bound at
    /run/shellyard/egress.sock, sits at the root of a tmpfs of its own."""
    if network == "egress" and shutil.which("socat") is None:
        pytest.skip("network 'egress' needs socat (Debian package socat)")
    monkeypatch.setenv("SHELLYARD_OWN_MOUNTS", "on")  # the default, whatever the CI sets
    yard: Yard = await yard_factory(SandboxPolicy(network=network))
    script = (
        "cat /proc/1/cmdline; echo; cat /proc/1/environ; echo; cat /proc/self/environ; echo; "
        "cat /proc/self/cmdline; echo; echo MOUNTS; cat /proc/self/mountinfo"
    )
    if read_only:
        assert (await yard.run("true")).exit_code == 0  # a committed head to read
    done = await yard.run(script, read_only=read_only)
    assert done.exit_code == 0, done
    own, _, mounts = done.stdout.partition("MOUNTS\n")
    # the home, and a runner daemon's folder (beside it, under the test's folder)
    roots = {str(yard.home), str(yard.home.resolve())}
    assert "--args" in own  # bwrap read its options from a descriptor
    for root in roots:
        assert root not in own, own
        leaks = [line for line in mounts.splitlines() if root in line]
        if os.geteuid() == 0:
            assert not leaks, leaks
        else:
            assert all(line.split()[4] in ("/workspace", "/home/agent") for line in leaks), leaks
    if os.geteuid() == 0:
        shown = {line.split()[4]: line for line in mounts.splitlines()}
        for point in ("/workspace", "/home/agent"):
            assert " - overlay overlay " in shown[point], shown[point]
            assert shown[point].split()[3] == "/", shown[point]  # its own root


@pytest.mark.skipif(os.geteuid() != 0, reason="the egress socket's tmpfs is a root runner's")
@pytest.mark.skipif(shutil.which("socat") is None, reason="network 'egress' needs socat")
async def test_a_clean_stop_leaves_no_mount_of_the_runner_behind(tmp_path: Path) -> None:
    """R2, docs/security.md "Host paths": the egress socket's own tmpfs (mounted whatever
    SHELLYARD_OWN_MOUNTS says) is unmounted when the runner stops; left mounted, every later
    sandbox start on the host would copy it (docs/benchmarks.md section 22)."""
    from shellyard.runner.local import LocalRunner

    root = tmp_path / "runner"
    runner = LocalRunner(root, SandboxPolicy(network="egress"))
    await runner.startup()
    assert os.path.ismount(root / "sandbox" / "egress")
    await runner.aclose()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    assert [line for line in mounts if str(root) in line] == []
