"""Benchmark: backup's copy of a tree by descriptors (``backup._copy_tree`` over
``runner/tree_walk.py``) against the path-based copy it replaced (``shutil.copytree`` with
``copy2``, links kept: what the old ``_copy_tree`` did per entry), on the same tree in the
same run, alternating which goes first; the median wall time of each and their ratio.

    python bench/bench_backup_copy.py [--folders 50] [--files 100] [--big 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from shellyard.backup import _copy_tree, _Counter


def make_tree(root: Path, folders: int, files: int, big: int) -> None:
    for d in range(folders):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(files):
            (root / f"d{d}" / f"f{f}").write_bytes(os.urandom(4096))
    for f in range(big):
        (root / f"big{f}").write_bytes(os.urandom(1 << 20))


def by_descriptors(src: Path, dst: Path) -> None:
    _copy_tree(src, dst, _Counter())


def by_paths(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copy2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folders", type=int, default=50)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--big", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-backup-") as tmp:
        base = Path(tmp)
        make_tree(base / "src", args.folders, args.files, args.big)
        times: dict[str, list[float]] = {"paths": [], "descriptors": []}
        ways = [("paths", by_paths), ("descriptors", by_descriptors)]
        for i in range(args.rounds):
            for name, way in ways if i % 2 == 0 else ways[::-1]:
                dst = base / f"{name}{i}"
                start = time.perf_counter()
                way(base / "src", dst)
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(dst)
    paths, fds = statistics.median(times["paths"]), statistics.median(times["descriptors"])
    print(
        json.dumps(
            {
                "files": args.folders * args.files + args.big,
                "paths_median_s": round(paths, 3),
                "descriptors_median_s": round(fds, 3),
                "ratio_descriptors_to_paths": round(fds / paths, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
