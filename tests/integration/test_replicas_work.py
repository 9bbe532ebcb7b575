"""Transfers and environment changes across control-plane replicas (issue 16, E11 across
replicas, T3, V5, V8).

Real ``shellyard serve`` replicas on a database made for each test and real runner daemons
(every replica reaches them). The replica copying a transfer, or driving an environment
change, is killed -9 half-way: another replica takes its lease over once it expires and sees
the work through from its record, as a restart of the dead one would. A cancel or a wait
asked on one replica reaches the transfer another replica copies."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import host_prefix, make_slow_sdist, make_wheel, prefix_hash
from replicas_fixture import (
    Replica,
    fresh_database,
    query,
    register,
    replica_env,
    start_replicas,
    stop_all,
)
from runner_daemon_fixture import RunnerDaemon, start_daemon

from shellyard.runner.protocol import SandboxPolicy

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("postgres")]

#: Short leases so a killed replica's work is taken over within seconds.
LEASE_TTL_S = "2"
TERMINAL_TRANSFER = {"completed", "partial", "failed", "cancelled"}


class Setup:
    def __init__(self, url: str, replicas: list[Replica], daemons: list[RunnerDaemon]) -> None:
        self.url = url
        self.replicas = replicas
        self.daemons = daemons

    async def post(self, replica: Replica, path: str, **body: Any) -> dict[str, Any]:
        async with replica.client() as client:
            answer = await client.post(path, json=body)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    async def get(self, replica: Replica, path: str, **params: Any) -> dict[str, Any]:
        async with replica.client() as client:
            answer = await client.get(path, params=params)
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    async def run(self, replica: Replica, command: str, runner_id: str) -> dict[str, Any]:
        result = await self.post(
            replica, "/v1/executions", command=command, runner_id=runner_id, wait_ms=30_000
        )
        assert result["state"] == "completed" and result["exit_code"] == 0, result
        return result

    async def change_end(self, replica: Replica, change_id: str) -> dict[str, Any]:
        """The environment change once it ended, asked through ``replica``."""
        change = await self.get(replica, f"/v1/environment-changes/{change_id}")
        deadline = time.monotonic() + 180
        while change["state"] in ("waiting", "running"):
            assert time.monotonic() < deadline, f"the change never ended: {change}"
            change = await self.get(replica, f"/v1/environment-changes/{change_id}", wait_s=10)
        return change

    def took_over(self, replica: Replica, subject_id: str) -> bool:
        """The replica's log says it took the subject's lease over."""
        text = "".join(p.read_text(errors="replace") for p in replica.home.glob("serve-*.log"))
        return any("lease_takeover" in line and subject_id in line for line in text.splitlines())

    async def slow_transfer(self, replica: Replica, source: str, target: str) -> str:
        """A transfer of ``source``'s ``d/`` into ``target``'s ``in/`` through ``replica``, in
        batches of 2 files at 1 MiB/s (a 40-file ``d/`` of 256 KiB files takes ~10 s)."""
        started = await self.post(
            replica,
            "/v1/transfers",
            source_workspace_id=source,
            paths=["d"],
            target_workspace_id=target,
            target_folder="in",
            batch_files=2,
            max_bytes_per_s=1024 * 1024,
        )
        return str(started["transfer_id"])

    async def until_copied(self, replica: Replica, transfer_id: str, files: int) -> None:
        """Until the transfer counts ``files`` copied (a few batches committed)."""

        async def copied() -> bool:
            view = await self.get(replica, f"/v1/transfers/{transfer_id}")
            return int(view["files_copied"]) >= files

        await _until(copied, f"{files} files of {transfer_id} to be copied")

    def leases_of(self, kind: str) -> int:
        rows = query(self.url, "SELECT count(*) FROM leases WHERE kind = %s", kind)
        return int(rows[0][0])  # type: ignore[call-overload]


async def _setup(url: str, home: Path, lease_ttl_s: str = LEASE_TTL_S) -> Setup:
    daemons = [
        await start_daemon(home / f"daemon{i}", SandboxPolicy(), subprocess=True) for i in range(2)
    ]
    replicas = await start_replicas(url, 2, replica_env(SHELLYARD_LEASE_TTL_S=lease_ttl_s))
    setup = Setup(url, replicas, daemons)
    await register(replicas[0], daemons)
    await asyncio.sleep(0.3)  # the other replica heard of the runners
    return setup


async def _teardown(setup: Setup) -> None:
    for process in [r.process for r in setup.replicas] + [d.process for d in setup.daemons]:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a test that failed while one was stopped
    stop_all(setup.replicas)
    for daemon in setup.daemons:
        await daemon.stop()


async def _source_and_target(setup: Setup, files: int, size: int) -> tuple[str, str, str]:
    """Workspaces of the default agent on r0 (with ``files`` random files in ``d/``) and r1;
    and the source's checksums."""
    a = setup.replicas[0]
    made = await setup.run(
        a,
        f"mkdir d && for i in $(seq 1 {files}); do head -c {size} /dev/urandom > d/f$i; done"
        " && sha256sum d/* > sums",
        "r0",
    )
    target = await setup.run(a, "true", "r1")
    sums = await setup.run(a, "cat sums", "r0")
    return str(made["workspace_id"]), str(target["workspace_id"]), str(sums["stdout"])


def _signal(process: Any, sig: signal.Signals) -> None:
    """SIGSTOP (a stall: a replica's whole process, or a runner daemon that answers nothing)
    or SIGCONT a replica's or a runner daemon's process."""
    assert process is not None and process.poll() is None
    process.send_signal(sig)


def _lease(setup: Setup, transfer_id: str) -> tuple[str, float] | None:
    rows = query(
        setup.url,
        "SELECT holder, expires_at FROM leases WHERE kind = 'transfer' AND subject_id = %s",
        transfer_id,
    )
    return None if not rows else (str(rows[0][0]), float(rows[0][1]))  # type: ignore[arg-type]


async def _just_renewed(setup: Setup, transfer_id: str) -> None:
    """Until the holder of the transfer's lease has just renewed it: what follows happens
    well before its next renewal (a third of the lease time), which would find a lease
    taken from it and stop its copy on its own."""
    first = _lease(setup, transfer_id)
    assert first is not None

    async def renewed() -> bool:
        now = _lease(setup, transfer_id)
        return now is not None and now[1] != first[1]

    await _until(renewed, "the lease to be renewed", 30)


async def _until(predicate: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("lease", ["expired", "missing"])
async def test_a_transfer_whose_replica_dies_is_finished_by_another(home: Path, lease: str) -> None:
    """Replica A copies a cross-runner transfer in small, rate-limited batches and is killed
    -9 after some batches committed. Replica B takes the lease over once it expires and
    copies the pending files: the transfer completes with every file copied or unchanged
    (none failed or skipped), the target holds exactly the source's bytes, and no lease is
    left. ``missing``: the lease row is gone too (as an older release, or a failed lease
    write, leaves a transfer): B's sweep finds the unleased transfer and adopts it."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, b = setup.replicas
        try:
            source, target, sums = await _source_and_target(setup, 40, 256 * 1024)
            transfer_id = await setup.slow_transfer(a, source, target)
            assert setup.leases_of("transfer") == 1
            await setup.until_copied(a, transfer_id, 6)
            a.kill()
            if lease == "missing":
                gone = query(url, "DELETE FROM leases WHERE kind = 'transfer' RETURNING subject_id")
                assert gone == [(transfer_id,)]
            before = await setup.get(b, f"/v1/transfers/{transfer_id}")
            assert before["state"] == "running"
            assert 6 <= before["files_copied"] < before["files_total"], before

            view = before
            deadline = time.monotonic() + 120
            while view["state"] not in TERMINAL_TRANSFER:
                assert time.monotonic() < deadline, f"the transfer never ended: {view}"
                view = await setup.get(b, f"/v1/transfers/{transfer_id}/wait", timeout_s=10)
            assert view["state"] == "completed", view
            assert view["files_failed"] == 0 and view["files_skipped"] == 0, view
            assert view["files_copied"] + view["files_unchanged"] == view["files_total"]
            if lease == "expired":
                assert setup.took_over(b, transfer_id)
            assert setup.leases_of("transfer") == 0
            copied = await setup.run(b, "cd in && sha256sum d/*", "r1")
            assert copied["stdout"] == sums
            # A comes back on its home: the finished transfer is not copied again.
            await a.start()
            again = await setup.get(a, f"/v1/transfers/{transfer_id}")
            assert again["state"] == "completed" and again["batches"] == view["batches"]
        finally:
            await _teardown(setup)


async def test_a_copier_whose_transfer_was_ended_elsewhere_stops_before_its_next_batch(
    home: Path,
) -> None:
    """W1, T3 (docs/security.md "Attack pass (session 51)"): a replica copying a transfer that
    another replica ended meanwhile (it stalled past its lease; the other took it over and
    finished it, stood for here by the record made final in the database) stopped at nothing:
    its batches kept reaching the target, whose writer the end had released, and kept counting
    on a final record. Now the record read before each batch stops it: no file is copied
    after the end, the counters stay as the end left them, and no lease is left."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, _b = setup.replicas
        try:
            source, target, _sums = await _source_and_target(setup, 40, 256 * 1024)
            transfer_id = await setup.slow_transfer(a, source, target)
            await setup.until_copied(a, transfer_id, 4)
            # what the other replica's finish writes: the record final, the writer let go
            query(
                url,
                "UPDATE transfers SET state = 'failed', error = 'ended elsewhere', "
                "finished_at = extract(epoch from now()) WHERE id = %s RETURNING id",
                transfer_id,
            )
            query(
                url,
                "UPDATE workspaces SET writer_kind = NULL, writer_id = NULL "
                "WHERE writer_id = %s RETURNING id",
                transfer_id,
            )
            ended = await setup.get(a, f"/v1/transfers/{transfer_id}")

            async def no_lease() -> bool:
                return setup.leases_of("transfer") == 0

            await _until(no_lease, "A to stop copying and let its lease go", 30)
            await asyncio.sleep(2.0)  # a copier going on would commit a batch a second
            after = await setup.get(a, f"/v1/transfers/{transfer_id}")
            assert after["state"] == "failed" and after["error"] == "ended elsewhere", after
            # at most the batch in flight when the record changed was counted after it
            assert after["files_copied"] <= ended["files_copied"] + 2, (ended, after)
            assert after["files_copied"] < after["files_total"], after
            listed = await setup.run(a, "ls in/d | wc -l", "r1")
            assert int(listed["stdout"]) <= after["files_copied"] + 2, (listed, after)
        finally:
            await _teardown(setup)


async def test_a_batch_in_flight_when_another_replica_ends_the_transfer_never_lands(
    home: Path,
) -> None:
    """W1, T3 (docs/files-and-transfers.md "fenced batches"): replica A's batch is in flight
    (runner r1, the target, stopped: the batch waits on its first call) when another replica
    takes the transfer over and ends it: stood in for by what that end writes in one
    transaction (the lease gone, the record final, the target's writer let go), just after
    A renewed its lease (a lease time of 15 s leaves A 5 s before its next renewal would find
    the lease gone and stop the copy). r1 goes on: A's batch must not be applied to the
    target, whose writer the end released, and what the target holds is what the final
    record counts. Before the fence A applied it and counted it on the final record, over
    the files the end had skipped (counters summing to more than the transfer's files)."""
    async with fresh_database() as url:
        setup = await _setup(url, home, lease_ttl_s="15")
        a, b = setup.replicas
        r1 = setup.daemons[1].process
        try:
            source, target, _sums = await _source_and_target(setup, 40, 256 * 1024)
            transfer_id = await setup.slow_transfer(a, source, target)
            await setup.until_copied(a, transfer_id, 4)
            await _just_renewed(setup, transfer_id)
            _signal(r1, signal.SIGSTOP)
            await asyncio.sleep(1.0)  # A's next batch waits on r1 (its gap is 0.5 s)
            query(url, "DELETE FROM leases WHERE subject_id = %s RETURNING holder", transfer_id)
            query(
                url,
                "UPDATE transfer_files SET outcome = 'skipped', reason = 'ended elsewhere' "
                "WHERE transfer_id = %s AND outcome = 'pending' RETURNING idx",
                transfer_id,
            )
            query(
                url,
                "UPDATE transfers SET state = 'cancelled', finished_at = extract(epoch from "
                "now()), files_skipped = files_total - files_copied - files_unchanged "
                "WHERE id = %s RETURNING id",
                transfer_id,
            )
            query(
                url,
                "UPDATE workspaces SET writer_kind = NULL, writer_id = NULL "
                "WHERE writer_id = %s RETURNING id",
                transfer_id,
            )
            ended = await setup.get(b, f"/v1/transfers/{transfer_id}")
            _signal(r1, signal.SIGCONT)
            # r1 answers again: a batch A went on with is applied within a second
            await asyncio.sleep(3.0)
            after = await setup.get(b, f"/v1/transfers/{transfer_id}")
            assert after["state"] == "cancelled", after
            counted = sum(after[f"files_{o}"] for o in ("copied", "unchanged", "skipped", "failed"))
            assert counted == after["files_total"], after
            # A's batch stopped at the fence before it was applied; one whose apply was on
            # its way when r1 stopped lands (a runner cannot be fenced) and is counted
            assert after["files_copied"] <= ended["files_copied"] + 2, (ended, after)
            listed = await setup.run(b, "ls in/d | wc -l", "r1")
            # the folder ``d`` is an entry too
            assert int(listed["stdout"]) == after["files_copied"] - 1, (listed, after)
            assert setup.leases_of("transfer") == 0
            log = "".join(p.read_text(errors="replace") for p in a.home.glob("serve-*.log"))
            # stopped at the fence (or, had its renewal come first, by the lease's loss)
            assert f"transfer {transfer_id}: stopped copying here" in log or (
                f"lease of transfer {transfer_id} was taken over" in log
            )
        finally:
            await _teardown(setup)


async def test_a_copier_stalled_past_its_lease_publishes_nothing_after_the_takeover(
    home: Path,
) -> None:
    """Two copiers (docs/files-and-transfers.md "fenced batches"): replica A's process is
    stopped (SIGSTOP) with a batch in flight (runner r0, the source, stopped too), its lease
    expires and replica B takes the transfer over; r0 goes on, B copies, and A is let go on
    (SIGCONT) while B copies. The transfer completes through B with every file counted once
    (A's batch, applied or not, is never recorded: its copier no longer holds the lease),
    the target holds exactly the source's bytes, and no lease is left."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, b = setup.replicas
        r0 = setup.daemons[0].process
        try:
            source, target, sums = await _source_and_target(setup, 40, 256 * 1024)
            transfer_id = await setup.slow_transfer(a, source, target)
            await setup.until_copied(a, transfer_id, 4)
            _signal(r0, signal.SIGSTOP)
            await asyncio.sleep(2.0)  # A's next batch waits on r0's export
            _signal(a.process, signal.SIGSTOP)

            async def taken() -> bool:
                lease = _lease(setup, transfer_id)
                return lease is not None and lease[0] == b.replica_id

            await _until(taken, "B to take the lease over", 30)
            _signal(r0, signal.SIGCONT)
            await setup.until_copied(b, transfer_id, 10)  # B copies
            _signal(a.process, signal.SIGCONT)

            view = await setup.get(b, f"/v1/transfers/{transfer_id}")
            deadline = time.monotonic() + 120
            while view["state"] not in TERMINAL_TRANSFER:
                assert time.monotonic() < deadline, f"the transfer never ended: {view}"
                view = await setup.get(b, f"/v1/transfers/{transfer_id}/wait", timeout_s=10)
            assert view["state"] == "completed", view
            assert view["files_failed"] == 0 and view["files_skipped"] == 0, view
            assert view["files_copied"] + view["files_unchanged"] == view["files_total"], view
            assert setup.took_over(b, transfer_id)
            copied = await setup.run(b, "cd in && sha256sum d/*", "r1")
            assert copied["stdout"] == sums
            await asyncio.sleep(1.0)  # A, let go on, had its moment
            final = await setup.get(a, f"/v1/transfers/{transfer_id}")
            counters = ("state", "files_copied", "files_unchanged", "batches", "target_seq")
            assert {k: final[k] for k in counters} == {k: view[k] for k in counters}, final
            assert setup.leases_of("transfer") == 0
        finally:
            await _teardown(setup)


async def test_a_cancel_and_a_wait_on_another_replica_reach_the_copying_one(
    home: Path,
) -> None:
    """A transfer copied by replica A, cancelled through replica B: A stops after its batch
    (T3: the committed files stay), B's wait sees it cancelled, the target's writer is free
    again, and the lease is gone."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, b = setup.replicas
        try:
            source, target, _sums = await _source_and_target(setup, 30, 256 * 1024)
            started = await setup.post(
                a,
                "/v1/transfers",
                source_workspace_id=source,
                paths=["d"],
                target_workspace_id=target,
                batch_files=1,
                max_bytes_per_s=512 * 1024,
            )
            transfer_id = started["transfer_id"]
            await setup.until_copied(b, transfer_id, 2)  # A committed a batch
            view = await setup.post(b, f"/v1/transfers/{transfer_id}/cancel?wait_s=30")
            assert view["state"] == "cancelled", view
            assert 2 <= view["files_copied"] < view["files_total"], view
            assert view["files_skipped"] == view["files_total"] - view["files_copied"]
            assert not setup.took_over(b, transfer_id)  # A stopped it; B took nothing over
            assert setup.leases_of("transfer") == 0
            outcomes = await setup.get(
                b, f"/v1/transfers/{transfer_id}/files", outcome="copied", limit=1000
            )
            copied = sorted(f["target_path"] for f in outcomes["files"] if f["kind"] == "file")
            assert copied  # the folder is an entry too; files were committed before the cancel
            listed = await setup.run(b, "cd d && ls", "r1")
            assert sorted("d/" + name for name in listed["stdout"].split()) == copied
            # A really stopped: at its rate it would commit about six more files in 3 s.
            await asyncio.sleep(3)
            listed = await setup.run(b, "cd d && ls", "r1")
            assert sorted("d/" + name for name in listed["stdout"].split()) == copied
            final = await setup.get(a, f"/v1/transfers/{transfer_id}")
            assert final["files_copied"] == view["files_copied"], final
        finally:
            await _teardown(setup)


async def test_an_environment_change_whose_replica_dies_is_seen_through(home: Path) -> None:
    """Replica A drives an install on runner r0 (a package build that changes the prefix and
    fails after a while) and is killed -9 mid-build. Replica B adopts the change, asks the
    runner about it by its id and records the runner's real end (the build's failure, not
    'interrupted'), the prefix is as before (V8), the execution queued behind the change runs
    on revision 1 (V5), and the environment takes the next change through B."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, b = setup.replicas
        try:
            created = await setup.post(
                a, "/v1/environments", name="main", runner_id="r0", wait_ms=30_000
            )
            environment_id = created["environment_id"]
            made = await setup.change_end(a, created["change_id"])
            assert made["state"] == "succeeded", made
            shown = await setup.get(a, f"/v1/environments/{environment_id}")
            assert shown["prefix"] == "/env"  # V4: where commands see it
            prefix = host_prefix(setup.daemons[0].root, environment_id)
            before = prefix_hash(prefix)
            sdists = home / "sdists"
            make_slow_sdist(sdists, "shellyard-slow", "1.0", prefix, "sleep-fail:8")
            started = await setup.post(
                a,
                f"/v1/environments/{environment_id}/install",
                manager="pip",
                specs=["shellyard-slow==1.0"],
                find_links=[str(sdists)],
                index_url="none",
                wait_ms=0,
            )
            change_id = started["change_id"]
            queued = await setup.post(
                a,
                "/v1/executions",
                command="echo $VIRTUAL_ENV",
                runner_id="r0",
                environment_id=environment_id,
                background=True,
            )

            async def building() -> bool:
                return (prefix / ".build-started").exists()

            await _until(building, "the package build to start")
            a.kill()

            change = await setup.change_end(b, change_id)
            assert change["state"] == "failed", change
            assert change["error_kind"] != "interrupted", change
            assert "gave up building" in (change["error"] or ""), change
            assert setup.took_over(b, change_id)
            assert prefix_hash(prefix) == before
            shown = await setup.get(b, f"/v1/environments/{environment_id}")
            assert shown["revision"] == 1 and shown["pending_changes"] == []

            async def ran() -> bool:
                view = await setup.get(b, f"/v1/executions/{queued['execution_id']}")
                return view["state"] in ("completed", "failed", "cancelled", "unknown")

            await _until(ran, "the queued execution to run")
            view = await setup.get(b, f"/v1/executions/{queued['execution_id']}")
            assert view["state"] == "completed" and view["environment_revision"] == 1, view

            wheels = home / "wheels"
            make_wheel(wheels, "shellyard-good", "1.0")
            good = await setup.post(
                b,
                f"/v1/environments/{environment_id}/install",
                manager="pip",
                specs=["shellyard-good==1.0"],
                find_links=[str(wheels)],
                index_url="none",
                wait_ms=30_000,
            )
            good = await setup.change_end(b, good["change_id"])
            assert good["state"] == "succeeded" and good["revision"] == 2, good
            assert setup.leases_of("change") == 0
        finally:
            await _teardown(setup)


async def test_a_cancel_while_the_copier_is_killed_mid_batch_ends_it_once(home: Path) -> None:
    """W1, T3 (docs/security.md "Attack pass (session 52)", held): replica A copies a
    transfer and is killed -9 mid-way (a batch on its way to the target); the owner cancels it
    through replica B at once. B cannot take A's live lease, so it records the request; once
    the lease expires B takes it over, reads the request and ends the transfer ``cancelled``.
    The target's writer is free again (a command runs there), no lease is left, and what the
    target holds stays as the end left it: the entries recorded copied, none appearing
    after the end."""
    async with fresh_database() as url:
        setup = await _setup(url, home)
        a, b = setup.replicas
        try:
            source, target, _sums = await _source_and_target(setup, 40, 256 * 1024)
            transfer_id = await setup.slow_transfer(a, source, target)
            await setup.until_copied(b, transfer_id, 4)
            a.kill()
            view = await setup.post(b, f"/v1/transfers/{transfer_id}/cancel?wait_s=30")
            assert view["state"] == "cancelled", view
            assert view["files_copied"] < view["files_total"], view
            assert setup.leases_of("transfer") == 0
            outcomes = await setup.get(
                b, f"/v1/transfers/{transfer_id}/files", outcome="copied", limit=1000
            )
            copied = sorted(f["target_path"] for f in outcomes["files"] if f["kind"] == "file")
            listed = await setup.run(b, "cd in/d && ls", "r1")  # the writer is free
            assert sorted("in/d/" + name for name in listed["stdout"].split()) == copied
            await asyncio.sleep(3)
            again = await setup.run(b, "cd in/d && ls", "r1")
            assert again["stdout"] == listed["stdout"], (listed, again)
            final = await setup.get(b, f"/v1/transfers/{transfer_id}")
            assert final["files_copied"] == view["files_copied"], (view, final)
        finally:
            await _teardown(setup)
