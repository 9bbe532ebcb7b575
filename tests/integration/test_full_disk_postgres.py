"""A control plane on PostgreSQL whose database's volume fills (docs/limits.md "Full disk,
long commands and bounded records"): writes are refused with ``StoreFull`` (507, retry
later), nothing already recorded is lost, and writes go on once space is freed, without a
restart.

The database is a throwaway one made for the test with a tablespace on a small tmpfs owned by
``postgres`` (tests/support/tmpfs_fixture.py), on the PostgreSQL server of this machine
(127.0.0.1:5432). The volume is filled from outside up to its last few hundred KiB, then by
the product itself: sessions and executions recorded until the database cannot extend a
table. Contract: R2, E1, E7, E9 (a refused write is retryable)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from tmpfs_fixture import mounted_tmpfs

from conftest import POSTGRES_URL, Yard, make_home, postgres_available
from shellyard.cli.exits import EXIT_RETRY, exit_code_of
from shellyard.config import Settings
from shellyard.contract.executions import ExecutionList, ExecutionState, ExecutionWait
from shellyard.control.plane import build
from shellyard.errors import StoreFull, WorkspaceBusy

pytestmark = pytest.mark.timeout(300)

MIB = 1 << 20
#: Room left on the tablespace's volume before the product fills the rest.
LEFT_FOR_THE_PRODUCT = 512 << 10
#: The file that takes the volume's room; the fixture removes it whatever the test reached.
FILLER = "filler"


def _psql(sql: str, database: str = "test") -> None:
    import psycopg

    with psycopg.connect(POSTGRES_URL.rsplit("/", 1)[0] + f"/{database}", autocommit=True) as c:
        c.execute(sql)  # type: ignore[arg-type]


@pytest.fixture
def full_database_url() -> Iterator[tuple[str, Path]]:
    """(URL of a fresh database whose tablespace is a 48 MiB tmpfs, that tmpfs)."""
    if not postgres_available():
        pytest.skip("no PostgreSQL server reachable at 127.0.0.1:5432 on this machine")
    if shutil.which("chown") is None or os.geteuid() != 0:
        pytest.skip("a tablespace folder for postgres needs root to mount and chown a tmpfs")
    name = f"full_{secrets.token_hex(5)}"
    with mounted_tmpfs("48M", "shellyard-pg-full-") as volume:
        subprocess.run(["chown", "postgres:postgres", str(volume)], check=True)
        volume.chmod(0o700)
        _psql(f"CREATE TABLESPACE {name} LOCATION '{volume}'")
        try:
            _psql(f"CREATE DATABASE {name} TABLESPACE {name}")
            try:
                yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}", volume
            finally:
                # Room first, whatever the test reached: the server's dirty pages of a full
                # tablespace fail every checkpoint, and DROP DATABASE asks for one, so a
                # filler left behind broke every later database on this server.
                (volume / FILLER).unlink(missing_ok=True)
                _psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            _psql(f"DROP TABLESPACE IF EXISTS {name}")


@pytest.fixture
async def pg_yard(full_database_url: tuple[str, Path]) -> AsyncIterator[Yard]:
    url, _volume = full_database_url
    home = make_home()
    plane = await build(Settings(home=home / "home", database_url=url))
    try:
        yield Yard(plane, "local", home)
    finally:
        await plane.aclose()
        shutil.rmtree(home, ignore_errors=True)


def _fill(volume: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of the volume."""
    path = volume / FILLER
    st = os.statvfs(volume)
    size = max(0, st.f_bavail * st.f_frsize - leave)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return path


@contextlib.asynccontextmanager
async def _phase(name: str, seconds: float, progress: Callable[[], str]) -> AsyncIterator[None]:
    """A phase that must end within ``seconds`` (it takes ~10 s in all on this machine): a
    hang fails naming the phase and how far it got, not as the whole test's timeout."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        pytest.fail(f"{name} did not end within {seconds:.0f} s ({progress()})")


async def test_a_full_postgres_volume_answers_507_keeps_every_record_and_recovers(
    pg_yard: Yard, full_database_url: tuple[str, Path]
) -> None:
    yard = pg_yard
    _url, volume = full_database_url
    first = await yard.run("echo recorded before")
    assert first.state == ExecutionState.completed and first.stdout == "recorded before\n"
    filler = _fill(volume, LEFT_FOR_THE_PRODUCT)

    sessions: list[str] = []
    filling = _phase("filling the volume", 90, lambda: f"{len(sessions)} sessions made")
    with pytest.raises(StoreFull) as caught:
        async with filling:
            for index in range(100_000):  # the product's own records take the last pages
                sessions.append((await yard.plane.sessions.create()).session_id)
                if index % 50 == 0:
                    await yard.run(f"echo {index}")
    refusal = caught.value
    assert refusal.http_status == 507 and refusal.code == "store_full"
    assert "volume is full" in refusal.message and "retry" in refusal.message
    assert exit_code_of(refusal) == EXIT_RETRY  # the CLI says: retry later
    assert len(sessions) > 10, "the volume was full before the product wrote anything"
    # Each table extends on its own: a run lands while its tables have room in their pages,
    # and is refused with the same 507 once they do not; never a 500. A run whose end cannot
    # be recorded stays running (the runner keeps its outcome) until there is room again.
    ran, waiting, refused = 0, None, None
    async with _phase("the runs on a full volume", 90, lambda: f"{ran} ran"):
        for index in range(2_000):
            try:
                during = await yard.run(f"echo during {index}", wait_ms=3000)
            except StoreFull as exc:
                refused = exc
                break
            ran += 1
            if during.state != ExecutionState.completed:
                assert not during.state.terminal, during
                waiting = during.execution_id
                with pytest.raises(WorkspaceBusy):  # its writer is still held, as it should be
                    await yard.run("echo busy")
                break
            assert during.stdout == f"during {index}\n", during
    assert refused is not None or waiting is not None, "the runs never met the full volume"
    assert refused is None or refused.http_status == 507

    # Nothing recorded before is lost: every session, the first execution and its output.
    for session_id in sessions:
        assert (await yard.plane.sessions.get(session_id)).session_id == session_id
    view = await yard.plane.executions.status(first.execution_id)
    assert view.state == ExecutionState.completed and view.exit_code == 0

    filler.unlink()  # space comes back; no restart
    async with _phase("the recovery", 90, lambda: f"waiting for {waiting}"):
        again = await yard.plane.sessions.create()
        assert again.session_id not in sessions
        if waiting is not None:  # recorded now, with its real outcome, without a restart
            ended = await yard.plane.executions.wait(waiting, ExecutionWait(timeout_s=60))
            assert ended.state == ExecutionState.completed and ended.exit_code == 0, ended
        after = await yard.run("echo after")  # the workspace's writer was not left held
        assert after.state == ExecutionState.completed and after.stdout == "after\n"
    records = await yard.plane.executions.list(ExecutionList(limit=5_000))
    assert all(r.state.terminal for r in records), [r for r in records if not r.state.terminal]
    assert len(records) >= ran + 2
