"""The local-source reader's copy of a workspace folder (``wheels.copy_tree``: a reader
process streaming every file through a pipe, each wait for bytes timed for the stall bound,
``managers/readers.py``) beside ``shutil.copytree`` of the same tree in the same run
(alternated, so the machine's load falls on both). The figure is the median of the pairwise
ratios reader / copytree; it says what the reader's process, pipe and watch cost over a plain
copy.

    .venv/bin/python bench/bench_reader_copy.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from shellyard.runner.environments.managers import wheels


def _tree(root: Path) -> None:
    """20 folders of 100 files: 90 of 16 KiB and 10 of 1 MiB each (~230 MiB)."""
    for folder in range(20):
        (root / f"d{folder}").mkdir(parents=True)
        for number in range(100):
            size = 1 << 20 if number % 10 == 0 else 16 << 10
            (root / f"d{folder}" / f"f{number}").write_bytes(os.urandom(size))


def _timed(copy: object, source: Path, into: Path) -> float:
    shutil.rmtree(into, ignore_errors=True)
    started = time.perf_counter()
    copy(source, into)  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sy-bench-reader-") as tmp:
        root = Path(tmp)
        _tree(root / "tree")
        reader: list[float] = []
        plain: list[float] = []
        for round_ in range(args.rounds):
            order = [(reader, wheels.copy_tree), (plain, shutil.copytree)]
            for times, copy in order if round_ % 2 == 0 else order[::-1]:
                times.append(_timed(copy, root / "tree", root / "out"))
        ratios = [r / p for r, p in zip(reader, plain, strict=True)]
        print(f"reader copy_tree  median {statistics.median(reader):.3f} s")
        print(f"shutil.copytree   median {statistics.median(plain):.3f} s")
        print(f"ratio reader / copytree, median of {args.rounds}: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
