"""Attack pass on the busy runner's clean mount namespace (commit d91f980: launch.c
``--clean-namespace`` / ``--clean-fd``, clean_namespace.py, bwrap.py ``Detach``).

Each scenario drives a real ``LocalRunner`` (real launcher, overlays, bubblewrap) in a child
process of its own, run under ``unshare -m --propagation private``: the host's other mount
activity (a CI run beside) neither reaches its table nor changes what the clean namespace's
refresh compares, and nothing it mounts is left on the host. The child prints one JSON
object; the test asserts on it.

Findings (each failed on d91f980, the first version; fixed, docs/security.md "Attack pass
(session 56)"):
- F1 ``test_a_replaced_host_mount_reaches_the_sandboxes``: the refresh compares (mount id,
  mount point); the kernel hands the lowest free mount id back, so a host mount unmounted
  and mounted again at the same point (an operator replacing a host path's file system)
  usually gets the same id: the clean namespace is never refreshed and every busy spawn
  binds the old, unmounted file system, for the runner's life (until something else
  changes on the host). Fixed: each whole line with the never-reused id of the mount at its
  point (statx ``STATX_MNT_ID_UNIQUE``; no clean namespace on a kernel without it).
- F2 ``test_a_remount_noexec_reaches_the_sandboxes``: flag changes of a host mount
  (``mount -o remount,bind,ro``, ``noexec``) keep its id and point: never followed. Fixed
  with F1 (the whole line is compared).
- F3 ``test_a_host_mount_unmounted_later_is_not_held_by_running_sandboxes``: with a host path
  through a link (the launcher keeps every host mount) the sandbox's launcher namespace is a
  *private* copy of the clean one: a host mount unmounted while the sandbox runs stays
  mounted there (its file system alive) for the sandbox's life; the old slave namespace
  received the unmount (on a host whose / is shared). Fixed: a namespace from which no host
  mount could be left out ("ready whole") is not used; spawns detach the old way.
- F4 ``test_on_a_shared_host_a_spawn_unmounts_nothing_of_the_hosts``: on a shared host, the
  ``OPEN_TREE_CLONE`` copy of a keep's topmost mount is a peer of the host's; when other
  mounts lie on that topmost mount, the launcher's prune of them propagates to the host.
  Fixed: the launcher's namespace is made a slave (``MS_REC | MS_SLAVE``) once the copies
  are attached, and what a copy brought that bwrap needs none of is then unmounted.

Each finding's test passed with the old way (checked by setting
``clean_namespace.BUSY_MOUNTS`` out of reach, so no ``--clean-fd`` is passed).

Second pass (each failed on 8ad1b46, which fixed F1-F4; fixed since):
- G1 ``test_a_whole_namespace_descriptor_is_not_inherited_by_the_command``: a spawn the
  namespace did not cover still took a descriptor of it, passed to a launcher not told
  ``--clean-fd``: the command inherited it. Now one is made only for a spawn that passes it.
- G2 ``test_a_host_path_swapped_for_a_link_binds_what_a_pruned_mount_hides``: the links
  were checked once, when the namespace was made; a host path made a link later lay on a
  mount left out: bwrap bound what it hides. Now the launcher checks them at each spawn.
- G3 ``test_a_host_unmount_below_a_host_path_reaches_running_sandboxes`` (shared host): a
  private namespace kept a revoked volume in running sandboxes. Now it is a slave, and none
  is made where the runner's folder lies on a shared mount.
- G4 ``test_a_host_path_above_the_folder_leaves_nothing_below_it_in_the_clean_namespace``: a
  host path above the runner's folder kept every workspace's mounts in it. Now everything
  below the folder goes first.

Held (``test_held_...`` and by reading): a busy spawn's mountinfo names no path of the
runner's folder and no other workspace, it inherits no descriptor of the clean namespace,
cannot mount, nothing it does changes the host's table outside the folder, and no maker
process is left; a refresh swaps the descriptor under the lock a spawn's ``dup`` takes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and mount namespaces are root's"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing"),
]

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"

PRELUDE = textwrap.dedent(
    """
    import asyncio, contextlib, json, os, subprocess, sys, time
    from pathlib import Path
    sys.path[:0] = [{src!r}, {support!r}, {tests!r}]
    os.environ["SHELLYARD_WARM_SANDBOXES"] = "0"
    os.environ["SHELLYARD_OWN_MOUNTS"] = "on"
    from shellyard.runner.local import LocalRunner
    from shellyard.runner.protocol import SandboxPolicy, StartRequest
    from shellyard.runner.sandbox import clean_namespace
    from local_runner import ended
    from leftover_mounts import remove_home

    TMP = Path({tmp!r})
    OUT = {{}}

    def sh(*argv):
        subprocess.run(argv, check=True, capture_output=True)

    def tmpfs_with(name, files, mode=0o644):  # a host path: a tmpfs at TMP/data with files
        data = TMP / "data"
        data.mkdir()
        sh("mount", "-t", "tmpfs", name, str(data))
        for file, text in files.items():
            (data / file).write_text(text)
            (data / file).chmod(mode)
        return data

    def mount_id(point):
        for line in open("/proc/self/mountinfo"):
            fields = line.split(" ")
            if fields[4] == str(point):
                found = fields[0]
        return found

    def monitor_table(workspace):
        # the table of the workspace's bwrap monitor (the launcher's namespace)
        for pid in os.listdir("/proc"):
            with contextlib.suppress(OSError):
                if not pid.isdigit() or Path(f"/proc/{{pid}}/comm").read_text().strip() != "bwrap":
                    continue
                if f"/{{workspace}}/" not in Path(f"/proc/{{pid}}/cgroup").read_text():
                    continue  # another workspace's (its cgroups name the workspace)
                text = Path(f"/proc/{{pid}}/mountinfo").read_text()
                if f"/workspaces/{{workspace}} " in text:
                    return text
        return ""

    async def run(local, workspace, name, command):
        await local.start(StartRequest(execution_id=name, workspace_id=workspace, command=command))
        record = await ended(local, name)
        out = (await local.read_log(name, "stdout", 0, 1 << 20)).data.decode()
        err = (await local.read_log(name, "stderr", 0, 1 << 20)).data.decode()
        return record.exit_code, out, err

    async def busy_runner(policy, others=3, command="sleep 120"):
        local = LocalRunner(TMP / "runner", policy)
        await local.startup()
        started = []
        for i in range(others):
            ws = f"other{{i}}"
            await local.ensure_workspace(ws)
            await local.start(
                StartRequest(execution_id=f"ex-{{ws}}", workspace_id=ws, command=command)
            )
            started.append(f"ex-{{ws}}")
        await local.ensure_workspace("mine")
        for _ in range(100):
            if local._mounts.mounted_count() >= 6:
                break
            await asyncio.sleep(0.05)
        OUT["clean"] = local._clean is not None
        OUT["busy"] = local._mounts.mounted_count()
        return local, started

    async def close(local, started):
        try:
            for name in started:
                with contextlib.suppress(Exception):
                    await local.cancel(name)
            for name in started:
                with contextlib.suppress(Exception):
                    await ended(local, name)
        finally:
            await local.aclose()
            remove_home(TMP / "runner")
    """
)


#: ``ATTACK_OLD_WAY=1``: the same scenarios with no ``--clean-fd`` (``BUSY_MOUNTS`` out of
#: reach): each finding's test passed then.
OLD_WAY = (
    "import shellyard.runner.sandbox.clean_namespace as _C; _C.BUSY_MOUNTS = 10**9\n"
    if os.environ.get("ATTACK_OLD_WAY")
    else ""
)


def _drive(tmp_path: Path, body: str, propagation: str = "private") -> dict:
    """Run ``body`` (an ``async def scenario()`` filling ``OUT``) in a mount namespace of its
    own whose / is ``propagation`` (``shared``: a systemd host's, simulated)."""
    script = (
        PRELUDE.format(
            src=str(SRC),
            support=str(HERE.parent / "support"),
            tests=str(HERE.parent),
            tmp=str(tmp_path),
        )
        + OLD_WAY
        + textwrap.dedent(body)
        + textwrap.dedent(
            """
        try:
            asyncio.run(scenario())
        finally:
            print("RESULT " + json.dumps(OUT))
        """
        )
    )
    path = tmp_path / "scenario.py"
    path.write_text(script)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", propagation, sys.executable, str(path)],
        capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (done.returncode, done.stdout[-3000:], done.stderr[-3000:])
    out = json.loads(lines[-1][len("RESULT ") :])
    if propagation == "shared":  # the folder's mount would pass the runner's overlays on
        assert not out.get("clean"), ("a clean namespace on a shared mount", out)
    else:
        assert out.get("clean"), ("no clean namespace made", out, done.stderr[-2000:])
    return out


# ------------------------------------------------------------------------------ findings


def test_a_replaced_host_mount_reaches_the_sandboxes(tmp_path: Path) -> None:
    """F1: an operator's host path is a mount; the operator replaces it (unmount, mount a
    new file system at the same point: new data, a rotated secret). The kernel gives the new
    mount the id just freed, so ``host_signature`` is unchanged, ``refresh`` never makes a new
    namespace, and every busy spawn keeps binding the *unmounted* file system (still alive
    in the clean namespace) for as long as nothing else on the host changes."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            data = tmpfs_with("old", {"f": "OLD-REVOKED\\n"})
            policy = SandboxPolicy(host_paths=[str(data)])
            local, started = await busy_runner(policy)
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)  # start-up's changes followed
                made_from = local._clean._made_from
                OUT["diffs"] = []
                clean = local._clean
                real_renew = clean._renew
                def renew():
                    now = clean_namespace.host_signature(clean.root)
                    made = set(clean._made_from)
                    OUT["diffs"].append([sorted(set(now) - made), sorted(made - set(now))])
                    return real_renew()
                clean._renew = renew
                reused = False
                for attempt in range(40):  # the id freed comes back once no lower one is free
                    before = mount_id(data)
                    sh("umount", str(data))
                    sh("mount", "-t", "tmpfs", "new", str(data))
                    (data / "f").write_text(f"NEW{attempt}\\n")
                    if mount_id(data) == before:
                        reused = True
                        break
                    await asyncio.sleep(clean_namespace.REFRESH_S * 1.5)
                OUT["reused"] = reused
                OUT["attempts"] = attempt + 1
                await asyncio.sleep(clean_namespace.REFRESH_S * 3)  # three refreshes
                OUT["refreshed"] = local._clean._made_from is not made_from
                OUT["busy_at_spawn"] = local._mounts.mounted_count()
                OUT["run"] = await run(local, "mine", "ex-read", f"cat {data}/f")
                OUT["now"] = (data / "f").read_text()
            finally:
                await close(local, started)
                subprocess.run(["umount", "-l", str(data)], check=False)
        """,
    )
    print("OUT", out)
    assert out["reused"], out  # the precondition: the kernel gave the id back
    code, stdout, stderr = out["run"]
    assert code == 0 and stdout == out["now"], (
        code,
        stdout,
        stderr,
        "the sandbox read the replaced mount",
    )


def test_a_host_mount_unmounted_later_is_not_held_by_running_sandboxes(tmp_path: Path) -> None:
    """F3: an operator's host path reached through a link (the launcher then keeps every
    host mount: ``host_prunable`` 0). Another file system is mounted on the host (another
    runner's workspace overlay, a disk) while the agent's long command starts, and the host
    unmounts it. The sandbox's launcher namespace (its bwrap monitor stays there for the
    sandbox's life) is a *private* copy of the clean namespace: the unmount never reaches it
    and the file system stays alive. Before d91f980 it was a slave of the host's: the
    unmount propagated (``SHELLYARD_LAUNCHER``-free check: the same run with fewer than
    ``BUSY_MOUNTS`` passes)."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            real = TMP / "tool-real"
            real.mkdir()
            (real / "t").write_text("tool\\n")
            link = TMP / "tool"
            link.symlink_to(real)
            other = TMP / "otherhome" / "ws_x"
            other.mkdir(parents=True)
            sh("mount", "-t", "tmpfs", "otherrunner", str(other))
            (other / "secret").write_text("another runner's workspace\\n")
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(link)]))
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)  # the clean one has it
                OUT["busy_at_spawn"] = local._mounts.mounted_count()
                await local.start(StartRequest(execution_id="ex-long", workspace_id="mine",
                                               command=f"cat {link}/t; sleep 30"))
                started.append("ex-long")
                table = ""
                for _ in range(100):
                    table = monitor_table("mine")
                    if table:
                        break
                    await asyncio.sleep(0.1)
                OUT["found_monitor"] = bool(table)
                OUT["before"] = str(other) in table
                sh("umount", str(other))
                await asyncio.sleep(0.5)
                after = monitor_table("mine")
                OUT["found_after"] = bool(after)
                OUT["after"] = str(other) in after
                OUT["host"] = str(other) in open("/proc/self/mountinfo").read()
            finally:
                await close(local, started)
                subprocess.run(["umount", "-l", str(other)], check=False, capture_output=True)
        """,
        propagation="shared",
    )
    print("OUT", out)
    assert out["found_monitor"] and out["before"], out  # kept while mounted (host_too 0)
    assert not out["host"] and out["found_after"], out
    assert not out["after"], ("the host unmounted it; the sandbox's namespace still holds it", out)


LAUNCHER_SCRIPT = """
import os, subprocess, sys
from pathlib import Path
sys.path.insert(0, {src!r})
from shellyard.runner.sandbox import launch
from shellyard.runner.sandbox.clean_namespace import CleanNamespace
base = Path({tmp!r})
launcher = launch.build(base / "bin")
root = base / "root"; tops = root / "views"; tops.mkdir(parents=True)
def sh(*a): subprocess.run(a, check=True, capture_output=True)
# The runner's folder on a private mount (else no clean namespace is made), a shared mount
# of its own below it (an operator's volume) that the workspaces' mounts lie on.
sh("mount", "--bind", str(root), str(root)); sh("mount", "--make-private", str(root))
sh("mount", "-t", "tmpfs", "views", str(tops)); sh("mount", "--make-shared", str(tops))
for name in ("mine", "w1", "w2", "w3", "w4", "w5"):  # one per workspace, on it
    (tops / name).mkdir(); sh("mount", "-t", "tmpfs", name, str(tops / name))
clean = CleanNamespace(launcher, str(root)); assert clean.start()
fd = clean.descriptor()
done = subprocess.run([str(launcher), "--detach", str(root), "--clean-fd", str(fd),
                       "--keep", str(tops / "mine"), "--", "/bin/true"], pass_fds=[fd])
os.close(fd); clean.close()
points = [line.split()[4] for line in open("/proc/self/mountinfo")]
left = sorted(p for p in points if p.startswith(str(tops) + "/"))
print("RESULT", done.returncode, " ".join(p[len(str(tops)) + 1:] for p in left))
subprocess.run(["umount", "-R", str(root)], check=False)
"""


def test_on_a_shared_host_a_spawn_unmounts_nothing_of_the_hosts(tmp_path: Path) -> None:
    """F4: a systemd host (every mount shared; simulated in a namespace of the test's own,
    ``--propagation shared``) with a mount below the runner's folder that other mounts lie
    on (here ``views/`` on a tmpfs of its own with a mount per workspace; an operator's
    volume, or a mount the runner adds later). The launcher's topmost mount for the keep
    ``views/mine`` is ``views/``: ``open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`` copies it
    with every workspace's mount on it, and a clone of a shared mount joins the original's
    peer group. Attached in the launcher's namespace, the prune (``unmount_unneeded``)
    unmounts the copies of ``w1``..``w5`` there, and an unmount below a shared mount
    propagates to its peers: the host loses them. The old way made its namespace a slave
    first (session 52's held property). Real launcher, real clean namespace."""
    script = tmp_path / "peer.py"
    script.write_text(LAUNCHER_SCRIPT.format(src=str(SRC), tmp=str(tmp_path)))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "shared", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, (done.stdout, done.stderr)
    _tag, code, *left = lines[-1].split()
    assert code == "0", done.stderr
    assert left == ["mine", "w1", "w2", "w3", "w4", "w5"], (
        "a spawn from the clean namespace unmounted the host's mounts",
        left,
    )


def test_a_remount_noexec_reaches_the_sandboxes(tmp_path: Path) -> None:
    """F2: the operator remounts a host path ``noexec`` (``mount -o remount,bind,noexec``):
    the mount keeps its id and point, so ``host_signature`` never differs and every busy
    spawn keeps binding the copy with the old flags (the sandbox still runs programs
    from it), for the runner's life. A cold spawn before d91f980 copied the flags of the
    moment."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            data = tmpfs_with("tools", {"tool": "#!/bin/sh\\necho ran\\n"}, 0o755)
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(data)]))
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)
                sh("mount", "-o", "remount,bind,noexec", str(data))
                OUT["host"] = subprocess.run(["/bin/sh", "-c", str(data / "tool")],
                                             capture_output=True).returncode
                await asyncio.sleep(clean_namespace.REFRESH_S * 3)
                OUT["run"] = await run(local, "mine", "ex-exec", f"{data}/tool")
            finally:
                await close(local, started)
                subprocess.run(["umount", "-l", str(data)], check=False)
        """,
    )
    print("OUT", out)
    assert out["host"] != 0, out  # noexec on the host
    code, stdout, _err = out["run"]
    assert code != 0 and "ran" not in stdout, ("the sandbox ran a program from a noexec mount", out)


# --------------------------------------------------------------------------------- held


def test_held_a_busy_spawn_shows_nothing_of_the_clean_namespace_or_the_others(
    tmp_path: Path,
) -> None:
    """Held: a spawn from the clean namespace (busy runner) lists no
    host path of the runner's folder and no other workspace in its mountinfo, inherits no
    descriptor beyond 0-2 (and ``ls``'s own), cannot enter the launcher's or the runner's
    namespace (no such pid in its pid namespace), its files are its own; nothing it did
    reached the host's table; no maker process of the clean namespace is left."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            local, started = await busy_runner(SandboxPolicy())
            try:
                root = os.path.realpath(local.root)
                before = sorted(l.split(" ")[4] for l in open("/proc/self/mountinfo"))
                OUT["run"] = await run(local, "mine", "ex-look",
                    "cat /proc/self/mountinfo; ls -l /proc/self/fd/; ls /proc | grep -c '^[0-9]'; "
                    "echo mine > /workspace/f; ls /workspace; "
                    "mount -t tmpfs x /tmp 2>&1 | head -1")
                after = sorted(l.split(" ")[4] for l in open("/proc/self/mountinfo"))
                # the finished sandbox's overlays linger: compare outside the runner's folder
                OUT["host_same"] = [p for p in before if not p.startswith(root)] == [
                    p for p in after if not p.startswith(root)]
                OUT["root"] = root
                OUT["makers"] = subprocess.run(["pgrep", "-f", "--clean-namespace"],
                                               capture_output=True, text=True).stdout.split()
            finally:
                await close(local, started)
        """,
    )
    code, stdout, stderr = out["run"]
    assert code == 0, (stdout, stderr)
    assert out["root"] not in stdout and "other" not in stdout, stdout
    assert " /workspace " in stdout and "\nf\n" in stdout, stdout
    fds = [line.split(" -> ") for line in stdout.splitlines() if " -> " in line]
    print("FDS", fds)
    assert all(line[0].split()[-1] in ("0", "1", "2", "3") for line in fds), fds
    assert out["host_same"], out
    assert not out["makers"], out


def test_a_whole_namespace_descriptor_is_not_inherited_by_the_command(tmp_path: Path) -> None:
    """G1: host path through a link -> "ready whole" -> covers() False; the dup'd clean fd
    is still in pass_fds, and the launcher (no --clean-fd) never closes it."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            real = TMP / "tool-real"
            real.mkdir()
            link = TMP / "tool"
            link.symlink_to(real)
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(link)]))
            try:
                OUT["pruned"] = local._clean.pruned if local._clean else None
                OUT["run"] = await run(local, "mine", "ex-fds", "ls -l /proc/self/fd/")
            finally:
                await close(local, started)
        """,
    )
    print("OUT", out)
    code, stdout, stderr = out["run"]
    assert code == 0, (stdout, stderr)
    assert "mnt:[" not in stdout, ("the command inherited the clean namespace's descriptor", stdout)


def test_a_host_path_swapped_for_a_link_binds_what_a_pruned_mount_hides(tmp_path: Path) -> None:
    """G2: host path ``data`` is a folder when the namespace is made ("ready pruned"); the
    operator moves the data to a volume mounted at ``vol`` and makes ``data`` a link to it.
    No mount changed: no refresh; ``covers`` accepts (same keep string). In the clean
    namespace ``vol`` was pruned (nothing of the view lay on it), so bwrap's lookup of the
    link lands in the folder below the mount point: the sandbox reads what the volume
    hides on the host, not the data."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            data = TMP / "data"
            data.mkdir()
            (data / "f").write_text("OLD-FOLDER\\n")
            vol = TMP / "vol"
            (vol / "d").mkdir(parents=True)
            (vol / "d" / "f").write_text("HIDDEN-UNDER-THE-MOUNT\\n")
            sh("mount", "-t", "tmpfs", "vol", str(vol))
            (vol / "d").mkdir()
            (vol / "d" / "f").write_text("NEW-VOLUME\\n")
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(data)]))
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)
                OUT["pruned"] = local._clean.pruned if local._clean else None
                data.rename(TMP / "data.old")
                data.symlink_to(vol / "d")
                await asyncio.sleep(clean_namespace.REFRESH_S * 3)
                OUT["host"] = (data / "f").read_text()
                OUT["busy_at_spawn"] = local._mounts.mounted_count()
                OUT["run"] = await run(local, "mine", "ex-read", f"cat {data}/f")
            finally:
                await close(local, started)
                subprocess.run(["umount", "-l", str(vol)], check=False)
        """,
    )
    print("OUT", out)
    code, stdout, _stderr = out["run"]
    assert out["host"] == "NEW-VOLUME\n", out
    assert "HIDDEN-UNDER-THE-MOUNT" not in stdout, ("bound what the pruned mount hides", out)
    assert code == 0 and stdout == out["host"], out


def test_a_host_unmount_below_a_host_path_reaches_running_sandboxes(tmp_path: Path) -> None:
    """G3 (shared host): ``data`` is a host path with a volume mounted at ``data/sub``; a
    long command runs; the operator unmounts ``data/sub`` (revokes it). From the slave
    namespace of the old way (and of a runner that is not busy) the unmount reaches the
    sandbox's recursive bind; from the private clean namespace it never does."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            data = TMP / "data"
            (data / "sub").mkdir(parents=True)
            sh("mount", "-t", "tmpfs", "revoked", str(data / "sub"))
            (data / "sub" / "f").write_text("REVOKED-SECRET\\n")
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(data)]))
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)
                OUT["pruned"] = local._clean.pruned if local._clean else None
                f = f"{data}/sub/f"
                command = (f"cat {f}; for i in $(seq 1 150); do "
                           f"[ -e {f} ] || {{ echo GONE; exit 0; }}; sleep 0.1; done; "
                           f"echo STILL; cat {f}")
                await local.start(StartRequest(execution_id="ex-long", workspace_id="mine",
                                               command=command))
                await asyncio.sleep(3)
                sh("umount", str(data / "sub"))
                record = await ended(local, "ex-long")
                for name in ("stdout", "stderr"):
                    log = await local.read_log("ex-long", name, 0, 1 << 20)
                    OUT[name] = log.data.decode()
            finally:
                await close(local, started)
                subprocess.run(["umount", "-l", str(data / "sub")], check=False,
                               capture_output=True)
        """,
        propagation="shared",
    )
    print("OUT", out)
    assert out["stdout"].startswith("REVOKED-SECRET\n"), out  # the sandbox had it
    assert "GONE" in out["stdout"], ("the host's unmount never reached the sandbox", out)


def test_a_host_path_above_the_folder_leaves_nothing_below_it_in_the_clean_namespace(
    tmp_path: Path,
) -> None:
    """G4: host path ``TMP`` (the runner's folder is ``TMP/runner``: an operator sharing
    ``/srv`` with the runner in ``/srv/shellyard``; the view covers the folder with a
    tmpfs). ``needed`` keeps every mount at or below a keep, so ``make_clean`` unmounts
    nothing below the folder: the clean namespace holds private copies of every busy
    workspace's overlays and network mounts of its making, and the refresh (which skips
    the folder) never lets them go."""
    out = _drive(
        tmp_path,
        """
        async def scenario():
            local, started = await busy_runner(SandboxPolicy(host_paths=[str(TMP)]))
            try:
                await asyncio.sleep(clean_namespace.REFRESH_S * 2.5)
                root = os.path.realpath(local.root)
                OUT["pruned"] = local._clean.pruned if local._clean else None
                table = subprocess.run(
                    ["nsenter", f"--mount=/proc/{os.getpid()}/fd/{local._clean._fd}",
                     "cat", "/proc/self/mountinfo"],
                    capture_output=True, text=True, check=True).stdout
                OUT["below"] = [l.split(" ")[4] for l in table.splitlines()
                                if l.split(" ")[4].startswith(root + "/")]
            finally:
                await close(local, started)
        """,
    )
    print("OUT", out)
    assert out["pruned"], out  # the namespace is used by busy spawns
    assert out["below"] == [], ("mounts below the folder in the clean namespace", out["below"])
