"""Instructions per foreground ``run_shell(true)`` of ``shellyard serve`` (SQLite, local
runner), this tree's ``src`` against another's: the server's CPU per call as a figure the
load of a shared machine does not move.

Each side's ``shellyard serve`` runs under ``valgrind --tool=callgrind --instr-atstart=no``
(its start is not counted); this process drives it through the SDK (``AsyncClient.run``,
REST, the client outside valgrind), and after WARMUP runs ``callgrind_control -i on``
counts the instructions of CALLS runs (every thread of the server: the loop's, the warm
sandbox's worker threads, uvloop's), then ``-i off``. The sandboxes (bwrap and its children)
run natively: valgrind follows no child. Only user-space instructions are counted (the
kernel's share of a system call is not), and the instrumented server runs ~50× slower, so
which runs find their warm sandbox ready differs from a native run: compare the two sides of
one run, alternated in ABBA order over PAIRS pairs.

``--history N``: before the warm-up, N ended executions of the same agent are written into
the home's database (as a home that has served a while holds them; records are kept 90 days),
the same rows for both sides.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_server_instructions.py --against SRC \
        [--calls N] [--pairs P] [--history N] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import PYTHON, make_home, remove_home, write_result

WARMUP = 20
BENCH = Path(__file__).resolve().parent

#: libseccomp's probes of the kernel fail under valgrind (EINVAL from ``seccomp_attr_set``),
#: so the server under valgrind is given the filter built natively by this process: the
#: same bytes the runner writes, its sandboxes unchanged. Valgrind 3.19 knows neither
#: ``pidfd_open`` nor ``pidfd_send_signal``: bench/pidfd_emulation.py stands in for them.
SERVE_SCRIPT = """
import sys
from pathlib import Path
import shellyard.runner.sandbox.seccomp as seccomp
program = Path(sys.argv.pop(1)).read_bytes()
seccomp.build_filter = lambda: program
sys.path.insert(0, sys.argv.pop(1))
import pidfd_emulation
pidfd_emulation.install()
from shellyard.cli.entry import main
sys.argv[0] = "shellyard"
main()
"""
FILTER_SCRIPT = """
import sys
from pathlib import Path
from shellyard.runner.sandbox.seccomp import build_filter
Path(sys.argv[1]).write_bytes(build_filter())
"""


def callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def instructions(out: Path) -> int:
    """The ``totals:`` line of a callgrind output (summed over its per-thread parts)."""
    total = 0
    for part in out.parent.glob(out.name + "*"):
        for line in part.read_text().splitlines():
            if line.startswith("totals:"):
                total += int(line.split()[1])
    if not total:
        raise RuntimeError(f"no totals in {out}")
    return total


def counting(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True,
                   capture_output=True)  # fmt: skip


def _served(home: Path, process: subprocess.Popen[bytes], timeout_s: float) -> Any:
    """The server's info once it answers (valgrind makes its start slow)."""
    from shellyard.home import _healthy, read_info

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server under valgrind exited {process.returncode}")
        info = read_info(home)
        if info is not None and _healthy(info):
            return info
        time.sleep(0.5)
    raise RuntimeError("the server under valgrind did not come up")


def _history(home: Path, agent_id: str, workspace_id: str, count: int) -> None:
    """``count`` ended executions of an older day, written beside the server (WAL)."""
    import sqlalchemy as sa

    from shellyard.store.schema import executions

    now = time.time() - 86400
    rows = [
        {"id": f"ex_hist{i:08d}", "seq": i + 1, "agent_id": agent_id,
         "workspace_id": workspace_id, "runner_id": "local", "command": "true",
         "background": False, "state": "completed", "exit_code": 0, "created_at": now,
         "started_at": now, "finished_at": now}
        for i in range(count)
    ]  # fmt: skip
    engine = sa.create_engine(f"sqlite:///{home / 'shellyard.db'}", connect_args={"timeout": 30})
    with engine.begin() as conn:
        conn.execute(executions.insert(), rows)
    engine.dispose()


async def _drive(url: str, token: str, pid: int, calls: int, home: Path, history: int) -> float:
    from shellyard.sdk.client import AsyncClient

    client = AsyncClient(url, token)
    try:
        if history:
            first = await client.run("true")
            _history(home, first.agent_id, first.workspace_id, history)
        for _ in range(WARMUP):
            await client.run("true")
        counting(pid, True)
        began = time.monotonic()
        for _ in range(calls):
            result = await client.run("true")
            if result.state != "completed":
                raise RuntimeError(f"run of true ended {result.state}: {result.error}")
        wall = time.monotonic() - began
        counting(pid, False)
        return wall
    finally:
        await client.aclose()


def side(src: Path, out: Path, calls: int, history: int = 0) -> dict[str, Any]:
    """One server of ``src`` under callgrind: instructions per run."""
    home = make_home()
    env = {**os.environ, "SHELLYARD_HOME": str(home), "PYTHONPATH": str(src)}
    program = out.with_suffix(".bpf")
    # natively, with this side's own filter
    subprocess.run([PYTHON, "-c", FILTER_SCRIPT, str(program)], env=env, check=True)
    argv = [*callgrind(out), PYTHON, "-c", SERVE_SCRIPT, str(program), str(BENCH), "serve",
            "--home", str(home)]  # fmt: skip
    log = (home.parent / (home.name + "-valgrind.log")).open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        info = _served(home, process, 300)
        wall = asyncio.run(_drive(info.url, info.token, process.pid, calls, home, history))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        remove_home(home)
        Path(log.name).unlink(missing_ok=True)
    return {
        "instructions_per_call": instructions(out) // calls,
        "wall_ms_per_call_under_valgrind": round(1000 * wall / calls, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--history", type=int, default=0, help="ended executions written first")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--keep", type=Path, help="a folder for callgrind's outputs (callgrind_annotate them)"
    )
    args = parser.parse_args()
    if not (args.against / "shellyard" / "__init__.py").is_file():
        raise SystemExit(f"--against {args.against}: not a src folder")
    this = Path(__file__).resolve().parent.parent / "src"
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shellyard-callgrind-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for pair in range(args.pairs):
            # ABBA: this, against; against, this; …
            order = [("this", this), ("against", args.against)]
            for name, src in order if pair % 2 == 0 else order[::-1]:
                out = Path(folder) / f"{name}-{pair}.out"
                counted = side(src, out, args.calls, args.history)
                counted.update(side=name, pair=pair, load=os.getloadavg()[0])
                print(json.dumps(counted), flush=True)
                runs.append(counted)
    by_side = {
        name: [r["instructions_per_call"] for r in runs if r["side"] == name]
        for name in ("this", "against")
    }
    mean = {name: sum(values) / len(values) for name, values in by_side.items()}
    result = {
        "name": "server_instructions",
        "command": "bench/bench_server_instructions.py",
        "against": str(args.against),
        "calls": args.calls,
        "history": args.history,
        "runs": runs,
        "mean_instructions_per_call": mean,
        "ratio_this_to_against": mean["this"] / mean["against"],
    }
    write_result(result, args.out, indent=2)


if __name__ == "__main__":
    main()
