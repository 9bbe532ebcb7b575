"""The committed view a read-only execution sees (W2; issue 17; docs/decisions.md).

A read-only execution runs beside the workspace's writer, so it must not see the writer's
half-written files: it gets the workspace's last committed snapshot, materialised into its
own execution folder and bound read-only at ``/workspace``. Files are hard links to the
snapshot store's objects (written once, mode 0444, never changed in place), so building the
view costs one ``link`` per file and no copied bytes; an executable file is copied instead,
because an object's inode is shared and carries no execute bit. The view is removed when the
execution ends (``supervise.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shellyard.runner.snapshots.store import SnapshotStore

#: The folder of an execution's folder that holds its view.
VIEW = "view"


def materialise(store: SnapshotStore, workspace_id: str, destination: Path) -> int:
    """Build the head snapshot of ``workspace_id`` at ``destination``; returns its seq."""
    seq = store.head(workspace_id).seq
    destination.mkdir(mode=0o755)
    for path, entry in sorted(store.manifest(workspace_id, seq).items()):
        target = destination / path
        if entry.kind == "dir":
            target.mkdir(mode=0o755)
        elif entry.kind == "symlink":
            os.symlink(entry.target or "", target)
        elif entry.sha256 is None or entry.size == 0:
            target.touch(mode=0o555 if entry.mode & 0o111 else 0o444)
        else:
            source = store.blobs.object_path(entry.sha256)
            if entry.mode & 0o111:
                shutil.copyfile(source, target)
                target.chmod(0o555)
            else:
                os.link(source, target)
    return seq


def remove(destination: Path) -> None:
    """Drop a view (its links only: the objects stay in the store)."""
    if destination.exists():
        # The tree is made read-only for the sandbox by the bind, not by modes: rmtree works.
        shutil.rmtree(destination, ignore_errors=True)
