"""Retention of execution folders on a runner (docs/operations.md): the control plane names
the executions (it knows which records, artifacts and notices still need them); this deletes
their logs and status files, only of finished executions."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from shellyard.runner import workspace_paths
from shellyard.runner.limits import logcap
from shellyard.runner.protocol import LogPruneResult


def prune_logs(
    root: Path,
    execution_ids: list[str],
    forget: bool,
    free_bytes: int | None = None,
    keep_bytes: int | None = None,
) -> LogPruneResult:
    """Delete finished executions' logs and status files (all of the folder when
    ``forget``), in order, until ``free_bytes`` are freed; with no ids, measure what every
    folder holds. ``keep_bytes``: cut each log to its head and tail instead (``_cut``)."""
    result = LogPruneResult()
    for execution_id in execution_ids:
        if free_bytes is not None and result.bytes_freed >= free_bytes:
            break
        directory = root / execution_id
        if directory.exists() and not (directory / "result.json").is_file():
            continue  # not finished here: never pruned
        if keep_bytes is not None:
            freed = _cut(directory, keep_bytes)
            if freed:
                result.bytes_freed += freed
                result.pruned.append(execution_id)
            continue
        if not directory.exists():
            result.pruned.append(execution_id)  # nothing held here (never ran, or gone)
            continue
        # Through the folder's descriptor (O_NOFOLLOW): an entry that is a link (a reader's
        # ``view``) is removed as a link, a folder as a tree, never through a link
        # (docs/security.md, "File trees never follow a link").
        with workspace_paths.open_root(root) as root_fd:
            try:
                fd = os.open(execution_id, workspace_paths.O_DIR, dir_fd=root_fd)
            except OSError:
                continue  # not a real folder: nothing of ours to prune
            try:
                for name in sorted(os.listdir(fd), key=lambda n: n == "result.json"):
                    if name == "result.json" and not forget:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        result.bytes_freed += _disk_bytes(os.lstat(name, dir_fd=fd))
                        workspace_paths.remove_at(fd, name)
            finally:
                os.close(fd)
            if forget:
                with contextlib.suppress(OSError):
                    os.rmdir(execution_id, dir_fd=root_fd)
        result.pruned.append(execution_id)
    if not execution_ids:
        held = 0
        with os.scandir(root) as folders:
            for folder in folders:
                with contextlib.suppress(OSError), os.scandir(folder.path) as files:
                    held += sum(_disk_bytes(f.stat(follow_symlinks=False)) for f in files)
        result.bytes_held = held
    return result


def _cut(directory: Path, keep_bytes: int) -> int:
    """Cut a finished execution's logs to head + tail (``keep_bytes`` each, the dropped
    range marked for readers, as the retained-log cap does while it runs); bytes freed."""
    freed = 0
    for stream in ("stdout", "stderr"):
        path = directory / stream
        try:
            before = path.stat()
            logcap.trim(path, keep_bytes, before.st_size, logcap.load_cut(path))
            freed += max(0, _disk_bytes(before) - _disk_bytes(path.stat()))
        except OSError:
            continue  # missing, or a file system that cannot punch holes: kept whole
    return freed


def _disk_bytes(info: os.stat_result) -> int:
    """What a file takes on disk (whole blocks): five small files of a finished execution
    take about 20 KiB, 20 times their byte length (measured)."""
    return int(info.st_blocks) * 512
