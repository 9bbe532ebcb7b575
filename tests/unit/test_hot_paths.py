"""The execution's hot path names its files by text and keeps the paths it asks for again
(docs/benchmarks.md §72): the same files as the ``Path`` joins it replaced, ids still checked
at every ask, the kept tables bounded, and one volume reading where two figures are wanted.
Cgroup files here are plain files in a folder laid out as a v1 hierarchy (R2's groups read and
reset through the same calls as on the kernel's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shellyard.errors import InvalidInput, LowOnSpace
from shellyard.runner import processes
from shellyard.runner.limits import group_usage, ready_groups, recycle, reserve, watcher
from shellyard.runner.limits.cgroups import CgroupTree, TenantLimits
from shellyard.runner.local import LocalRunner
from shellyard.runner.network.netns import WorkspaceNetworks
from shellyard.runner.network.ports import Relays
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.snapshots.store import SnapshotStore

V1 = ("memory", "pids", "cpu", "cpuacct")


def _v1_tree(tmp_path: Path) -> CgroupTree:
    bases = {name: tmp_path / name / "shellyard-x" for name in V1}
    for base in bases.values():
        base.mkdir(parents=True)
    (bases["cpu"] / "cpu.shares").write_text("1024")
    return CgroupTree("v1", bases, TenantLimits(memory_bytes=1 << 30, processes=64))


def _group(tmp_path: Path, files: dict[str, dict[str, str]]) -> None:
    for kind, named in files.items():
        folder = tmp_path / kind / "shellyard-x" / "ws_1" / "ex_1"
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in named.items():
            (folder / name).write_text(text)


def test_plan_names_the_same_files_as_path_joins(tmp_path: Path) -> None:
    tree = _v1_tree(tmp_path)
    joins = tree.plan("ws_1", "ex_1")
    base = tmp_path
    assert joins == [
        str(base / "memory/shellyard-x/ws_1/ex_1/cgroup.procs"),
        str(base / "pids/shellyard-x/ws_1/ex_1/cgroup.procs"),
        # cpu apart from cpuacct: the execution joins its workspace's cpu group
        str(base / "cpu/shellyard-x/ws_1/cgroup.procs"),
        str(base / "cpuacct/shellyard-x/ws_1/ex_1/cgroup.procs"),
    ]


def test_usage_and_reset_read_and_write_the_groups_files(tmp_path: Path) -> None:
    tree = _v1_tree(tmp_path)
    _group(
        tmp_path,
        {
            "memory": {
                # one digit: a plain file is not truncated by the reset's write, as a
                # control file is
                "memory.max_usage_in_bytes": "8",
                "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
                "memory.usage_in_bytes": "1024\n",
            },
            "pids": {"pids.events": "max 0\n", "cgroup.procs": ""},
            "cpuacct": {"cpuacct.usage": "5"},
        },
    )
    usage = group_usage.read(False, tree.bases, tree.controllers, "ws_1", "ex_1")
    assert (usage.peak_memory_bytes, usage.cpu_seconds) == (8, 5e-9)
    assert not usage.memory_killed and not usage.processes_hit
    assert recycle.v1_group_reset(tree.bases, "ws_1", "ex_1")
    group = Path("shellyard-x/ws_1/ex_1")
    assert (tmp_path / "memory" / group / "memory.max_usage_in_bytes").read_text() == "0"
    assert (tmp_path / "cpuacct" / group / "cpuacct.usage").read_text() == "0"
    # a refused fork in it: read as hit, and the group is not used again
    (tmp_path / "pids" / group / "pids.events").write_text("max 3\n")
    usage = group_usage.read(False, tree.bases, tree.controllers, "ws_1", "ex_1")
    assert usage.processes_hit
    assert not recycle.v1_group_reset(tree.bases, "ws_1", "ex_1")


def test_again_now_pools_an_empty_clean_group(tmp_path: Path) -> None:
    tree = _v1_tree(tmp_path)
    _group(
        tmp_path,
        {
            "memory": {
                "memory.max_usage_in_bytes": "4096\n",
                "memory.oom_control": "oom_kill 0\n",
                "memory.usage_in_bytes": "1024\n",
            },
            "pids": {"pids.events": "max 0\n", "cgroup.procs": ""},
            "cpuacct": {"cpuacct.usage": "7\n"},
        },
    )
    tree.plan("ws_1", "ex_1")
    assert tree._poolable("ws_1", "ex_1") and tree._pool("ws_1", "ex_1")
    assert tree.ready.take_ready("ws_1") == "ex_1"
    # a process still in it: not pooled at once (the removal thread waits for it)
    (tmp_path / "pids/shellyard-x/ws_1/ex_1/cgroup.procs").write_text("123\n")
    assert not (tree._poolable("ws_1", "ex_1") and tree._pool("ws_1", "ex_1"))
    assert ready_groups.READY_PER_WORKSPACE >= 1


def test_runner_paths_are_checked_at_every_ask_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = LocalRunner(tmp_path / "home")
    root = (tmp_path / "home").absolute()
    assert runner.workspace_path("ws_1") == root / "workspaces" / "ws_1"
    assert runner.workspace_path("ws_1") is runner.workspace_path("ws_1")  # kept
    for folder in ("homes", "workspaces"):  # as the runner's startup makes them
        (root / folder).mkdir()
    home = runner.home_path("ws_1")
    assert home == root / "homes" / "ws_1" and home.is_dir()
    home.rmdir()  # a home gone is made again: only the name is kept, not that it exists
    assert runner.home_path("ws_1").is_dir()
    for bad in ("../x", "a/b", ""):
        with pytest.raises(InvalidInput):
            runner.workspace_path(bad)
        with pytest.raises(InvalidInput):
            runner.home_path(bad)
    runner._paths_of._bound = 3  # kept.py's table, made small
    for n in range(10):
        runner.workspace_path(f"ws_{n}")
    assert len(runner._paths_of) <= 3
    assert runner.workspace_path("ws_1") == root / "workspaces" / "ws_1"


def test_store_folders_are_checked_at_every_ask_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshots = SnapshotStore(tmp_path / "snapshots")
    try:
        assert snapshots._wdir("ws.1") == tmp_path / "snapshots" / "workspaces" / "ws.1"
        for bad in (".x", "a/b", "", "x" * 129):
            with pytest.raises(InvalidInput):
                snapshots._wdir(bad)
        snapshots._wdirs._bound = 2
        for n in range(10):
            snapshots._wdir(f"ws_{n}")
        assert len(snapshots._wdirs) <= 2
    finally:
        snapshots.close()


def test_a_names_holds_are_its_folders_own(tmp_path: Path) -> None:
    """The states a hold on a name counts are the ones ``unmount_unheld`` and a direct
    ``mount`` of the folder lock: one lock per folder, whichever way it is reached."""
    mounts = OwnMounts(tmp_path / "overlays", (tmp_path / "workspaces", tmp_path / "homes"))
    named = mounts._of("ws_1")
    assert [folder for folder, _state in named] == mounts.folders_of("ws_1")
    for folder, state in named:
        assert mounts._state(Path(os.path.join(folder.parent, folder.name))) is state
    assert mounts._of("ws_1") is named
    mounts.enabled = True  # counted without mounting: the folders are not made
    mounts.hold("ws_1")
    assert mounts.holds("ws_1") == [1, 1]
    mounts.let_go("ws_1")
    assert mounts.holds("ws_1") == [0, 0]


def test_room_check_reads_both_reserves(tmp_path: Path) -> None:
    _free, total = reserve.volume(tmp_path)
    assert reserve.volume_of(os.statvfs(tmp_path))[1] == total
    with pytest.raises(LowOnSpace) as refused:
        reserve.require_room(tmp_path, SandboxPolicy(free_space_reserve_bytes=total + 1), "x")
    assert "reserve" in str(refused.value)
    reserve.require_room(tmp_path, SandboxPolicy(free_space_reserve_bytes=0), "x")


def test_breach_record_read_by_text_path(tmp_path: Path) -> None:
    assert watcher._read_breach(tmp_path) is None  # none written: the usual end
    (tmp_path / watcher.LIMIT_FILE).write_text('{"limit": "quota", "quota": 5, "reached": 9}')
    breach = watcher._read_breach(tmp_path)
    assert breach is not None and (breach["limit"], breach["reached"]) == ("quota", 9)
    (tmp_path / watcher.LIMIT_FILE).write_bytes(b"\xff{")
    assert watcher._read_breach(tmp_path) is None


def test_forward_records_listed_in_name_order_and_none_without_a_folder(tmp_path: Path) -> None:
    networks = WorkspaceNetworks(tmp_path / "netns")
    relays = Relays(tmp_path / "relays", networks, None)
    assert relays._records("ws_1") == []  # no folder: nothing was forwarded
    folder = tmp_path / "relays" / "ws_1"
    folder.mkdir(parents=True)
    me = {"pid": os.getpid(), "start_time": processes.start_time(os.getpid())}
    # "a-b.json" sorts before "a.json" by file name, after it by stem: the glob's order kept
    for name, port in (("a.json", 1), ("a-b.json", 2), ("c.txt", 3)):
        (folder / name).write_text(json.dumps({**me, "port": port}))
    assert [r["port"] for r in relays._records("ws_1")] == [2, 1]


def test_namespace_paths_kept_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    networks = WorkspaceNetworks(tmp_path / "netns")
    assert networks.path("ws_1") == tmp_path / "netns" / "ws_1"
    networks._paths._bound = 2
    for n in range(10):
        assert networks.path(f"ws_{n}") == tmp_path / "netns" / f"ws_{n}"
    assert len(networks._paths) <= 2
