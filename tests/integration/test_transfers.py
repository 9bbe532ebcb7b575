"""Transfers and artifacts through the control plane (T1–T5), with real sandboxes, a real
runner daemon on loopback and a real tmpfs for the out-of-room case. Tests taking ``yard`` run
on the local runner and on a direct runner; ``mixed`` has both in one control plane."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from files_helpers import (
    child_workspace,
    object_file,
    read_all,
    run,
    runner_root,
    small_tmpfs,
    tree,
)
from runner_daemon_fixture import RunnerDaemon

from conftest import Yard, open_yard
from shellyard.contract.files import (
    FileHistoryQuery,
    FileListQuery,
    TransferCancelQuery,
    TransferFilesQuery,
    TransferListQuery,
    TransferWait,
)
from shellyard.control.plane import ControlPlane
from shellyard.errors import InvalidInput, NotFound, WorkspaceBusy

# R1, T4: the same suite against local, direct and ssh runners.
pytestmark = [pytest.mark.timeout(240), pytest.mark.runner_kinds("local", "direct", "ssh")]

MAKE_FILES = """python3 - <<'PY'
import os
os.makedirs("{folder}", exist_ok=True)
for i in range({count}):
    with open(f"{folder}/f{{i:05d}}.bin", "wb") as f:
        f.write(os.urandom({size}))
PY"""


async def settle(plane: ControlPlane, transfer_id: str) -> Any:
    view = await plane.transfers.wait(transfer_id, TransferWait(timeout_s=120))
    assert view.terminal, view
    return view


async def outcomes(plane: ControlPlane, transfer_id: str) -> dict[str, Any]:
    page = await plane.transfers.files(transfer_id, TransferFilesQuery(limit=10_000))
    return {f.target_path: f for f in page.files}


# ---------------------------------------------------------------------- T3: cancel


async def test_t3_cancel_part_way_keeps_committed_batches(yard: Yard) -> None:
    """Cancel a transfer of 2,000 files part-way: the files of committed batches are in the
    target snapshot and listed ``copied``; the rest are not there and listed ``skipped``;
    the state is ``cancelled``."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(plane, MAKE_FILES.format(folder="many", count=2000, size=512), runner_id)
    child, target = await child_workspace(plane, runner_id)
    started = await plane.transfers.start(
        {
            "source_workspace_id": made.workspace_id,
            "paths": ["many"],
            "target_workspace_id": target,
            "target_folder": "in",
            "batch_files": 100,
            # 1 MB at 250 kB/s: about 4 s, so the cancel lands part-way
            "max_bytes_per_s": 250_000,
        }
    )
    assert started.files_total == 2001 and started.source_seq == made.snapshot_seq
    for _ in range(600):
        view = await plane.transfers.query(started.transfer_id)
        if view.files_copied >= 100:
            break
        await asyncio.sleep(0.01)
    assert view.state == "running" and view.bytes_done > 0
    cancelled = await plane.transfers.cancel(started.transfer_id, TransferCancelQuery(wait_s=60))
    assert cancelled.state == "cancelled"
    assert 0 < cancelled.files_copied < 2001
    files = await outcomes(plane, started.transfer_id)
    present = await tree(plane, target)
    copied = {p for p, f in files.items() if f.outcome == "copied"}
    assert copied == set(present) - {"in"}  # "in": the target folder, made on the way
    assert all(f.target_seq is not None for p, f in files.items() if p in copied)
    rest = {p: f for p, f in files.items() if p not in copied}
    assert rest and all(
        f.outcome == "skipped" and "cancelled" in (f.reason or "") for f in rest.values()
    )
    assert (
        cancelled.target_seq
        == (await plane.files.history(FileHistoryQuery(workspace_id=target))).head_seq
    )
    # the target's writer is free again
    await plane.files.write("after.txt", b"ok", workspace_id=target, agent_id=str(child.id))


# ---------------------------------------------------------------------- T3: partial failure


async def test_t3_partial_failure_source_unreadable(yard: Yard) -> None:
    """A source file the copy cannot read (its object is gone from the source runner's
    store): that file is ``failed`` with the reason, every other file is copied and
    committed, the state is ``partial``."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(plane, MAKE_FILES.format(folder="src", count=6, size=4096), runner_id)
    entries = await tree(plane, made.workspace_id)
    lost = entries["src/f00003.bin"]
    assert lost.sha256 is not None
    object_file(runner_root(yard), lost.sha256).unlink()
    _child, target = await child_workspace(plane, runner_id)
    started = await plane.transfers.start(
        {
            "source_workspace_id": made.workspace_id,
            "paths": ["src/*.bin"],
            "target_workspace_id": target,
            "batch_files": 2,
        }
    )
    done = await settle(plane, started.transfer_id)
    assert done.state == "partial"
    assert (done.files_copied, done.files_failed) == (5, 1)
    files = await outcomes(plane, started.transfer_id)
    assert files["f00003.bin"].outcome == "failed"
    assert "no such object" in (files["f00003.bin"].reason or "")
    present = await tree(plane, target)
    assert "f00003.bin" not in present and len(present) == 5
    for name, f in files.items():
        if f.outcome == "copied":
            data = await read_all(plane, name, workspace_id=target)
            assert hashlib.sha256(data).hexdigest() == f.sha256


async def test_t3_partial_failure_target_out_of_room(yard: Yard) -> None:
    """The target workspace is a 2 MiB tmpfs (made by the test): files that fit are copied
    and committed; the others are ``failed`` saying the target is out of room; nothing
    committed is lost; the state is ``partial``."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(plane, MAKE_FILES.format(folder="big", count=8, size=512 * 1024), runner_id)
    _child, target = await child_workspace(plane, runner_id)
    folder = runner_root(yard) / "workspaces" / target
    with small_tmpfs(folder, "2m"):
        started = await plane.transfers.start(
            {
                "source_workspace_id": made.workspace_id,
                "paths": ["big"],
                "target_workspace_id": target,
                "batch_files": 3,
            }
        )
        done = await settle(plane, started.transfer_id)
        files = await outcomes(plane, started.transfer_id)
        present = await tree(plane, target)
    assert done.state == "partial"
    copied = {p for p, f in files.items() if f.outcome == "copied" and f.kind == "file"}
    failed = {p: f for p, f in files.items() if f.outcome == "failed"}
    assert 1 <= len(copied) <= 4 and failed  # 2 MiB holds at most four 512 KiB files
    assert all("out of room" in (f.reason or "") for f in failed.values())
    assert {p for p, e in present.items() if e.kind == "file"} == copied
    history = await plane.files.history(FileHistoryQuery(workspace_id=target))
    assert history.head_seq == done.target_seq


# ---------------------------------------------------------------------- T2: globs, unchanged


async def test_t2_globs_unchanged_links_and_notice(yard: Yard) -> None:
    """Globs select files below their folder; a second copy of the same files is all
    ``unchanged`` (and makes no snapshot); a link pointing outside is ``skipped``; the
    source snapshot is the one committed at start; a finished transfer posts a notice (N1);
    between workspaces of one runner no byte crosses: the store's objects are shared."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(
        plane,
        "mkdir -p src/pkg/sub docs; echo a > src/pkg/a.py; echo b > src/pkg/sub/b.py; "
        "echo t > src/pkg/notes.txt; echo d > docs/r.md; ln -s /etc src/pkg/etc; "
        "ln -s a.py src/pkg/alias.py",
        runner_id,
    )
    _child, target = await child_workspace(plane, runner_id)
    request = {
        "source_workspace_id": made.workspace_id,
        "paths": ["src/**/*.py", "docs", "src/pkg/etc"],
        "target_workspace_id": target,
        "target_folder": "copy",
    }
    first = await settle(plane, (await plane.transfers.start(request)).transfer_id)
    files = await outcomes(plane, first.transfer_id)
    assert set(files) == {
        "copy/pkg/a.py",
        "copy/pkg/sub/b.py",
        "copy/pkg/alias.py",
        "copy/docs",
        "copy/docs/r.md",
        "copy/etc",
    }
    assert files["copy/etc"].outcome == "skipped" and "outside" in (files["copy/etc"].reason or "")
    assert first.state == "completed" and first.files_skipped == 1 and first.bytes_sent == 0
    present = await tree(plane, target)
    assert present["copy/pkg/alias.py"].kind == "symlink"
    assert await read_all(plane, "copy/pkg/sub/b.py", workspace_id=target) == b"b\n"
    notices = await plane.store.list_notices(str((await plane.files.access.agent(None)).id))
    assert any(n.kind == "transfer" and n.subject_id == first.transfer_id for n in notices)

    again = await settle(plane, (await plane.transfers.start(request)).transfer_id)
    assert again.files_unchanged == 5 and again.files_copied == 0
    assert again.target_seq == first.target_seq  # nothing changed: no new snapshot

    with pytest.raises(NotFound, match="matches nothing"):
        await plane.transfers.start({**request, "paths": ["src/*.rs"]})
    with pytest.raises(NotFound, match="no 'nope'"):
        await plane.transfers.start({**request, "paths": ["nope"]})
    with pytest.raises(InvalidInput, match="paths"):
        await plane.transfers.start({**request, "paths": []})


async def test_t2_target_busy_refused_or_queued(yard: Yard) -> None:
    """T2 + W1: the target's writer is held by a command: a transfer is refused naming it,
    or with queue waits (state ``queued``) and runs when the command ends; a command submitted
    while the transfer holds the writer is refused naming the transfer."""
    plane, runner_id = yard.plane, yard.runner_id
    made = await run(plane, MAKE_FILES.format(folder="q", count=3, size=100), runner_id)
    busy = await yard.run("sleep 2", background=True)
    request = {
        "source_workspace_id": made.workspace_id,
        "paths": ["q"],
        "target_workspace_id": made.workspace_id,
        "target_folder": "q2",
    }
    with pytest.raises(WorkspaceBusy) as refused:
        await plane.transfers.start(request)
    assert busy.execution_id in refused.value.message
    queued = await plane.transfers.start({**request, "queue": True})
    assert queued.state == "queued"
    done = await settle(plane, queued.transfer_id)
    assert done.state == "completed" and done.files_copied == 4
    ended = await plane.executions.status(busy.execution_id)
    assert ended.finished_at is not None and done.started_at is not None
    assert done.started_at >= ended.finished_at - 0.5


async def test_t3_transfer_resumes_after_a_control_plane_restart(home: Path) -> None:
    """A transfer in progress when the control plane stops keeps its writer and its pending
    files; the next control plane on the same home resumes it to the end, and the files the
    first one committed are not copied twice (their outcome comes back ``unchanged``)."""
    plane, _runner_id, _daemon = await open_yard(home, "local")
    try:
        made = await run(plane, MAKE_FILES.format(folder="r", count=300, size=1000), "local")
        child, target = await child_workspace(plane, "local")
        started = await plane.transfers.start(
            {
                "source_workspace_id": made.workspace_id,
                "paths": ["r"],
                "target_workspace_id": target,
                "batch_files": 30,
                "max_bytes_per_s": 60_000,  # 300 kB in ~5 s
            }
        )
        for _ in range(500):
            view = await plane.transfers.query(started.transfer_id)
            if view.files_copied >= 30:
                break
            await asyncio.sleep(0.01)
    finally:
        await plane.aclose()
    assert 0 < view.files_copied < 301
    again, _runner_id, _daemon = await open_yard(home, "local")
    try:
        row = await again.store.get_transfer(started.transfer_id)
        assert row is not None and row.state == "running"
        done = await settle(again, started.transfer_id)
        assert done.state == "completed"
        assert done.files_copied + done.files_unchanged == 301
        assert len(await tree(again, target)) == 301
        await again.files.write("after.txt", b"ok", workspace_id=target, agent_id=str(child.id))
    finally:
        await again.aclose()


# ---------------------------------------------------------------------- T4, T5: across runners


async def test_t4_local_and_remote_both_ways_then_artifacts(
    mixed: tuple[ControlPlane, RunnerDaemon],
) -> None:
    """T4: the same transfer, local → remote and back, through the one code path (objects
    exported by the source runner, imported by the target, then a batch applied). T5: the
    copied-back file can be declared an artifact; the remote one is refused with an error
    that says to transfer it first; a transfer declares nothing."""
    plane, _daemon = mixed
    data = bytes(range(256)) * 40_000  # 10 MB, several chunks of the stream
    local = await plane.files.write("data/input.bin", data)
    await plane.files.write("data/small.txt", b"small\n", workspace_id=local.workspace_id)
    remote = await run(plane, "true", "remote")
    out = await plane.transfers.start(
        {
            "source_workspace_id": local.workspace_id,
            "paths": ["data"],
            "target_workspace_id": remote.workspace_id,
        }
    )
    there = await settle(plane, out.transfer_id)
    assert there.state == "completed" and there.files_copied == 3
    # the objects crossed once, verified on arrival; the pack's frames add a few bytes
    assert len(data) + 6 < there.bytes_sent < len(data) + 6 + 512, there.bytes_sent
    assert await read_all(plane, "data/input.bin", workspace_id=remote.workspace_id) == data

    made = await run(plane, "sha256sum data/input.bin | cut -c1-64 > data/result.txt", "remote")
    back = await plane.transfers.start(
        {
            "source_workspace_id": made.workspace_id,
            "paths": ["data/result.txt", "data/input.bin"],
            "target_workspace_id": local.workspace_id,
            "target_folder": "back",
        }
    )
    home_again = await settle(plane, back.transfer_id)
    assert home_again.state == "completed"
    assert (home_again.files_copied, home_again.files_unchanged) == (2, 0)
    # input.bin's object was already here: not sent again
    assert 65 < home_again.bytes_sent < 65 + 512, home_again.bytes_sent
    result = await read_all(plane, "back/result.txt", workspace_id=local.workspace_id)
    assert result.decode().strip() == hashlib.sha256(data).hexdigest()
    assert await plane.artifacts.list() == []  # copying declared nothing

    artifact = await plane.artifacts.declare("back/result.txt", name="checksum")
    assert (artifact.size, artifact.runner_id) == (65, "local")
    assert artifact.sha256 == hashlib.sha256(result).hexdigest()
    stream = await plane.artifacts.open(artifact.artifact_id)
    assert b"".join([c async for c in stream.chunks]) == result
    with pytest.raises(InvalidInput) as refused:
        await plane.artifacts.declare("data/result.txt", workspace_id=made.workspace_id)
    message = refused.value.message
    assert "not on the local runner" in message and "workspace_transfer" in message
    assert "copy it back first" in message.lower()
    with pytest.raises(InvalidInput, match="already declared"):
        await plane.artifacts.declare("back/result.txt", name="checksum")
    with pytest.raises(NotFound, match="has nothing at"):
        await plane.artifacts.declare("back/none.txt")


# ---------------------------------------------------------------------- T1: permissions


async def test_t1_permissions_other_session_invisible_family_allowed(yard: Yard) -> None:
    """T1: discover lists the agent's own workspaces, its parent's and its children's, no
    other; another session's workspace can be neither read nor copied from or into, and is
    reported exactly like a missing one."""
    plane, runner_id = yard.plane, yard.runner_id
    mine = await run(plane, "echo mine > m.txt", runner_id)
    _session, stranger = await plane.store.create_session()
    theirs = await plane.files.write(
        "secret.txt", b"theirs", runner_id=runner_id, agent_id=str(stranger.id)
    )
    other = theirs.workspace_id
    child, child_ws = await child_workspace(plane, runner_id)

    seen = {v.workspace_id: v.relation for v in await plane.transfers.discover()}
    assert seen[mine.workspace_id] == "own" and seen[child_ws] == "child"
    assert other not in seen
    child_seen = {
        v.workspace_id: v.relation for v in await plane.transfers.discover(agent_id=str(child.id))
    }
    assert child_seen[mine.workspace_id] == "parent" and other not in child_seen

    attempts = [
        plane.files.list(FileListQuery(path="", workspace_id=other)),
        plane.files.open("secret.txt", workspace_id=other),
        plane.files.history(FileHistoryQuery(workspace_id=other)),
        plane.files.write("x.txt", b"x", workspace_id=other),
        plane.transfers.start(
            {
                "source_workspace_id": other,
                "paths": ["secret.txt"],
                "target_workspace_id": mine.workspace_id,
            }
        ),
        plane.transfers.start(
            {
                "source_workspace_id": mine.workspace_id,
                "paths": ["m.txt"],
                "target_workspace_id": other,
            }
        ),
        plane.artifacts.declare("secret.txt", workspace_id=other),
    ]
    for attempt in attempts:
        with pytest.raises(NotFound, match=f"no workspace '{other}' that you can use"):
            await attempt
    stranger_view = await plane.transfers.list(TransferListQuery(), agent_id=str(stranger.id))
    assert stranger_view == []

    # family may: the child copies from its parent into its own workspace
    copied = await plane.transfers.start(
        {
            "source_workspace_id": mine.workspace_id,
            "paths": ["m.txt"],
            "target_workspace_id": child_ws,
        },
        agent_id=str(child.id),
    )
    assert (
        await plane.transfers.wait(copied.transfer_id, TransferWait(timeout_s=60), str(child.id))
    ).state == "completed"
    with pytest.raises(NotFound):  # a transfer is visible to its owner only
        await plane.transfers.query(copied.transfer_id)
    with pytest.raises(InvalidInput, match="edit files only in your own"):
        await plane.files.write(
            "x.txt", b"x", workspace_id=mine.workspace_id, agent_id=str(child.id)
        )


# ---------------------------------------------------------------------- PostgreSQL


async def test_files_transfers_artifacts_on_postgresql(home: Path, pg_schema: str) -> None:
    """The same records on PostgreSQL (--database-url): an edit, a transfer with its per-file
    outcomes and notice, history, retention, an artifact."""
    from conftest import POSTGRES_URL
    from shellyard.config import Settings

    settings = Settings(home=home / "pg-home", database_url=POSTGRES_URL, database_schema=pg_schema)
    async with ControlPlane.running(settings) as plane:
        edit = await plane.files.write("a/x.txt", b"x" * 3000)
        ws = edit.workspace_id
        started = await plane.transfers.start(
            {
                "source_workspace_id": ws,
                "paths": ["a"],
                "target_workspace_id": ws,
                "target_folder": "b",
            }
        )
        done = await settle(plane, started.transfer_id)
        assert (done.state, done.files_copied, done.bytes_done) == ("completed", 2, 3000)
        assert {f.outcome for f in (await outcomes(plane, started.transfer_id)).values()} == {
            "copied"
        }
        history = await plane.files.history(FileHistoryQuery())
        assert [s.made_by_kind for s in history.snapshots] == ["created", "edit", "transfer"]
        result = await plane.files.collect(keep_last=1, grace_s=0)
        assert [p.removed for p in result.pruned] == [[0]]  # the edit's seq: the transfer's source
        art = await plane.artifacts.declare("b/a/x.txt")
        assert art.size == 3000 and (await plane.artifacts.list())[0].artifact_id == art.artifact_id
