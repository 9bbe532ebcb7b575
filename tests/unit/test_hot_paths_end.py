"""An execution's end reads each file once (docs/benchmarks.md §75): R2's v1 groups, seen
empty, are read for the record and their reset checks the same reads (an OOM kill or a refused
fork still keeps a group from being used again); /proc files and bwrap's status are read whole
by ``os.read``, to the end. Cgroup files here are plain files in a folder laid out as a v1
hierarchy (read and reset through the same calls as on the kernel's)."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from shellyard.runner import processes
from shellyard.runner.limits import cgroup_files, group_usage, recycle
from shellyard.runner.limits.cgroups import CgroupTree, TenantLimits

V1 = ("memory", "pids", "cpu", "cpuacct")
GROUP = Path("shellyard-x/ws_1/ex_1")


def _v1_tree(tmp_path: Path) -> CgroupTree:
    bases = {name: tmp_path / name / "shellyard-x" for name in V1}
    for base in bases.values():
        base.mkdir(parents=True)
    (bases["cpu"] / "cpu.shares").write_text("1024")
    return CgroupTree("v1", bases, TenantLimits(memory_bytes=1 << 30, processes=64))


def _group(tmp_path: Path, oom_kill: int = 0, refused: int = 0) -> None:
    files = {
        "memory": {
            # one digit: a plain file is not truncated by the reset's write, as a
            # control file is
            "memory.max_usage_in_bytes": "8",
            "memory.oom_control": f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n",
            "memory.usage_in_bytes": "1024\n",
        },
        "pids": {"pids.events": f"max {refused}\n", "cgroup.procs": ""},
        "cpuacct": {"cpuacct.usage": "5"},
    }
    for kind, named in files.items():
        folder = tmp_path / kind / GROUP
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in named.items():
            (folder / name).write_text(text)


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The names of the control files read through both modules' ``read`` (still read)."""
    reads: collections.Counter[str] = collections.Counter()

    def counted(path: cgroup_files.StrPath) -> str | None:
        reads[os.path.basename(os.fspath(path))] += 1
        return cgroup_files.read(path)

    monkeypatch.setattr(group_usage, "_read", counted)
    monkeypatch.setattr(recycle, "read", counted)
    return reads


def test_an_empty_clean_group_is_read_once_and_pooled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2: its use recorded, its counters reset, pooled; each check file read once."""
    tree = _v1_tree(tmp_path)
    _group(tmp_path)
    tree.plan("ws_1", "ex_1")
    reads = _count_reads(monkeypatch)
    usage = tree.finish("ws_1", "ex_1", ahead=True)
    assert (usage.peak_memory_bytes, usage.cpu_seconds) == (8, 5e-9)
    assert not usage.memory_killed and not usage.processes_hit
    assert tree.ready.take_ready("ws_1") == "ex_1"
    assert (tmp_path / "memory" / GROUP / "memory.max_usage_in_bytes").read_text() == "0"
    assert (tmp_path / "cpuacct" / GROUP / "cpuacct.usage").read_text() == "0"
    assert reads["memory.oom_control"] == 1 and reads["pids.events"] == 1
    assert reads["memory.usage_in_bytes"] == 1  # the leftover check: not part of the use


@pytest.mark.parametrize(("oom_kill", "refused"), [(1, 0), (0, 2)])
def test_the_reset_checks_what_the_end_read(tmp_path: Path, oom_kill: int, refused: int) -> None:
    """R2: a kill or a refused fork the end's read saw keeps the group from the pool, even
    when the files say otherwise by the reset (the reset reads them no more); what the end
    saw clean is reset."""
    tree = _v1_tree(tmp_path)
    _group(tmp_path, oom_kill, refused)
    seen: recycle.Seen = {}
    usage = tree.usage("ws_1", "ex_1", seen)
    assert (usage.memory_killed, usage.processes_hit) == (bool(oom_kill), bool(refused))
    _group(tmp_path)  # the files now say clean: the reset goes by what the end read
    assert not recycle.v1_group_reset(tree.bases, "ws_1", "ex_1", seen)
    assert recycle.v1_group_reset(tree.bases, "ws_1", "ex_1")
    clean: recycle.Seen = {}
    tree.usage("ws_1", "ex_1", clean)
    _group(tmp_path, oom_kill, refused)
    assert recycle.v1_group_reset(tree.bases, "ws_1", "ex_1", clean)


def test_read_file_reads_to_the_end(tmp_path: Path) -> None:
    big = tmp_path / "big"
    data = bytes(range(256)) * 1000  # past one 64 KiB read
    big.write_bytes(data)
    assert processes.read_file(big) == data
    (tmp_path / "empty").write_bytes(b"")
    assert processes.read_file(tmp_path / "empty") == b""
    with pytest.raises(FileNotFoundError):
        processes.read_file(tmp_path / "absent")
    assert processes.start_time(os.getpid()) is not None
    assert processes.start_time(2**22 + 1) is None  # above pid_max: no such process


def test_bwrap_status_merges_its_lines_and_skips_a_torn_one(tmp_path: Path) -> None:
    """E8/E11: the exit code read from bwrap's status; a half-written last line (a crash)
    or bytes that are no text are no record, never an error."""
    status = tmp_path / "status"
    lines = [json.dumps({"child-pid": 12}), json.dumps({"exit-code": 3}), '{"exit-c']
    status.write_bytes("\n".join(lines).encode() + b"\xff\n")
    assert processes.read_bwrap_status(status) == {"child-pid": 12, "exit-code": 3}
    assert processes.read_bwrap_status(tmp_path / "absent") == {}


async def test_kill_and_wait_kills_only_the_marked_process() -> None:
    """E8: the sandbox's init is killed and waited for when its environment holds the
    marker; a pid that names another process by now is left alone."""
    marker = b"SHELLYARD_SANDBOX_ID=warm-t"
    marked = subprocess.Popen(["/bin/sleep", "30"], env={"SHELLYARD_SANDBOX_ID": "warm-t"})
    other = subprocess.Popen(["/bin/sleep", "30"], env={"A": "1"})
    try:
        assert await processes.kill_and_wait(other.pid, marker, 5.0)
        await asyncio.sleep(0.05)
        assert other.poll() is None  # not the marked one: still running
        assert await processes.kill_and_wait(marked.pid, marker, 5.0)
        # waited for: gone (a zombie until reaped) by the time the wait returns
        assert processes.start_time(marked.pid) is None
        assert marked.wait(5) == -signal.SIGKILL
    finally:
        for process in (marked, other):
            process.kill()
            process.wait()
