"""Several ``shellyard serve`` replicas on one PostgreSQL database (issue 16).

Each replica is a real ``python -m shellyard serve`` process with a home of its own, serving
on loopback without tokens, on a database created for the test (``fresh_database``) and
dropped afterwards. ``kill()`` SIGKILLs one (its leases then expire), ``start()`` starts it
again on the same home.

    async with fresh_database() as url:
        replicas = await start_replicas(url, root, 3)
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from leftover_mounts import remove_home

SERVER = "postgresql://postgres@127.0.0.1:5432"
START_TIMEOUT_S = 90.0


def postgres_or_skip() -> None:
    import psycopg
    import pytest

    try:
        psycopg.connect(f"{SERVER}/test", connect_timeout=3).close()
    except psycopg.Error:
        pytest.skip("no PostgreSQL server reachable at 127.0.0.1:5432 on this machine")


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """A new database on the machine's PostgreSQL (CREATE DATABASE), dropped at the end."""
    import psycopg

    name = f"sy_rep_{secrets.token_hex(5)}"
    with psycopg.connect(f"{SERVER}/test", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{SERVER}/{name}"
    finally:
        with psycopg.connect(f"{SERVER}/test", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query(url: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Read the database directly (what the replicas recorded)."""
    import psycopg

    with psycopg.connect(url) as conn:
        return list(conn.execute(sql, params).fetchall())


def make_home() -> Path:
    path = Path(tempfile.mkdtemp(prefix="shellyard-replica-", dir="/tmp"))
    path.chmod(0o711)
    return path


@dataclass
class Replica:
    """One ``shellyard serve`` process (or none, between ``kill`` and ``start``)."""

    name: str
    home: Path
    database_url: str
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    url: str = ""
    replica_id: str = ""
    log: Path = field(default_factory=Path)
    starts: int = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    async def start(self) -> None:
        (self.home / "server.json").unlink(missing_ok=True)
        self.log = self.home / f"serve-{self.starts}.log"
        self.starts += 1
        argv = [
            sys.executable, "-m", "shellyard", "serve",
            "--home", str(self.home),
            "--database-url", self.database_url,
            "--no-auth", "--log-level", "info", "--log-format", "json",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        await self.wait_ready()

    async def wait_ready(self) -> None:
        from shellyard.home import read_info

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text()[-4000:]}")
            info = read_info(self.home)
            if info is not None and info.pid == self.process.pid:
                async with httpx.AsyncClient(base_url=info.url, timeout=10) as client:
                    answer = await client.get("/readyz")
                if answer.status_code == 200:
                    self.url = info.url
                    self.replica_id = str(answer.json()["replica"])
                    return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not get ready:\n{self.log.read_text()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: no hand-over, its leases expire."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def client(self, timeout_s: float = 60) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=timeout_s)


async def register(replica: Replica, daemons: Sequence[Any]) -> None:
    """Register runner daemons (``runner_daemon_fixture.RunnerDaemon``) through ``replica``
    as ``direct`` runners ``r0``, ``r1``, …; every replica hears of them."""
    async with replica.client() as client:
        for i, daemon in enumerate(daemons):
            answer = await client.post(
                "/v1/runners",
                json={"runner_id": f"r{i}", "address": daemon.url, "token": daemon.token},
            )
            assert answer.status_code == 200, answer.text


def replica_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop("SHELLYARD_HOME", None)
    env.pop("SHELLYARD_DATABASE_URL", None)
    return env


async def start_replicas(
    database_url: str, count: int, env: dict[str, str] | None = None
) -> list[Replica]:
    """``count`` replicas started at the same moment on one database (a fresh database's
    first use races: migrations, the default owner)."""
    replicas = [
        Replica(f"replica{i}", make_home(), database_url, env or replica_env())
        for i in range(count)
    ]
    await asyncio.gather(*(r.start() for r in replicas))
    return replicas


def stop_all(replicas: Sequence[Replica]) -> None:

    for replica in replicas:
        replica.stop()
        # What went wrong inside a replica, in the test's output (its home goes now).
        for log in sorted(replica.home.glob("serve-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if '"level": "error"' in line or "Traceback" in line:
                    print(f"{replica.name} {log.name}: {line[:3000]}")
        remove_home(replica.home)  # with what a killed replica left mounted in it
