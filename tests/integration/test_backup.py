"""Backup and restore (issue 18; docs/operations.md): ``shellyard backup`` while the home serves
(executions running, a transfer in flight), restored into a fresh home: every completed
record, its logs and its snapshot are there; the restored control plane starts and re-attaches
nothing twice (E11: an execution running at backup time is recorded ``unknown``, never watched
by two control planes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest
from files_helpers import child_workspace

from conftest import processes_of, sy
from shellyard.backup import LOST_ERROR, backup, restore
from shellyard.config import Settings
from shellyard.contract.executions import (
    ExecutionLogsQuery,
    ExecutionState,
    ExecutionWait,
    RunShellRequest,
)
from shellyard.contract.files import TransferWait
from shellyard.control.plane import ControlPlane, build
from shellyard.control.retention import structure_sizes
from shellyard.errors import InvalidInput
from shellyard.runner.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(300)

MAKE_FILES = """python3 - <<'PY'
import os
os.makedirs("many", exist_ok=True)
for i in range(400):
    with open(f"many/f{i:04d}.bin", "wb") as f:
        f.write(os.urandom(2048))
PY"""


async def test_backup_while_serving_restores_every_completed_record(home: Path) -> None:
    source = Settings(home=home / "a")
    target = Settings(home=home / "b")
    destination = home / "backup"
    plane = await build(source)
    long_id = None
    try:
        made = await plane.executions.run_shell(RunShellRequest(command=MAKE_FILES))
        done = [
            await plane.executions.run_shell(
                RunShellRequest(command=f"echo {i} > n{i}.txt; echo log {i}")
            )
            for i in range(5)
        ]
        child, child_ws = await child_workspace(plane, "local")
        long = await plane.executions.run_shell(
            RunShellRequest(command="sleep 60", background=True), str(child.id)
        )
        long_id = long.execution_id
        _other, other_ws = await child_workspace(plane, "local")
        transfer = await plane.transfers.start(
            {
                "source_workspace_id": made.workspace_id,
                "paths": ["many"],
                "target_workspace_id": other_ws,
                "batch_files": 20,
                "max_bytes_per_s": 40_000,  # about 20 s: in flight during the backup
            }
        )
        for _ in range(400):
            if (await plane.transfers.query(transfer.transfer_id)).files_copied > 0:
                break
            await asyncio.sleep(0.01)

        stop = asyncio.Event()

        async def keep_running() -> int:
            count = 0
            while not stop.is_set():
                await plane.executions.run_shell(RunShellRequest(command=f"echo more {count}"))
                count += 1
            return count

        busy = asyncio.create_task(keep_running())
        report = await asyncio.to_thread(backup, source, destination)
        stop.set()
        more = await busy
        assert report.unfinished >= 1 and more > 0, report
    finally:
        await plane.aclose()  # the long sandbox keeps running, as after a crash (E11)

    try:
        with pytest.raises(InvalidInput, match="not empty"):
            restore(Settings(home=source.home), destination)
        restore(target, destination)
        with sqlite3.connect(target.home / "shellyard.db") as db:
            copied = db.execute("SELECT state FROM transfers WHERE id = ?", (transfer.transfer_id,))
            assert copied.fetchone() == ("running",), "the transfer was not in flight"
        async with ControlPlane.running(target) as restored:
            store = restored.store
            local = restored.runners.get("local")
            for result in [made, *done]:
                view = await restored.executions.status(result.execution_id)
                assert view.state == "completed" and view.snapshot_seq == result.snapshot_seq
                logs = await restored.executions.logs(result.execution_id, ExecutionLogsQuery())
                assert logs.data == result.stdout and logs.logs_pruned_at is None
                seqs = [s.seq for s in await local.list_snapshots(result.workspace_id)]
                assert result.snapshot_seq in seqs
            for i, result in enumerate(done):
                chunk = await local.read_file(
                    result.workspace_id, result.snapshot_seq, f"n{i}.txt", 0, 100
                )
                assert bytes(chunk.data) == f"{i}\n".encode()
            # every record the copy has as completed reads with its logs
            completed = [
                r for r in await store.list_executions(None, 10_000) if r.state == "completed"
            ]
            assert len(completed) >= 1 + len(done)
            for row in completed:
                logs = await restored.executions.logs(
                    str(row.id), ExecutionLogsQuery(), str(row.agent_id)
                )
                assert logs.complete and logs.logs_pruned_at is None
            # the execution running at backup time: recorded unknown, never re-attached
            view = await restored.executions.wait(
                long_id, ExecutionWait(timeout_s=30), str(child.id)
            )
            assert view.state == ExecutionState.unknown and view.error == LOST_ERROR
            assert processes_of(long_id), "the original sandbox must be left alone"
            sizes = structure_sizes(restored, local)
            assert sizes["local.live"] == 0 and sizes["executions.watchers"] == 0
            # the transfer in flight when the database was copied ends once, and the
            # workspaces take new work
            restored_transfer = await restored.transfers.wait(
                transfer.transfer_id, TransferWait(timeout_s=90)
            )
            assert restored_transfer.terminal, restored_transfer
            assert restored_transfer.started_at is not None
            again = await restored.executions.run_shell(
                RunShellRequest(command="cat n4.txt; ls many | wc -l")
            )
            assert again.stdout == "4\n400\n", again
            child_again = await restored.executions.run_shell(
                RunShellRequest(command="echo ok"), str(child.id)
            )
            assert child_again.state == "completed" and child_again.workspace_id == child_ws
    finally:
        for pid in processes_of(long_id or "none"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_backup_and_restore_verbs(served_home: Path, home: Path) -> None:
    """``shellyard backup DEST`` of a served home and ``shellyard restore SRC`` into an empty
    one, which then serves the same records."""
    first = sy(served_home, "run", "--", "echo kept > k.txt; echo hello")
    assert first.returncode == 0 and first.stdout == "hello\n"
    destination = home / "copy"
    made = sy(served_home, "backup", str(destination))
    assert made.returncode == 0 and "backed up 1 execution records" in made.stdout, made.stderr
    again = sy(served_home, "backup", str(destination))
    assert again.returncode == 2 and "not empty" in again.stderr
    fresh = home / "fresh"
    put = sy(fresh, "restore", str(destination), "--home", str(fresh))
    assert put.returncode == 0, put.stderr
    try:
        listing = sy(fresh, "status", "--json")
        assert listing.returncode == 0 and '"completed"' in listing.stdout
        assert sy(fresh, "run", "--", "cat k.txt").stdout == "kept\n"
    finally:
        from shellyard.home import is_served, read_info

        info = read_info(fresh)
        if info is not None and is_served(fresh):
            os.kill(info.pid, signal.SIGTERM)


async def test_backup_and_restore_on_postgresql(home: Path, pg_schema: str) -> None:
    """The same on PostgreSQL: ``pg_dump`` from an exported snapshot, ``pg_restore`` into an
    empty database; the restored home serves every record with its logs and snapshot."""
    import psycopg

    from conftest import POSTGRES_URL

    source = Settings(home=home / "a", database_url=POSTGRES_URL, database_schema=pg_schema)
    async with ControlPlane.running(source) as plane:
        done = [
            await plane.executions.run_shell(RunShellRequest(command=f"echo {i} > p.txt; echo {i}"))
            for i in range(3)
        ]
        report = await asyncio.to_thread(backup, source, home / "copy")
    assert report.database == "postgresql" and report.executions == 3
    database = f"restore_{pg_schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{database}"
        target = Settings(home=home / "b", database_url=url, database_schema=pg_schema)
        restore(target, home / "copy")
        async with ControlPlane.running(target) as restored:
            local = restored.runners.get("local")
            for i, result in enumerate(done):
                view = await restored.executions.status(result.execution_id)
                assert view.state == "completed" and view.snapshot_seq == result.snapshot_seq
                assert (
                    await restored.executions.logs(result.execution_id, ExecutionLogsQuery())
                ).data == f"{i}\n"
                chunk = await local.read_file(
                    result.workspace_id, result.snapshot_seq, "p.txt", 0, 9
                )
                assert bytes(chunk.data) == f"{i}\n".encode()
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def _unique_bytes(root: Path, leave_out: frozenset[tuple[int, int]] = frozenset()) -> int:
    """Bytes of the regular files under ``root``, each inode once."""
    seen: dict[tuple[int, int], int] = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            key = (info.st_dev, info.st_ino)
            if os.path.isfile(os.path.join(folder, name)) and key not in leave_out:
                seen[key] = info.st_size
    return sum(seen.values())


async def test_backup_keeps_hard_links_and_names_base_files(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A home holding hard links (an agent's ``ln``; an environment an older release made
    from a base shares the base's files) and an environment made from a base now (copies of
    the base's files, its ``env.json`` naming the base) backs up at its own size: links stay
    links, base files and their copies are named in base-links.jsonl, not copied; the restore
    gives the same links, but copies of the base's files, never links of them (docs/
    security.md "Environments share no inode with a base") — links of them on a runner set to
    ``SHELLYARD_BASE_SHARING=links`` — refuses up front where the base is missing, and
    ``full=True`` makes a backup that needs no base."""
    bases = home / "bases"
    prefix = bases / "python-base" / "1" / "prefix"
    (prefix / "lib").mkdir(parents=True)
    (bases / "python-base" / "1.json").write_text("{}")
    base_file = prefix / "lib" / "numpy.so"
    base_file.write_bytes(os.urandom(4 << 20))
    base_copied = prefix / "lib" / "scipy.so"
    base_copied.write_bytes(os.urandom(2 << 20))
    monkeypatch.setenv("SHELLYARD_BASES", str(bases))
    source = Settings(home=home / "a")
    plane = await build(source)
    try:
        made = await plane.executions.run_shell(
            RunShellRequest(command="head -c 3000000 /dev/urandom > a.bin && ln a.bin b.bin")
        )
        assert made.exit_code == 0, made
    finally:
        await plane.aclose()
    derived = source.local_runner_root / "environments" / "env_from_base" / "prefix" / "lib"
    derived.mkdir(parents=True)
    os.link(base_file, derived / "numpy.so")
    copies = source.local_runner_root / "environments" / "env_copies"
    (copies / "prefix" / "lib").mkdir(parents=True)
    record = {"manager": "base", "name": "python-base", "source": f"{prefix} (copies)"}
    (copies / "env.json").write_text(json.dumps({"base": [record]}))
    shutil.copy2(base_copied, copies / "prefix" / "lib" / "scipy.so")  # its mtime kept
    changed = copies / "prefix" / "lib" / "numpy.so"  # same size and mtime, other bytes
    shutil.copy2(base_file, changed)
    with open(changed, "r+b") as out:
        out.write(b"X")
    os.utime(changed, ns=(base_file.stat().st_atime_ns, base_file.stat().st_mtime_ns))
    base_inode = frozenset({(base_file.stat().st_dev, base_file.stat().st_ino)})
    own = _unique_bytes(source.local_runner_root, base_inode) - (2 << 20)

    report = backup(source, home / "backup")
    kept = _unique_bytes(home / "backup" / "runners")
    assert kept <= own + (64 << 10) and kept < own + (3 << 20), (kept, own)
    assert report.linked >= 1 and report.base_files == 2
    backed = home / "backup" / "runners/local/environments"
    assert not (backed / "env_from_base/prefix/lib/numpy.so").exists()
    assert not (backed / "env_copies/prefix/lib/scipy.so").exists()
    assert (backed / "env_copies/prefix/lib/numpy.so").read_bytes() == changed.read_bytes()

    target = Settings(home=home / "b")
    restore(target, home / "backup")
    workspaces = list((target.local_runner_root / "workspaces").rglob("a.bin"))
    assert len(workspaces) == 1
    a, b = workspaces[0], workspaces[0].with_name("b.bin")
    assert a.stat().st_ino == b.stat().st_ino and a.read_bytes() == b.read_bytes()
    restored = target.local_runner_root / "environments"
    for path, was in (
        (restored / "env_from_base/prefix/lib/numpy.so", base_file),
        (restored / "env_copies/prefix/lib/scipy.so", base_copied),
    ):
        assert path.stat().st_ino != was.stat().st_ino and path.stat().st_nlink == 1
        assert path.read_bytes() == was.read_bytes()
        assert path.stat().st_mtime_ns == was.stat().st_mtime_ns
    assert was.stat().st_nlink == 1
    # a runner sharing bases by hard links (SHELLYARD_BASE_SHARING=links) restores links
    linking = Settings(home=home / "l", local_policy=SandboxPolicy(base_sharing="links"))
    restore(linking, home / "backup")
    linked = linking.local_runner_root / "environments"
    for path, was in (
        (linked / "env_from_base/prefix/lib/numpy.so", base_file),
        (linked / "env_copies/prefix/lib/scipy.so", base_copied),
    ):
        assert path.stat().st_ino == was.stat().st_ino, path
    shutil.rmtree(home / "l")

    full = backup(source, home / "full", full=True)
    assert full.base_files == 0
    base_file.unlink()
    with pytest.raises(InvalidInput, match="backup --full"):
        restore(Settings(home=home / "c"), home / "backup")
    assert not (home / "c" / "shellyard.db").exists()  # refused before anything was written
    restore(Settings(home=home / "d"), home / "full")
    copied = Settings(home=home / "d").local_runner_root / "environments/env_from_base/prefix/lib"
    assert (copied / "numpy.so").stat().st_size == 4 << 20
