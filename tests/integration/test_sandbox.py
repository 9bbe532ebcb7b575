"""The sandbox (R2): what a command can and cannot see or do. Real bubblewrap throughout."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from conftest import Yard, host_uid, processes_of
from shellyard.contract.executions import (
    ExecutionCancelQuery,
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
)
from shellyard.runner.protocol import SandboxPolicy


async def test_writing_outside_the_workspace_fails(yard: Yard) -> None:
    result = await yard.run(
        "for p in /etc/shellyard-x /usr/shellyard-x /var/shellyard-x /opt/x; do "
        "  (echo x > $p) 2>/dev/null && echo WROTE $p; done; "
        "echo inside > ok.txt && echo inside-ok; touch /tmp/private && echo tmp-ok"
    )
    assert result.stdout == "inside-ok\ntmp-ok\n"
    for path in ("/etc/shellyard-x", "/usr/shellyard-x", "/var/shellyard-x", "/opt/x"):
        assert not os.path.exists(path)
    assert not os.path.exists("/tmp/private")  # /tmp inside is private


def runner_root(yard: Yard) -> Path:
    """The host folder of the yard's runner (its workspaces, executions, snapshots)."""
    if yard.daemon is not None:
        return yard.daemon.root
    return yard.home / "home" / "runners" / "local"


async def test_home_and_other_workspaces_are_invisible(yard: Yard) -> None:
    """R2: the service's home (database, tokens, logs, snapshot store), every other workspace
    and the runner's folder are invisible; the workspace is only at /workspace."""
    plane = yard.plane
    session, _agent = await plane.store.default_owner()
    other_agent = await plane.store.create_agent(str(session.id))
    other_ws, _ = await plane.store.workspace_for(str(other_agent.id), yard.runner_id)
    await yard.runner.ensure_workspace(other_ws.id)
    mine = await yard.run("echo mine > mine.txt; pwd")
    assert mine.stdout == "/workspace\n"
    root = runner_root(yard)
    own_tree = root / "workspaces" / mine.workspace_id
    other_tree = root / "workspaces" / other_ws.id
    assert (own_tree / "mine.txt").is_file() and other_tree.is_dir()
    db = yard.home / "home" / "shellyard.db"
    token = root / "token" if yard.daemon is not None else yard.home / "home" / "admin.token"
    assert db.exists()
    probes = [yard.home, yard.home / "home", db, token, root, own_tree, other_tree]
    probe = await yard.run(
        "; ".join(f"test -e {p} && echo SEEN {p}" for p in probes) + "; ls -A /workspace"
    )
    assert "SEEN" not in probe.stdout
    assert probe.stdout.split() == ["mine.txt"]


async def test_host_files_outside_the_allow_list_are_invisible(yard: Yard) -> None:
    """R2: a world-readable file in a fresh folder under /srv and under /home is not there;
    the top of the tree holds only the allow-list, and /etc's secrets are covered."""
    made = []
    for top in ("/srv", "/home"):
        folder = Path(tempfile.mkdtemp(prefix="shellyard-probe-", dir=top))
        folder.chmod(0o755)
        (folder / "readable.txt").write_text("host secret\n")
        (folder / "readable.txt").chmod(0o644)
        made.append(folder)
    try:
        probe = await yard.run(
            "; ".join(f"cat {f}/readable.txt 2>/dev/null; ls {f} 2>/dev/null" for f in made)
            + "; echo ---; ls -A /; echo ---; ls -A /home; echo ---; wc -c < /etc/shadow; "
            "ls /etc/ssh 2>&1 | wc -l"
        )
        seen, top, homes, secrets = probe.stdout.split("---\n")
        assert seen == ""
        allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "sys"}
        allowed |= {"dev", "proc", "tmp", "var", "run", "workspace", "home"}
        assert set(top.split()) <= allowed, top
        # /home holds the workspace's own home alone (docs/contract.md "The home")
        assert homes.split() == ["agent"], homes
        for hidden in ("root", "srv", "mnt", "media", "opt"):
            assert hidden not in top.split()
        assert secrets.split() == ["0", "0"]  # /etc/shadow is empty, /etc/ssh an empty tmpfs
    finally:
        for folder in made:
            shutil.rmtree(folder)


async def test_operator_host_paths_are_shown_read_only(yard_factory: Any) -> None:
    """R2: a path the operator configures (SandboxPolicy.host_paths, SHELLYARD_HOST_PATHS,
    the daemon's --host-path) is visible, read-only; its neighbours stay hidden."""
    shared = Path(tempfile.mkdtemp(prefix="shellyard-shared-", dir="/srv"))
    neighbour = Path(tempfile.mkdtemp(prefix="shellyard-neighbour-", dir="/srv"))
    try:
        for folder in (shared, neighbour):
            folder.chmod(0o755)
            (folder / "data.txt").write_text("shared data\n")
            (folder / "data.txt").chmod(0o644)
        yard: Yard = await yard_factory(SandboxPolicy(host_paths=[str(shared)]))
        result = await yard.run(
            f"cat {shared}/data.txt; (echo x > {shared}/new) 2>/dev/null && echo WROTE; "
            f"cat {neighbour}/data.txt 2>/dev/null || echo neighbour-hidden"
        )
        assert result.stdout == "shared data\nneighbour-hidden\n"
        assert not (shared / "new").exists()
    finally:
        shutil.rmtree(shared)
        shutil.rmtree(neighbour)


async def test_never_host_root_and_proc_sys_refused(yard: Yard) -> None:
    """A root bwrap keeps its capabilities; ours runs as an unprivileged uid, so writing
    /proc/sys is refused and the command's host uid is not 0."""
    result = await yard.run(
        "echo 3 > /proc/sys/vm/drop_caches && echo WROTE; id -u; sleep 3", wait_ms=500
    )
    await asyncio.sleep(0.3)
    pids = processes_of(result.execution_id)
    assert pids
    assert all(host_uid(pid) != 0 for pid in pids)
    view = await yard.plane.executions.wait(result.execution_id, ExecutionWait(timeout_s=30))
    logs = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery())
    err = await yard.plane.executions.logs(result.execution_id, ExecutionLogsQuery(stream="stderr"))
    assert view.exit_code == 0
    assert "WROTE" not in logs.data
    assert logs.data.strip() != "0"
    assert "drop_caches" in err.data


async def test_fork_bomb_hits_the_process_limit_and_service_survives(yard_factory: Any) -> None:
    # RLIMIT_NPROC counts every process of the sandbox uid on the host: a uid of its own keeps
    # other sandboxes (a parallel test, another runner) out of this runner's 64.
    policy = SandboxPolicy(max_processes=64, sandbox_uid=61064, sandbox_gid=61064)
    yard: Yard = await yard_factory(policy)
    bomb = await yard.run(
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived-inside", wait_ms=0
    )
    await asyncio.sleep(2)
    view = await yard.plane.executions.cancel(bomb.execution_id, ExecutionCancelQuery(wait_s=30))
    assert view.state in (ExecutionState.cancelled, ExecutionState.completed), view.error
    assert processes_of(bomb.execution_id) == []
    after = await yard.run("echo alive")
    assert after.stdout == "alive\n" and after.exit_code == 0


SYSCALL_PROBE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static void report(const char *name, long result) {
    printf("%s %s\n", name, result < 0 ? strerrorname_np(errno) : "ALLOWED");
}

int main(void) {
    report("io_uring_setup", syscall(SYS_io_uring_setup, 1, 0));
    report("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
    report("add_key", syscall(SYS_add_key, "user", "x", "y", 1, -3));
    report("bpf", syscall(SYS_bpf, 0, 0, 0));
    report("perf_event_open", syscall(SYS_perf_event_open, 0, 0, -1, -1, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    report("unshare", syscall(SYS_unshare, 0x10000000));
    report("setns", syscall(SYS_setns, 0, 0));
    report("mount", syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, 0));
    report("clone3", syscall(SYS_clone3, 0, 0));
    report("clone_newuser", syscall(SYS_clone, 0x10000000 | 17, 0, 0, 0, 0));
    report("open_by_handle_at", syscall(SYS_open_by_handle_at, 0, 0, 0));
    report("af_packet", socket(17, SOCK_RAW, 0));
    report("af_alg", socket(38, SOCK_SEQPACKET, 0));
    report("netlink_audit", socket(16, SOCK_RAW, 9));
    report("af_inet", socket(AF_INET, SOCK_STREAM, 0));
    report("af_unix", socket(AF_UNIX, SOCK_STREAM, 0));
    return 0;
}
"""


async def test_kernel_surfaces_are_denied_by_seccomp(yard: Yard) -> None:
    """R2: raw system calls from a C program compiled inside the sandbox (so gcc works too):
    io_uring, keyrings, bpf, perf, userfaultfd, namespaces, mounts, file handles and odd
    socket families fail with EPERM (clone3 with ENOSYS, so glibc falls back to clone);
    ordinary sockets work."""
    await yard.run("true")  # make the workspace
    probe = await yard.run(
        f"cat > probe.c <<'SRC'\n{SYSCALL_PROBE}\nSRC\ngcc -o probe probe.c && ./probe"
    )
    assert probe.exit_code == 0, probe.stderr
    outcome = dict(line.split() for line in probe.stdout.splitlines())
    expected = {name: "EPERM" for name in outcome}
    expected.update(clone3="ENOSYS", af_inet="ALLOWED", af_unix="ALLOWED")
    assert outcome == expected


async def test_no_nested_namespaces_and_no_capabilities(yard: Yard) -> None:
    """R2: `unshare -U true` and `unshare -Ur id` fail; unshare(2) through ctypes too; every
    capability set is empty."""
    result = await yard.run(
        "unshare -U true; echo unshare=$?; unshare -Ur id 2>/dev/null; echo unshare_r=$?; "
        "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        'print("py", libc.unshare(0x10000000), ctypes.get_errno())\'; '
        "grep -E '^Cap(Eff|Prm|Inh|Bnd|Amb)' /proc/self/status"
    )
    lines = result.stdout.splitlines()
    assert lines[0] != "unshare=0" and lines[1] != "unshare_r=0"
    assert "uid=0" not in result.stdout
    assert lines[2] == "py -1 1"  # unshare(CLONE_NEWUSER) through ctypes: EPERM
    caps = dict(line.split(":") for line in lines[3:])
    assert {int(v, 16) for v in caps.values()} == {0}, caps


async def test_ordinary_work_still_runs(yard: Yard) -> None:
    """R2: the allow-listed host view is enough for python, git, a C compiler and (where
    installed) R; scripts run by their /workspace path."""
    result = await yard.run(
        "python3 -c 'import json, sqlite3, ssl; print(\"py-ok\")' && "
        "git init -q repo && cd repo && git -c user.email=a@b -c user.name=a commit -q "
        "--allow-empty -m x && echo git-ok && cd .. && "
        "printf 'int main(void){return 0;}' > t.c && cc t.c -o t && ./t && echo cc-ok && "
        "printf 'print(\"script at\", __file__)' > s.py"
    )
    assert result.stdout == "py-ok\ngit-ok\ncc-ok\n", result.stderr
    script = await yard.run(script_path="s.py")
    assert script.stdout == "script at /workspace/s.py\n"
    if shutil.which("Rscript"):
        r = await yard.run("Rscript -e 'cat(sum(1:10), \"\\n\")'")
        assert r.stdout.strip() == "55", r.stderr


@pytest.mark.runner_kinds("local")
async def test_the_launcher_and_the_chain_give_the_same_sandbox(
    yard_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What runs in front of bwrap (runner/sandbox/launch.py): the built launcher and the
    nsenter/setpriv/prlimit chain it replaces (``SHELLYARD_LAUNCHER=chain``, or no C
    compiler) give a command the same user, groups, capabilities, limits and network: the
    workspace's namespace, which a background server shares with the next command."""
    probe = (
        "id -u; id -g; grep -E '^(Groups|CapEff|CapBnd):' /proc/self/status; "
        "ulimit -Sn; ulimit -Hn; ulimit -Su; ulimit -Hu; ulimit -Sf; ulimit -St; ulimit -Ht; "
        "for i in $(seq 100); do curl -sf http://127.0.0.1:8767/ >/dev/null && break; "
        "sleep 0.05; done && echo reached"
    )
    policy = SandboxPolicy(max_open_files=777, max_processes=555, max_cpu_seconds=120)
    seen = {}
    for mode in ("launcher", "chain"):
        if mode == "chain":
            monkeypatch.setenv("SHELLYARD_LAUNCHER", "chain")
        yard: Yard = await yard_factory(policy)
        bin_dir = runner_root(yard) / "sandbox" / "bin"
        built = sorted(p.name for p in bin_dir.glob("shellyard-launch-*"))
        assert bool(built) == (mode == "launcher"), built
        server = await yard.run(
            "exec python3 -m http.server 8767 --bind 127.0.0.1", background=True
        )
        try:
            result = await yard.run(probe, read_only=True, wait_ms=30_000)
            assert result.exit_code == 0, result.stderr
            seen[mode] = result.stdout
        finally:
            await yard.plane.executions.cancel(server.execution_id, ExecutionCancelQuery(wait_s=30))
    assert seen["launcher"] == seen["chain"]
    lines = seen["launcher"].splitlines()
    if os.geteuid() == 0:
        assert lines[0] != "0" and lines[1] != "0"  # never the host's root
    assert lines[2].split() == ["Groups:"]  # no supplementary group
    blocks = str(policy.max_file_size_bytes // 1024)  # ulimit -f counts 1 KiB blocks
    assert lines[5:12] == ["777", "777", "555", "555", blocks, "120", "121"]
    assert lines[-1] == "reached"
