"""The environment change driver on a change its runner abandoned (docs/environments.md, "A
running change"): how often it asks the runner, and the CPU the control plane's process spends,
while the runner's record says ``running`` and nobody works on it.

Each round is a child process with a control plane and its LocalRunner: a python environment,
an install of a package whose build hangs, the change's task on the runner cancelled (what the
runner's close does past its grace), then a window of ``--window`` seconds in which the
driver's ``environment_change_wait`` calls and the process's CPU seconds are counted. The
runner's wait is wrapped to yield once per call, as a runner behind a transport does; the local
one answers an abandoned change without suspending, so the old driver held the event loop
itself (no window could end). Rounds alternate this checkout's ``src`` with ``--against``'s
(e.g. main exported by ``git archive main src bench | tar -x -C /tmp/exp-left-main``).

    PYTHONPATH=src:bench .venv/bin/python bench/bench_env_abandoned.py \\
        --against /tmp/exp-left-main/src --rounds 2 --out X.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
COMMAND = (
    "PYTHONPATH=src:bench .venv/bin/python bench/bench_env_abandoned.py "
    "--against /tmp/exp-left-main/src"
)


async def child(window_s: float) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from env_fixtures import host_prefix, make_slow_sdist

    from common import make_home, remove_home
    from shellyard.config import Settings
    from shellyard.contract.environments import EnvironmentChangeBody, EnvironmentCreateRequest
    from shellyard.control.plane import build
    from shellyard.runner.protocol import EnvironmentChange, SandboxPolicy

    home = make_home()
    os.environ["SHELLYARD_AGENT_LOCAL_SOURCES"] = str(home)  # the operator's folder: the sdist
    plane = await build(Settings(home=home / "home", local_policy=SandboxPolicy()))
    try:
        created = await plane.environments.create(
            EnvironmentCreateRequest(name="main", wait_ms=30_000)
        )
        prefix = host_prefix(home / "home" / "runners" / "local", created.environment_id)
        make_slow_sdist(home / "sdists", "sy-slow", "1.0", prefix, "hang")
        started = await plane.environments.install(
            created.environment_id,
            EnvironmentChangeBody(
                manager="pip", specs=["sy-slow==1.0"], find_links=[str(home / "sdists")],
                index_url="none", wait_ms=0,
            ),
        )  # fmt: skip
        while not (prefix / ".build-started").exists():
            view = await plane.environments.change_status(started.change_id)
            assert not view.done, view.error
            await asyncio.sleep(0.05)
        runner: Any = plane.runners.get("local")
        waits = 0
        real = runner.environment_change_wait

        async def counted(change_id: str, timeout_s: float) -> EnvironmentChange:
            nonlocal waits
            waits += 1
            await asyncio.sleep(0)  # a transport's yield
            result: EnvironmentChange = await real(change_id, timeout_s)
            return result

        runner.environment_change_wait = counted
        running = runner._environments._running[started.change_id]
        running.task.cancel()
        while started.change_id in runner._environments._running:
            await asyncio.sleep(0.01)
        waits = 0
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(window_s)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        return {"waits": waits, "window_s": wall, "waits_per_s": waits / wall, "cpu_s": cpu}
    finally:
        await plane.aclose()
        remove_home(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--against", type=Path, required=False, help="the other version's src")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.window))))
        return
    versions = {"this": REPO / "src"} | ({"against": args.against} if args.against else {})
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for label, src in versions.items():
            env = {**os.environ, "PYTHONPATH": f"{src}:{REPO / 'bench'}"}
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--window", str(args.window)],
                env=env, capture_output=True, text=True, timeout=600, check=True,
            )  # fmt: skip
            counted = json.loads(done.stdout.splitlines()[-1])
            row = {"round": round_ + 1, "version": label, **counted}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    result = {"name": "env_abandoned", "command": COMMAND, "rows": rows}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
