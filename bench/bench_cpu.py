"""CPU per foreground ``run_shell(true)``: what an operator pays per execution.

Two set-ups, each measured over RUNS sequential foreground runs after a warm-up:

- SQLite + local runner: ``shellyard serve`` as its own process, driven through the SDK
  (REST). Its own CPU (utime + stime, ``/proc/<pid>/stat``) is the control plane's; its
  waited-for children's (cutime + cstime) is the sandboxes' launch and run.
- PostgreSQL + direct runner daemon: one replica (``shellyard serve``) over a runner daemon
  process; the replica's, the daemon's (with its sandboxes) and every PostgreSQL backend's CPU.

The baseline, same run: a minimal bwrap spawn (``bwrap --ro-bind / / --dev /dev --proc /proc
--unshare-all true``) spawned and waited for by this process, its children's CPU per spawn.
``--profile FOLDER``: py-spy's on-CPU samples of the serve process during a second pass
(SQLite and PostgreSQL), summarized to the top functions (own and inclusive), and the serve
process's CPU split into the in-process runner's share and the control plane's.
``--against SRC``: before/after in one run: a second server (and replica) runs the ``src``
folder SRC (e.g. ``git archive`` of an older commit), and the two are driven in alternating
batches of 10 runs, so both see the same load; reported side by side in ``details.against``.

    .venv/bin/python bench/bench_cpu.py [--quick] [--profile FOLDER] [--against SRC] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from common import (
    PYTHON,
    MinimalBwrap,
    cli,
    make_home,
    metric,
    postgres_and_daemon,
    remove_home,
    start_server,
    stop_server,
    summarize_collapsed,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from replicas_fixture import fresh_database, replica_env, start_replicas, stop_all
from runner_daemon_fixture import start_daemon

from shellyard import loops
from shellyard.home import read_info
from shellyard.runner.protocol import SandboxPolicy
from shellyard.sdk.client import AsyncClient

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(own, waited-for children's) CPU seconds of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


def postgres_cpu(database: str) -> float:
    """CPU seconds of the PostgreSQL backends serving ``database`` (their command line names
    it): other work on the machine uses the same server. The server's shared helpers (WAL
    writer, checkpointer) are left out."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "postgres":
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f" {database} " in cmdline.replace("\0", " "):
            total += sum(cpu_split(int(entry)))
    return total


def minimal_cpu_ms(runs: int) -> float:
    """Children's CPU per minimal bwrap spawn, measured here (RUSAGE_CHILDREN)."""
    minimal = MinimalBwrap()
    for _ in range(5):
        minimal.run()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        minimal.run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used * 1000 / runs


class Spy:
    """py-spy's on-CPU samples (no --idle) of one process for a ``with`` block."""

    def __init__(self, pid: int, out: Path | None) -> None:
        self.pid, self.out = pid, out
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Spy:
        exe = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
        if self.out is None or not Path(exe).exists():
            return self
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(self.pid), "--rate", "500", "--format", "raw",
             "--threads", "--nonblocking", "--output", str(self.out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


#: Leaf frames of a thread that is not running (waiting in the loop's selector, a lock, a
#: thread pool's queue): not CPU, left out of the split below.
IDLE_LEAVES = ("select (", "poll (", ".wait (", "wait (threading", "get (queue", "_worker (")


def runner_share(path: Path) -> dict[str, Any]:
    """The share of a serve process's busy samples (every thread) that has a frame of the
    in-process local runner (``shellyard/runner/``) on its stack: the runner's own spawn
    bookkeeping (execution folder, files, cgroup, warm sandbox, snapshot commit), which a
    runner outside the server (a daemon, DESIGN's 2.5 ms assumption) would spend in its own
    process. The rest is the control plane's (HTTP, auth, store, records)."""
    if not path.exists():
        return {}
    busy = runner = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit() or "PySpy.__enter__" in stack:
            continue
        leaf = stack.rsplit(";", 1)[-1]
        if any(marker in leaf for marker in IDLE_LEAVES):
            continue
        busy += int(count_text)
        if "(shellyard/runner/" in stack:
            runner += int(count_text)
    return {"busy_samples": busy, "runner_fraction": runner / busy if busy else 0.0}


async def _runs(once: Any, runs: int) -> None:
    for _ in range(runs):
        await once()


async def sqlite_local(runs: int, profile: Path | None) -> dict[str, Any]:
    home = make_home()
    try:
        pid = start_server(home)
        info = read_info(home)
        assert info is not None
        client = AsyncClient(info.url, info.token)

        async def once() -> None:
            result = await client.run("true")
            if result.state != "completed":
                raise RuntimeError(f"run of true ended {result.state}")

        await _runs(once, 30)
        own0, kids0 = cpu_split(pid)
        began = time.monotonic()
        await _runs(once, runs)
        wall = time.monotonic() - began
        own1, kids1 = cpu_split(pid)
        summary: dict[str, Any] = {}
        if profile is not None:
            out = profile / "cpu-sqlite-collapsed.txt"
            with Spy(pid, out):
                await _runs(once, runs)
            summary = summarize_collapsed(out, top=15)
            summary["split"] = runner_share(out)
        await client.aclose()
        server_ms = (own1 - own0) * 1000 / runs
        fraction = summary.get("split", {}).get("runner_fraction")
        return {
            "runs": runs,
            "server_ms": server_ms,
            # Estimated from the profile's samples (None without --profile).
            "runner_in_server_ms": None if fraction is None else server_ms * fraction,
            "control_plane_ms": None if fraction is None else server_ms * (1 - fraction),
            "children_ms": (kids1 - kids0) * 1000 / runs,
            "wall_ms": wall * 1000 / runs,
            "profile": summary,
        }
    finally:
        stop_server(home)
        remove_home(home)


async def postgres_daemon(runs: int, profile: Path | None) -> dict[str, Any]:
    async with postgres_and_daemon() as pair:
        replica, daemon, database, once = pair.replica, pair.daemon, pair.database, pair.once
        assert replica.process is not None and daemon.process is not None
        await _runs(once, 30)
        rep0, dae0, pg0 = (
            sum(cpu_split(replica.process.pid)),
            sum(cpu_split(daemon.process.pid)),
            postgres_cpu(database),
        )
        began = time.monotonic()
        await _runs(once, runs)
        wall = time.monotonic() - began
        rep1, dae1, pg1 = (
            sum(cpu_split(replica.process.pid)),
            sum(cpu_split(daemon.process.pid)),
            postgres_cpu(database),
        )
        summary: dict[str, Any] = {}
        if profile is not None:
            out = profile / "cpu-postgres-collapsed.txt"
            with Spy(replica.process.pid, out):
                await _runs(once, runs)
            summary = summarize_collapsed(out, top=15)
    replica_ms = (rep1 - rep0) * 1000 / runs
    daemon_ms = (dae1 - dae0) * 1000 / runs
    postgres_ms = (pg1 - pg0) * 1000 / runs
    return {
        "runs": runs,
        "replica_ms": replica_ms,
        "daemon_ms": daemon_ms,
        "postgres_ms": postgres_ms,
        "total_ms": replica_ms + daemon_ms + postgres_ms,
        "wall_ms": wall * 1000 / runs,
        "profile": summary,
    }


BATCH = 10


async def _alternate(sides: list[Any], runs: int) -> list[dict[str, float]]:
    """``sides``: (once, cpu) pairs; ``cpu()`` gives a dict of CPU seconds by part. Batches
    of BATCH runs alternate between the sides (which one goes first alternates too); the
    CPU per run of each part, per side."""
    used = [dict.fromkeys(cpu(), 0.0) for _once, cpu in sides]
    for _ in range(3):
        for once, _cpu in sides:
            await _runs(once, BATCH)
    for batch in range(max(1, runs // BATCH)):
        order = range(len(sides)) if batch % 2 == 0 else reversed(range(len(sides)))
        for index in order:
            once, cpu = sides[index]
            before = cpu()
            await _runs(once, BATCH)
            after = cpu()
            for part in used[index]:
                used[index][part] += after[part] - before[part]
    done = max(1, runs // BATCH) * BATCH
    return [{part: 1000 * value / done for part, value in side.items()} for side in used]


Side = tuple[Callable[[], Awaitable[None]], Callable[[], dict[str, float]]]


def server_side(client: AsyncClient, pid: int) -> Side:
    """One side of ``_alternate``: a ``run("true")`` through ``client``, and the CPU of the
    server ``pid`` (its own, its children's)."""

    async def once() -> None:
        result = await client.run("true")
        if result.state != "completed":
            raise RuntimeError(f"run of true ended {result.state}")

    def cpu() -> dict[str, float]:
        own, kids = cpu_split(pid)
        return {"server_ms": own, "children_ms": kids}

    return once, cpu


@contextlib.asynccontextmanager
async def servers_against(src: Path) -> AsyncIterator[list[tuple[Path, AsyncClient, int]]]:
    """``--against``'s two sides: a ``shellyard serve`` of this tree, then one of ``src`` (its
    PYTHONPATH), each on a fresh home with an SDK client: (home, client, server pid). The
    clients are closed, the servers stopped and the homes removed on the way out."""
    homes = [make_home(), make_home()]
    clients: list[AsyncClient] = []
    try:
        servers = []
        for home, env in zip(homes, [None, {"PYTHONPATH": str(src)}], strict=True):
            pid = start_server(home, env)
            info = read_info(home)
            assert info is not None
            client = AsyncClient(info.url, info.token)
            clients.append(client)
            servers.append((home, client, pid))
        yield servers
    finally:
        for client in clients:
            await client.aclose()
        for home in homes:
            stop_server(home)
            remove_home(home)


async def sqlite_against(runs: int, src: Path) -> dict[str, Any]:
    async with servers_against(src) as servers:
        sides = [server_side(client, pid) for _, client, pid in servers]
        after, before = await _alternate(sides, runs)
    return {"runs": runs, "after": after, "before": before}


async def postgres_against(runs: int, src: Path) -> dict[str, Any]:
    root = make_home()
    daemons = [await start_daemon(root / f"daemon{i}", SandboxPolicy(), subprocess=True)
               for i in range(2)]  # fmt: skip
    replicas: list[Any] = []
    try:
        async with fresh_database() as url_a, fresh_database() as url_b:
            sides = []
            async with httpx.AsyncClient(timeout=120) as http:
                for url, env, daemon in zip(
                    [url_a, url_b],
                    [replica_env(), replica_env(PYTHONPATH=str(src))],
                    daemons,
                    strict=True,
                ):
                    replica = (await start_replicas(url, 1, env))[0]
                    replicas.append(replica)
                    answer = await http.post(
                        replica.url + "/v1/runners",
                        json={"runner_id": "r0", "address": daemon.url, "token": daemon.token},
                    )
                    answer.raise_for_status()
                    agent = (await http.post(replica.url + "/v1/sessions")).json()["main_agent_id"]

                    async def once(base: str = replica.url, agent: str = agent) -> None:
                        answer = await http.post(
                            base + "/v1/executions",
                            json={"command": "true", "runner_id": "r0", "wait_ms": 30000},
                            headers={"X-Shellyard-Agent": agent},
                        )
                        view = answer.json()
                        if view.get("state") != "completed":
                            raise RuntimeError(f"run of true: {view}")

                    def cpu(
                        replica: Any = replica,
                        daemon: Any = daemon,
                        database: str = url.rsplit("/", 1)[1],
                    ) -> dict[str, float]:
                        return {
                            "replica_ms": sum(cpu_split(replica.process.pid)),
                            "daemon_ms": sum(cpu_split(daemon.process.pid)),
                            "postgres_ms": postgres_cpu(database),
                        }  # fmt: skip

                    sides.append((once, cpu))
                after, before = await _alternate(sides, runs)
            stop_all(replicas)
            replicas = []
    finally:
        stop_all(replicas)
        for daemon in daemons:
            await daemon.stop()
        remove_home(root)
    for side in (after, before):
        side["total_ms"] = side["replica_ms"] + side["daemon_ms"] + side["postgres_ms"]
    return {"runs": runs, "after": after, "before": before}


def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = 100 if args.quick else 400
    minimal_before = minimal_cpu_ms(runs)
    local = loops.run(sqlite_local(runs, args.profile))
    remote = loops.run(postgres_daemon(runs // 2, args.profile))
    against: dict[str, Any] = {}
    src: Path | None = getattr(args, "against", None)  # run_all.py passes none
    if src is not None:
        if not (src / "shellyard" / "__init__.py").is_file():
            raise SystemExit(f"--against {src}: not a src folder (no shellyard/__init__.py in it)")
        against = {
            "src": str(src),
            "sqlite_local": loops.run(sqlite_against(runs, src)),
            "postgres_daemon": loops.run(postgres_against(runs // 2, src)),
        }
    minimal = (minimal_before + minimal_cpu_ms(runs)) / 2
    baseline = "minimal bwrap spawn, children's CPU ms"
    metrics = [
        metric(
            "cpu.server_sqlite_local",
            "server CPU per foreground run_shell(true), SQLite + local, ms",
            local["server_ms"],
            "ms",
            baseline_label=baseline,
            baseline_value=minimal,
            target="≤ 2.5 ms",
            kind="abs_max",
            limit=2.5,
        ),
        metric(
            "cpu.total_postgres_daemon",
            "CPU per foreground run_shell(true), replica + daemon + PostgreSQL, ms",
            remote["total_ms"],
            "ms",
            baseline_label=baseline,
            baseline_value=minimal,
            target="≤ 25 ms",
            kind="abs_max",
            limit=25.0,
        ),
    ]
    return {
        "name": "cpu",
        "title": "CPU per foreground run_shell(true): server, sandbox, daemon, PostgreSQL",
        "command": "python bench/bench_cpu.py" + (" --quick" if args.quick else ""),
        "metrics": metrics,
        "details": {
            "minimal_bwrap_cpu_ms": minimal,
            "sqlite_local": local,
            "postgres_daemon": remote,
            "against": against,
            "load_average": os.getloadavg(),
        },
    }


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--against",
        type=Path,
        help="a src folder of another version, driven in alternating batches beside this one",
    )


if __name__ == "__main__":
    cli("cpu", run, __doc__ or "", _options)
