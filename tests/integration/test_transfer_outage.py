"""R3 for transfers: a transfer to or from a remote runner (``direct`` or over SSH) that is
cut off mid-transfer (its daemon killed, or the SSH connection dropped and kept down)
finishes per file or fails per file: every file has an outcome with a reason, every file
recorded ``copied`` is in the target snapshot with its bytes, no file of the target is
half-written, and the same transfer started again once the runner is back completes."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from files_helpers import read_all, run, tree
from runner_daemon_fixture import RunnerDaemon, start_daemon
from sshd_fixture import SshServer, sshd_or_skip, start_sshd

from conftest import open_yard
from shellyard.contract.files import TransferFilesQuery, TransferWait
from shellyard.control.plane import ControlPlane
from shellyard.runner.protocol import SandboxPolicy

pytestmark = pytest.mark.timeout(300)

POLICY = SandboxPolicy(network="off", cancel_grace_s=1.0)
COUNT, SIZE = 24, 256 << 10  # 24 files of 256 KiB in batches of 2: 12 batches
MAKE = f"""python3 - <<'PY'
import os
os.makedirs("data", exist_ok=True)
for i in range({COUNT}):
    with open(f"data/f{{i:03d}}.bin", "wb") as f:
        f.write(os.urandom({SIZE}))
PY"""


class Far:
    """The remote runner ``far`` of a control plane: its daemon (a child process) and, for
    an ssh runner, the sshd in front of it."""

    def __init__(self, daemon: RunnerDaemon, sshd: SshServer | None) -> None:
        self.daemon, self.sshd = daemon, sshd

    def cut(self, how: str) -> None:
        if how == "kill the daemon":
            self.daemon.kill()
        else:
            assert self.sshd is not None
            self.sshd.stop()

    async def mend(self, how: str) -> None:
        if how == "kill the daemon":
            await self.daemon.restart()
        else:
            assert self.sshd is not None
            await self.sshd.start()


@pytest.fixture
async def far_yard(
    home: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[ControlPlane, Far]]:
    kind = request.param
    plane, _, _ = await open_yard(home, "local", POLICY)
    plane.transfers.retry_base_s = 0.05
    sshd: SshServer | None = None
    if kind == "ssh":
        sshd_or_skip()
        sshd = await start_sshd(home / "sshd")
    daemon = await start_daemon(home / "far", POLICY, subprocess=True, ssh=sshd)
    try:
        if sshd is not None:
            await plane.runners.add_ssh(
                "far", daemon.address, daemon.token, sshd.identity, sshd.known_hosts
            )
        else:
            await plane.runners.add_direct("far", daemon.url, daemon.token)
        yield plane, Far(daemon, sshd)
    finally:
        await plane.aclose()
        await daemon.stop()
        if sshd is not None:
            sshd.stop()


async def _outcomes(plane: ControlPlane, transfer_id: str) -> dict[str, Any]:
    page = await plane.transfers.files(transfer_id, TransferFilesQuery(limit=10_000))
    return {f.target_path: f for f in page.files}


async def _cut_mid_transfer(
    plane: ControlPlane, far: Far, how: str, source: str, target: str
) -> tuple[str, Any]:
    """Start the transfer, cut the runner once a batch is committed; the settled view."""
    request = {
        "source_workspace_id": source,
        "paths": ["data"],
        "target_workspace_id": target,
        "target_folder": "in",
        "batch_files": 2,
        # 6 MiB at 1 MiB/s: about 6 s, so the cut lands part-way
        "max_bytes_per_s": 1 << 20,
    }
    started = await plane.transfers.start(request)
    for _ in range(3000):
        view = await plane.transfers.query(started.transfer_id)
        if view.files_copied >= 4 or view.terminal:
            break
        await asyncio.sleep(0.01)
    assert view.state == "running", view
    far.cut(how)
    settled = await plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=120))
    assert settled.terminal, settled
    return started.transfer_id, settled


async def _check_per_file(
    plane: ControlPlane, transfer_id: str, view: Any, target: str, sums: dict[str, str]
) -> dict[str, Any]:
    """Every file has an outcome; the copied ones are committed with their bytes; the
    others failed with a reason naming the runner; the target's snapshot holds only whole
    files. Returns the target's tree."""
    files = await _outcomes(plane, transfer_id)
    assert len(files) == COUNT + 1  # the folder and its files
    assert view.state == "partial" and view.error, view
    assert "pending" not in {f.outcome for f in files.values()}
    copied = {p for p, f in files.items() if f.outcome == "copied"}
    failed = {p: f for p, f in files.items() if f.outcome == "failed"}
    # never reached: the transfer stopped before their batch
    skipped = {p: f for p, f in files.items() if f.outcome == "skipped"}
    assert copied and failed and len(copied) + len(failed) + len(skipped) == COUNT + 1
    assert view.files_copied == len(copied) and view.files_failed == len(failed)
    assert view.files_skipped == len(skipped)
    assert all(f.target_seq is not None for p, f in files.items() if p in copied)
    assert all(f.reason and "runner" in f.reason for f in failed.values()), failed
    assert all("the transfer stopped" in (f.reason or "") for f in skipped.values()), skipped
    present = await tree(plane, target)
    assert copied <= set(present)
    for path, entry in present.items():
        if entry.kind == "file":  # whole files only: each one's bytes are its source's
            assert entry.sha256 == sums[path], path
    return present


async def _sums(plane: ControlPlane, workspace_id: str) -> dict[str, str]:
    return {
        "in/" + p: e.sha256
        for p, e in (await tree(plane, workspace_id)).items()
        if e.kind == "file"
    }


@pytest.mark.parametrize(
    ("far_yard", "how"),
    [pytest.param(k, h, id=f"to-{k}-{h.split()[0]}") for k, h in
     [("direct", "kill the daemon"), ("ssh", "kill the daemon"),
      ("ssh", "drop the ssh connection")]],
    indirect=["far_yard"],
)  # fmt: skip
async def test_transfer_to_a_runner_cut_off_fails_per_file_then_retry_completes(
    far_yard: tuple[ControlPlane, Far], how: str
) -> None:
    """R3, T3: local → far, the far runner cut part-way."""
    plane, far = far_yard
    made = await run(plane, MAKE, "local")
    target = (await run(plane, "true", "far")).workspace_id
    sums = await _sums(plane, made.workspace_id)
    transfer_id, view = await _cut_mid_transfer(plane, far, how, made.workspace_id, target)
    await far.mend(how)
    await _until_up(plane)
    await _check_per_file(plane, transfer_id, view, target, sums)

    again = await _retry(plane, made.workspace_id, target)
    assert again.state == "completed" and again.files_failed == 0, again
    present = await tree(plane, target)
    assert {p: e.sha256 for p, e in present.items() if e.kind == "file"} == sums
    first = next(iter(sorted(sums)))
    data = await read_all(plane, first, workspace_id=target)
    assert hashlib.sha256(data).hexdigest() == sums[first]


@pytest.mark.parametrize(
    ("far_yard", "how"),
    [pytest.param(k, h, id=f"from-{k}-{h.split()[0]}") for k, h in
     [("direct", "kill the daemon"), ("ssh", "drop the ssh connection")]],
    indirect=["far_yard"],
)  # fmt: skip
async def test_transfer_from_a_runner_cut_off_fails_per_file_then_retry_completes(
    far_yard: tuple[ControlPlane, Far], how: str
) -> None:
    """R3, T3: far → local, the far (source) runner cut part-way."""
    plane, far = far_yard
    made = await run(plane, MAKE, "far")
    target = (await run(plane, "true", "local")).workspace_id
    sums = await _sums(plane, made.workspace_id)
    transfer_id, view = await _cut_mid_transfer(plane, far, how, made.workspace_id, target)
    await _check_per_file(plane, transfer_id, view, target, sums)
    # the import cut mid-object left no temp file (nor its descriptor) in the target's store
    tmp = Path(plane.settings.local_runner_root) / "snapshots" / "objects" / "tmp"
    assert list(tmp.iterdir()) == []
    await far.mend(how)

    again = await _retry(plane, made.workspace_id, target)
    assert again.state == "completed" and again.files_failed == 0, again
    present = await tree(plane, target)
    assert {p: e.sha256 for p, e in present.items() if e.kind == "file"} == sums


async def _until_up(plane: ControlPlane) -> None:
    """What an operator does before trying again: wait until ``runner show`` says up."""
    for _ in range(600):
        await plane.runners.heartbeat()
        if (await plane.runners.view("far")).state == "up":
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the far runner did not come back")


async def _retry(plane: ControlPlane, source: str, target: str) -> Any:
    """The same transfer started again: what was committed is ``unchanged``, the rest
    copied."""
    await _until_up(plane)
    started = await plane.transfers.start(
        {"source_workspace_id": source, "paths": ["data"], "target_workspace_id": target,
         "target_folder": "in", "batch_files": 2}
    )  # fmt: skip
    view = await plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=120))
    assert view.files_copied + view.files_unchanged == COUNT + 1, view
    return view


@pytest.mark.parametrize("far_yard", ["ssh"], indirect=True)
async def test_a_short_ssh_drop_mid_transfer_costs_only_time(
    far_yard: tuple[ControlPlane, Far],
) -> None:
    """R3: the SSH connection dropped twice while batches cross (and made again on the next
    try): every file is copied, none failed, the target holds them all."""
    plane, _far = far_yard
    made = await run(plane, MAKE, "local")
    target = (await run(plane, "true", "far")).workspace_id
    sums = await _sums(plane, made.workspace_id)
    tunnel = plane.runners.get("far")._client._transport.tunnel  # type: ignore[attr-defined]
    started = await plane.transfers.start(
        {"source_workspace_id": made.workspace_id, "paths": ["data"],
         "target_workspace_id": target, "target_folder": "in", "batch_files": 2,
         "max_bytes_per_s": 1 << 20}
    )  # fmt: skip
    connects = tunnel.connects
    for goal in (4, 12):
        for _ in range(3000):
            view = await plane.transfers.query(started.transfer_id)
            if view.files_copied >= goal and view.bytes_in_flight > 0:
                break
            await asyncio.sleep(0.005)
        tunnel.disconnect()
    view = await plane.transfers.wait(started.transfer_id, TransferWait(timeout_s=120))
    assert view.state == "completed" and view.files_copied == COUNT + 1, view
    assert tunnel.connects >= connects + 2  # it really was cut, twice
    present = await tree(plane, target)
    assert {p: e.sha256 for p, e in present.items() if e.kind == "file"} == sums
