"""What each mount of the runner's namespace costs a sandbox's start (R2, runner/own_mounts.py).

A root runner keeps two overlays mounted per workspace (the tree and its home) for its whole
life, and bwrap's ``--unshare-all`` copies the caller's whole mount table into each new
namespace before it pivots. This times a bare bwrap start with the namespace as it is (the
baseline) and with N extra overlays, in a private mount namespace of its own (``unshare -m``,
so the host's table is untouched). Root only.

    sudo python3 bench/bench_host_mounts.py 500 2000
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

BWRAP = [
    "bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--proc", "/proc",
    "--", "true",
]  # fmt: skip
RUNS = 30


def per_spawn_ms() -> float:
    start = time.perf_counter()
    for _ in range(RUNS):
        subprocess.run(BWRAP, check=True)
    return (time.perf_counter() - start) * 1000 / RUNS


def mounts() -> int:
    with open("/proc/self/mountinfo") as handle:
        return sum(1 for _ in handle)


def inside(counts: list[int]) -> None:
    base = tempfile.mkdtemp(prefix="shellyard-bench-mounts-")
    os.mkdir(f"{base}/empty")
    baseline = per_spawn_ms()
    print(f"{mounts():6d} mounts: {baseline:6.1f} ms per bwrap start (baseline)")
    made = 0
    for count in counts:
        while made < count:
            upper, work = f"{base}/u{made}", f"{base}/w{made}"
            os.mkdir(upper)
            os.mkdir(work)
            options = f"lowerdir={base}/empty,upperdir={upper},workdir={work},uuid=null"
            subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, upper], check=True)
            made += 1
        took = per_spawn_ms()
        print(f"{mounts():6d} mounts: {took:6.1f} ms per bwrap start ({took / baseline:.1f}x)")
    for index in range(made):
        subprocess.run(["umount", f"{base}/u{index}"], check=True)
    shutil.rmtree(base)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inside":
        inside([int(n) for n in sys.argv[2:]])
    else:
        counts = sys.argv[1:] or ["500", "2000"]
        here = os.path.abspath(__file__)
        cmd = ["unshare", "-m", "--propagation", "private", sys.executable, here, "--inside"]
        subprocess.run([*cmd, *counts], check=True)
