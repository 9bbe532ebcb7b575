"""CPU and wall time of one launch of a launcher build, ``LAUNCHER -- /bin/true``, spawned
and waited for ``--runs`` times, builds alternated (docs/benchmarks.md §79): what linking the
launcher statically saves each exec.

    gcc -O2 -o /tmp/l_dyn src/shellyard/runner/sandbox/launch.c
    gcc -O2 -static -o /tmp/l_static src/shellyard/runner/sandbox/launch.c
    python3 bench/launcher_probe.py /tmp/l_dyn /tmp/l_static
"""

from __future__ import annotations

import argparse
import os
import resource
import time


def launch_cost(binary: str, runs: int) -> tuple[float, float]:
    """(CPU ms, wall ms) of one launch, children's rusage."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for _ in range(runs):
        pid = os.posix_spawn(binary, [binary, "--", "/bin/true"], os.environ)
        os.waitpid(pid, 0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu / runs * 1e3, (time.perf_counter() - start) / runs * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("builds", nargs="+")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for binary in args.builds:
            cpu, wall = launch_cost(binary, args.runs)
            print(f"{binary}: {cpu:.3f} ms CPU, {wall:.3f} ms wall a launch")


if __name__ == "__main__":
    main()
