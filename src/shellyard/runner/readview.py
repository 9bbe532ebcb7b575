"""The committed view a read-only execution sees (W2; issue 17; docs/decisions.md).

A read-only execution runs beside the workspace's writer, so it must not see the writer's
half-written files: it gets the workspace's last committed snapshot, materialised into its
own execution folder and bound read-only at ``/workspace``. Files are hard links to the
snapshot store's objects (written once, mode 0444, never changed in place), so building the
view costs one ``link`` per file and no copied bytes; an executable file is copied instead,
because an object's inode is shared and carries no execute bit.

Views are shared (``ReadViews``): one per (workspace, snapshot content) under the runner's
``views/`` folder, named by the snapshot's root hash, so concurrent readers of the same head,
and later readers while it stays the head (a writer that changed nothing commits the same
root), reuse it instead of building one each. Each reader's execution folder holds a
symlink ``view`` to the one it uses (how a restarted runner re-counts its users, E11). A view
goes when its last reader ends and it is no longer the head's content.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

from shellyard.runner.snapshots.store import SnapshotStore

#: The folder of an execution's folder that holds its view.
VIEW = "view"


def materialise(
    store: SnapshotStore, workspace_id: str, destination: Path, seq: int | None = None
) -> int:
    """Build snapshot ``seq`` (the head when None) of ``workspace_id`` at ``destination``;
    returns its seq."""
    if seq is None:
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


class ReadViews:
    """The shared committed views of one runner (``directory``) and which readers use each."""

    def __init__(self, directory: Path, store: SnapshotStore) -> None:
        self.directory = directory
        self.store = store
        self._users: dict[Path, set[str]] = {}
        self._lock = threading.Lock()

    def startup(self) -> None:
        self.directory.mkdir(exist_ok=True)
        # bwrap, already the sandbox uid, must reach a view to bind it; nobody lists them.
        self.directory.chmod(0o711)

    def acquire(self, workspace_id: str, execution_id: str, link: Path) -> Path:
        """The view of the workspace's head for ``execution_id`` (built on first use), and
        ``link`` (in the execution's folder) pointing at it."""
        with self._lock:
            head = self.store.head(workspace_id)
            view = self.directory / f"{workspace_id}.{head.root_hash}"
            if not view.is_dir():
                for stale in self.directory.glob(f"{workspace_id}.*"):
                    if stale not in self._users:  # an older head's, kept after its readers
                        remove(stale)
                building = self.directory / f".{workspace_id}.{head.root_hash}.{execution_id}"
                materialise(self.store, workspace_id, building, head.seq)
                os.rename(building, view)
            self._users.setdefault(view, set()).add(execution_id)
            os.symlink(view, link)
            return view

    def adopt(self, link: Path, execution_id: str) -> Path | None:
        """A re-attached reader (E11): count it as a user of the view its link names."""
        try:
            view = Path(os.readlink(link))
        except OSError:
            return None  # a reader of an older runner: its view is its own folder
        with self._lock:
            self._users.setdefault(view, set()).add(execution_id)
        return view

    def release(self, link: Path, execution_id: str) -> None:
        """The reader ended: its view goes when unused and no longer the head's content."""
        try:
            view = Path(os.readlink(link))
        except OSError:
            remove(link)  # an older runner's per-execution view
            return
        link.unlink(missing_ok=True)
        with self._lock:
            users = self._users.get(view, set())
            users.discard(execution_id)
            if users:
                return
            self._users.pop(view, None)
            workspace_id, _, root_hash = view.name.partition(".")
            try:
                current = self.store.head(workspace_id).root_hash
            except Exception:  # the workspace is gone: so is its view
                current = None
            if current != root_hash:
                remove(view)

    def forget_unused(self) -> None:
        """After re-attaching: views no reader uses (and half-built ones) go; the next reader
        builds its head's view again."""
        with self._lock:
            for view in list(self.directory.iterdir()):
                if view not in self._users:
                    remove(view)
