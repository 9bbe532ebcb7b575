"""Retention of execution folders on a runner (docs/operations.md): the control plane names
the executions (it knows which records, artifacts and notices still need them); this deletes
their logs and status files, only of finished executions."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from shellyard.runner.protocol import LogPruneResult


def prune_logs(
    root: Path, execution_ids: list[str], forget: bool, free_bytes: int | None = None
) -> LogPruneResult:
    """Delete finished executions' logs and status files (all of the folder when
    ``forget``), in order, until ``free_bytes`` are freed; with no ids, measure what every
    folder holds."""
    result = LogPruneResult()
    for execution_id in execution_ids:
        if free_bytes is not None and result.bytes_freed >= free_bytes:
            break
        directory = root / execution_id
        if directory.exists() and not (directory / "result.json").is_file():
            continue  # not finished here: never pruned
        if not directory.exists():
            result.pruned.append(execution_id)  # nothing held here (never ran, or gone)
            continue
        for entry in sorted(directory.iterdir(), key=lambda e: e.name == "result.json"):
            if entry.name == "result.json" and not forget:
                continue
            with contextlib.suppress(FileNotFoundError):
                result.bytes_freed += _disk_bytes(entry.lstat())
                entry.unlink()
        if forget:
            with contextlib.suppress(OSError):
                directory.rmdir()
        result.pruned.append(execution_id)
    if not execution_ids:
        held = 0
        with os.scandir(root) as folders:
            for folder in folders:
                with contextlib.suppress(OSError), os.scandir(folder.path) as files:
                    held += sum(_disk_bytes(f.stat(follow_symlinks=False)) for f in files)
        result.bytes_held = held
    return result


def _disk_bytes(info: os.stat_result) -> int:
    """What a file takes on disk (whole blocks): five small files of a finished execution
    take about 20 KiB, 20 times their byte length (measured)."""
    return int(info.st_blocks) * 512
