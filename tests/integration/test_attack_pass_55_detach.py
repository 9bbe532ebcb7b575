"""Attack pass on the launcher's wider detach (launch.c ``--detach``, commits eab9ecd..3a0b080):
host mounts outside the runner's folder that no bind source lies on or in are unmounted in
the launcher's own namespace, and every bwrap bind source is now a ``--keep`` (bwrap.py
``Detach.keeps``).

Findings (each test failed before its fix; docs/security.md "Attack pass (session 55)"):
- an ``env`` value that reads as a bind option (``--bind``, ``--ro-bind``...) makes the next
  argv word (``--setenv`` or ``--bind``: relative) a keep; the launcher refuses it and exits
  127, so such a command never runs on a cold spawn (before the change only keeps below the
  runner's folder were taken, always absolute);
- a host path (SHELLYARD_HOST_PATHS) that reaches its target through a link lying on a mount
  other than the target's: the launcher keeps only the mount of the resolved target, unmounts
  the one the link is on, and bwrap, resolving the path again in that table, binds what that
  mount hid on the host (or fails to start when nothing is there). Fixed: ``Detach.keeps``
  parses the argv as ``options_end`` does (a ``--setenv`` value is stepped over), and a keep
  outside the folder that is not its own real path keeps every host mount (the launcher no
  longer resolves it; bwrap's lookup passes through the mounts the links lie on).

Properties that held (kept held here): nothing unmounted in the launcher's namespace reaches
a host whose root is shared, odd names and stacked mounts included; a missing bind source
(``--bind-try``) below a mount keeps that mount, so what it hides stays hidden; a namespace
named by a path the detach took away fails closed (127, nothing run).

Real launcher (built with the host's compiler), real bubblewrap, real runner; root needed."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from leftover_mounts import remove_home
from local_runner import ended, local_runner, process_tag, tagger

from shellyard.runner.local import LocalRunner
from shellyard.runner.protocol import SandboxPolicy, StartRequest
from shellyard.runner.sandbox import launch
from shellyard.runner.sandbox.bwrap import Detach

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing"),
]

eid = tagger(process_tag())

#: Mounts below the runner's folder bwrap binds nothing from: at DETACH_FROM (4) and more
#: the launcher detaches (other busy workspaces' overlays, as far as it can tell).
SPARE = 5


def _mount_tmpfs(point: Path, made: list[Path], name: str = "tmpfs") -> None:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", name, str(point)], check=True)
    made.append(point)


def _unmount(made: list[Path]) -> None:
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def _table() -> list[str]:
    """This process's mount table, each line's id, parent, device, root, point, options."""
    return sorted(
        " ".join(line.split(" ")[:6])
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    built = launch.build(tmp_path / "bin")
    if built is None:
        pytest.skip("the host has no C compiler to build the launcher")
    return built


# ------------------------------------------------------------------------------ findings


def test_no_env_value_makes_a_keep_the_launcher_refuses() -> None:
    """Finding F1 (bwrap.py ``Detach.keeps``): the pairs walk takes an ``env`` value
    ``--bind`` for the option and the next word of the argv for its source."""
    detach = Detach("/srv/runner", "/srv/runner")
    options = ["/usr/bin/bwrap", "--ro-bind", "/usr", "/usr"]
    for name, value in (("A", "--bind"), ("B", "--ro-bind-try"), ("C", "--dev-bind")):
        options += ["--setenv", name, value]
    options += ["--bind", "/srv/runner/workspaces/ws", "/workspace"]
    keeps = detach.keeps(options)
    assert keeps is not None
    assert all(path.startswith("/") for path in keeps), keeps


async def test_a_command_whose_env_value_is_a_bind_option_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Finding F1 end to end: ``env={"FLAGS": "--bind"}`` on a cold spawn. The launcher got
    ``--keep --setenv`` (or ``--keep --bind``), answered "--keep wants an absolute path" and
    exited 127 before the command: any agent whose variable holds exactly a bind option's
    name cannot run a command (no detach decided: one workspace alone is enough)."""
    request.addfinalizer(lambda: remove_home(tmp_path / "runner"))
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")  # the cold spawn puts env in argv
    workspace = eid("env-dash")
    async with local_runner(tmp_path, workspace) as local:
        if local._sandboxes.detach is None:
            pytest.skip("this runner has no launcher detach (no C compiler)")
        for value in ("--bind", "--ro-bind"):
            execution = eid(f"ex-env{value}")
            start = StartRequest(
                execution_id=execution,
                workspace_id=workspace,
                command='printf "%s" "$FLAGS"',
                env={"FLAGS": value},
            )
            await local.start(start)
            record = await ended(local, execution)
            out = (await local.read_log(execution, "stdout", 0, 1 << 16)).data.decode()
            err = (await local.read_log(execution, "stderr", 0, 1 << 16)).data.decode()
            assert record.exit_code == 0 and out == value, (record.exit_code, out, err)


@pytest.fixture
def linked_host_path(tmp_path: Path) -> Iterator[Path]:
    """A host layout: ``links`` is a mount holding the link ``tool`` -> ``real`` (on the root
    file system); under the mount point, hidden by that mount on the host, lies a folder
    ``tool`` with ``secret``. Unmounted afterwards."""
    host = tmp_path / "host"
    made: list[Path] = []
    (host / "links" / "tool").mkdir(parents=True)
    (host / "links" / "tool" / "secret").write_text("SHADOWED under the links mount\n")
    (host / "real").mkdir()
    (host / "real" / "file").write_text("the operator's tool\n")
    try:
        _mount_tmpfs(host / "links", made, "links")
        (host / "links" / "tool").symlink_to(host / "real")
        yield host
    finally:
        _unmount(made)


def test_a_keep_through_a_link_keeps_the_mount_the_link_is_on(
    tmp_path: Path, launcher: Path, linked_host_path: Path
) -> None:
    """Finding F2, at the launcher: realpath() keeps /…/real's mount, not the ``links`` mount
    the path is looked up through; that one goes, and bwrap (which resolves ``links/tool``
    again, in the detached table) binds the folder that mount hid on the host."""
    root, made = tmp_path / "runner", []
    try:
        for i in range(SPARE):
            _mount_tmpfs(root / "workspaces" / f"ws{i}", made)
        tool = linked_host_path / "links" / "tool"
        done = subprocess.run(
            [str(launcher), "--detach", str(root), "--keep", str(root / "workspaces" / "ws0"),
             "--keep", str(tool), "--", shutil.which("bwrap") or "/usr/bin/bwrap",
             "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
             "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
             "--ro-bind", str(tool), "/opt/tool", "--proc", "/proc", "--dev", "/dev",
             "--", "/bin/sh", "-c", "cat /opt/tool/*"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert "SHADOWED" not in done.stdout, "the sandbox read what a host mount hides"
        assert done.returncode == 0 and done.stdout == "the operator's tool\n", done
    finally:
        _unmount(made)


async def test_a_host_path_through_a_link_shows_its_target_not_what_a_mount_hides(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    linked_host_path: Path,
) -> None:
    """Finding F2 end to end: an operator's host path ``…/links/tool`` (a link on a mount of
    its own, to a folder elsewhere) on a root runner whose folder holds other workspaces'
    mounts. Expected: the command lists the operator's tool. Found: the sandbox reads the
    file the ``links`` mount hides on the host."""
    request.addfinalizer(lambda: remove_home(tmp_path / "runner"))
    monkeypatch.setenv("SHELLYARD_WARM_SANDBOXES", "0")
    tool = str(linked_host_path / "links" / "tool")
    workspace = eid("linked")
    local = LocalRunner(tmp_path / "runner", SandboxPolicy(host_paths=[tool]))
    await local.startup()
    made: list[Path] = []
    try:
        await local.ensure_workspace(workspace)
        if local._sandboxes.detach is None:
            pytest.skip("this runner has no launcher detach (no C compiler)")
        for i in range(SPARE):  # as busy as four other workspaces make it
            _mount_tmpfs(local.root / f"spare{i}", made)
        execution = eid("ex-linked")
        await local.start(StartRequest(execution_id=execution, workspace_id=workspace,
                                       command=f"cat {tool}/*"))  # fmt: skip
        record = await ended(local, execution)
        out = (await local.read_log(execution, "stdout", 0, 1 << 16)).data.decode()
        err = (await local.read_log(execution, "stderr", 0, 1 << 16)).data.decode()
        assert "SHADOWED" not in out, "the sandbox read what a host mount hides"
        assert record.exit_code == 0 and out == "the operator's tool\n", (out, err)
    finally:
        _unmount(made)
        await local.aclose()


# ------------------------------------------------------------------------ held properties

_SHARED_HOST = r"""
set -e
mount --make-rshared /
B={base}; R=$B/runner
for i in 0 1 2 3 4; do mkdir -p $R/ws$i; mount -t tmpfs t $R/ws$i; done
mkdir -p "$B/sp ace" "$B/new
line" "$B/back\\040slash" $B/stack $B/hidden/under
mount -t tmpfs t "$B/sp ace"; mount -t tmpfs t "$B/new
line"; mount -t tmpfs t "$B/back\\040slash"
mount -t tmpfs lower $B/stack; mount -t tmpfs upper $B/stack
echo SHADOWED > $B/hidden/under/secret; mount -t tmpfs t $B/hidden
cut -d' ' -f1-6 /proc/self/mountinfo | sort > $B/before
{launcher} --detach $R --keep $R/ws0 --keep $B/hidden/under/gone -- /bin/sh -c \
  "cut -d' ' -f5 /proc/self/mountinfo > $B/inside; cat $B/hidden/under/secret 2>/dev/null || true"
cut -d' ' -f1-6 /proc/self/mountinfo | sort > $B/after
"""


def test_on_a_shared_host_nothing_unmounted_reaches_it_and_what_a_kept_mount_hides_stays(
    tmp_path: Path, launcher: Path
) -> None:
    """Held: in a throwaway namespace standing for a host whose root is shared, the
    launcher's unmounts (other workspaces', odd names, two stacked on one folder, the host's
    cgroup hierarchies) leave that host's table exactly as it was; a keep that does not exist
    (a ``--bind-try``'s) below a mount keeps that mount, so what it hides is not shown."""
    base = tmp_path / "shared"
    base.mkdir()
    script = _SHARED_HOST.format(base=base, launcher=launcher)
    done = subprocess.run(["unshare", "-m", "/bin/bash", "-c", script], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no mount namespace for a throwaway host: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert "SHADOWED" not in done.stdout
    assert (base / "before").read_text() == (base / "after").read_text()
    inside = (base / "inside").read_text().splitlines()
    assert str(base / "runner" / "ws0") in inside and str(base / "hidden") in inside
    for gone in ("sp\\040ace", "new\\012line", "back\\134040slash", "stack", "runner/ws1"):
        assert str(base / gone) not in inside, inside
    assert not [p for p in inside if p.startswith("/sys/fs/cgroup")], inside


def test_this_hosts_table_is_unchanged_by_a_detach(tmp_path: Path, launcher: Path) -> None:
    """Held, on this host as it is (its own propagation): a detach that takes the cgroup
    hierarchies and the other workspaces' mounts away in the launcher's namespace leaves the
    host's table as it was."""
    root, made = tmp_path / "runner", []
    try:
        for i in range(SPARE):
            _mount_tmpfs(root / f"ws{i}", made)
        before = _table()
        inside = subprocess.run(
            [str(launcher), "--detach", str(root), "--keep", str(root / "ws0"), "--",
             "/bin/cat", "/proc/self/mountinfo"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert f" {root}/ws1 " not in inside and f" {root}/ws0 " in inside
        assert _table() == before
    finally:
        _unmount(made)


def test_a_namespace_path_the_detach_took_away_fails_closed(tmp_path: Path, launcher: Path) -> None:
    """Held (latent): ``--netns PATH`` is opened after the detach; a namespace file mounted
    below the runner's folder is then gone from the launcher's table. The launcher exits
    127 before anything runs (the runner passes descriptors, ``--netns-fd``, taken before)."""
    root, made = tmp_path / "runner", []
    try:
        for i in range(SPARE):
            _mount_tmpfs(root / f"ws{i}", made)
        netns = root / "netns"
        netns.write_text("")
        subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(netns)], check=True)
        made.append(netns)
        done = subprocess.run(
            [str(launcher), "--detach", str(root), "--keep", str(root / "ws0"),
             "--netns", str(netns), "--ids", "61000:61000", "--", "/bin/echo", "RAN"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 127 and "RAN" not in done.stdout, done
    finally:
        _unmount(made)
