"""What the launcher's libc costs each exec: the launcher (launch.c) built with musl's static
libc and with glibc's (static), each run N times as ``launcher --sched batch -- /bin/true``
(the program after ``--`` is the same for both), CPU of the children per exec from
``getrusage`` (docs/benchmarks.md §81). glibc's start-up reads the CPU's cache sizes with
cpuid, which a virtual machine's hypervisor answers by trapping.

    .venv/bin/python bench/libc_start_probe.py [N]
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCH_C = Path(__file__).resolve().parent.parent / "src/shellyard/runner/sandbox/launch.c"
BUILDS = {"musl": ["musl-gcc", "-O2", "-static"], "glibc": ["cc", "-O2", "-static"]}


def children_cpu_ms_per_exec(argv: list[str], count: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(count):
        subprocess.run(argv, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / count * 1e3


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory() as folder:
        built = {}
        for name, compiler in BUILDS.items():
            if shutil.which(compiler[0]) is None:
                print(f"{name}: no {compiler[0]} here")
                continue
            target = Path(folder) / f"launch-{name}"
            subprocess.run([*compiler, "-o", str(target), str(LAUNCH_C)], check=True)
            built[name] = [str(target), "--sched", "batch", "--", "/bin/true"]
        for round_ in range(2):  # alternated, the first round warms the page cache
            for name, argv in built.items():
                print(f"round {round_ + 1} {name}: {children_cpu_ms_per_exec(argv, count):.3f} ms")


if __name__ == "__main__":
    main()
