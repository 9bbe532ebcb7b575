"""cProfile (thread CPU time) of ``shellyard serve``'s loop thread over RUNS foreground
``run_shell(true)`` driven through the SDK, after 30 unprofiled runs (docs/benchmarks.md §38).

A ``sitecustomize`` put on the server's PYTHONPATH arms a profiler on SIGUSR2 and dumps it on
the second SIGUSR2, so start-up and warm-up are left out. cProfile's own overhead is ~2.5-3x:
read the output as shares.

    PYTHONPATH=src:bench .venv/bin/python bench/profile_run.py 300 /tmp/run.prof [SRC]
    .venv/bin/python -c "import pstats; pstats.Stats('/tmp/run.prof').print_stats(60)"
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from common import make_home, remove_home, start_server, stop_server
from shellyard.home import read_info
from shellyard.sdk.client import AsyncClient

SITECUSTOMIZE = """
import os, sys
if os.environ.get("SHELLYARD_BENCH_PROFILE") and "serve" in sys.argv:
    import cProfile, signal, time
    _profile = cProfile.Profile(time.thread_time)
    _armed = [False]
    def _toggle(*_args):
        if _armed[0]:
            _profile.disable()
            _profile.dump_stats(os.environ["SHELLYARD_BENCH_PROFILE"])
        else:
            _profile.enable()
        _armed[0] = not _armed[0]
    signal.signal(signal.SIGUSR2, _toggle)
"""


async def main(runs: int, out: Path, src: str) -> None:
    hook = Path(tempfile.mkdtemp(prefix="shellyard-profile-"))
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    home = make_home()
    env = {"PYTHONPATH": f"{hook}:{src}", "SHELLYARD_BENCH_PROFILE": str(out)}
    try:
        pid = start_server(home, env)
        info = read_info(home)
        assert info is not None
        client = AsyncClient(info.url, info.token)
        for _ in range(30):
            await client.run("true")
        os.kill(pid, signal.SIGUSR2)
        began = time.monotonic()
        for _ in range(runs):
            result = await client.run("true")
            if result.state != "completed":
                raise RuntimeError(f"run of true ended {result.state}")
        os.kill(pid, signal.SIGUSR2)
        print(f"{runs} runs, {(time.monotonic() - began) * 1000 / runs:.1f} ms wall a run")
        await asyncio.sleep(1)  # the dump
        await client.aclose()
    finally:
        stop_server(home)
        remove_home(home)
        (hook / "sitecustomize.py").unlink()
        hook.rmdir()


if __name__ == "__main__":
    asyncio.run(
        main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "src")
    )
