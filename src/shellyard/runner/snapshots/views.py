"""The committed view a read-only execution sees (W2; docs/decisions.md).

A read-only execution runs beside the workspace's writer, so it must not see the writer's
half-written files: it gets the workspace's last committed snapshot, materialised into its
own execution folder and bound read-only at ``/workspace``. Files are the view's own copies
of the snapshot store's objects (``copy_file_range``: a reflink where the filesystem shares
blocks), not hard links: an inode shared with the store would be shared with every other
workspace's view of the same content, and its link count would tell a reader that another
session holds a file it guessed (docs/security.md, "Read views"). Everything is made and
removed through folder descriptors opened with ``O_NOFOLLOW`` (runner/workspace_paths.py),
never a path string.

Views are shared (``ReadViews``): one per (workspace, snapshot content) under the runner's
``views/`` folder, named ``WORKSPACE.ROOT_HASH.SEQ``, so concurrent readers of the same head,
and later readers while it stays the head (a writer that changed nothing commits the same
root), reuse it instead of building one each. Each reader's execution folder holds a
symlink ``view`` to the one it uses (how a restarted runner re-counts its users, E11). A view
goes when its last reader ends and it is neither the head's content nor the workspace's only
view; one kept unused is patched into the next head's view (only the paths that differ are
unlinked or placed), so a workspace keeps at most one unused view.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from shellyard import filemodes
from shellyard.runner import workspace_paths
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.protocol import PathEntry, SnapshotInfo
from shellyard.runner.snapshots import history
from shellyard.runner.snapshots.store import SnapshotStore

log = logging.getLogger(__name__)

_O_OBJECT = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC

#: The folder of an execution's folder that holds its view.
VIEW = "view"


def materialise(
    store: SnapshotStore, workspace_id: str, destination: Path, seq: int | None = None
) -> int:
    """Build snapshot ``seq`` (the head when None) of ``workspace_id`` at ``destination``;
    returns its seq. Every entry is made relative to its folder's descriptor, reached from
    the view's root with ``O_NOFOLLOW`` (workspace_paths.Folders): a link the view holds is never
    followed, whatever it names (docs/security.md, "File trees never follow a link")."""
    if seq is None:
        seq = store.head(workspace_id).seq
    destination.mkdir(mode=0o755)
    with workspace_paths.open_root(destination) as root, workspace_paths.Folders(root) as folders:
        # One folder's tree at a time (a folder's entry comes before what it holds): memory
        # stays that of the widest folder, however many files the snapshot has.
        for entry in store.view(workspace_id, seq).entries():
            parent, _, name = entry.path.rpartition("/")
            _place(store, folders.folder(parent), name, entry)
    return seq


def patch(store: SnapshotStore, workspace_id: str, view: Path, old_seq: int, seq: int) -> None:
    """Turn the view of snapshot ``old_seq`` at ``view`` into one of ``seq``: only what
    differs is unlinked or placed (a commit usually changes a few files of many). The two
    snapshots are walked together in path order and a folder whose tree is the same in both
    is not entered, so the cost is that of the change, not of the snapshot.

    A folder that went is removed whole, through descriptors, before its replacement is
    placed, and what it held (the walk visits it next) is skipped: the walk never works
    below a path it replaced. Every step is relative to a folder descriptor opened with
    ``O_NOFOLLOW`` from the view's root, so a symbolic link of the new snapshot (placed
    where a folder was) is never followed: a folder walk that meets one fails and the view
    is built again (``ReadViews._build``)."""
    old = history.manifest(store, workspace_id, old_seq)
    new = history.manifest(store, workspace_id, seq)
    removed: set[str] = set()  # folders removed whole: what they held went with them
    with workspace_paths.open_root(view) as root, workspace_paths.Folders(root) as folders:
        for path, x, y in history.pairs(old, new, ""):
            before = x[0].entry(x[1], path) if x is not None else None
            after = y[0].entry(y[1], path) if y is not None else None
            if before is not None and after is not None and _same(before, after):
                continue
            if before is not None and after is not None and before.kind == after.kind == "dir":
                continue  # a folder in both: only what it holds may differ (visited next)
            parent, _, name = path.rpartition("/")
            if _below(path, removed):
                if after is None:
                    continue  # gone with its folder, whatever now stands at its path
                before = None
            fd = folders.folder(parent)
            if before is not None:
                if before.kind == "dir":  # a folder that went, or became a file or a link
                    folders.forget(path)
                    workspace_paths.remove_at(fd, name)
                    removed.add(path)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
            if after is not None:
                _place(store, fd, name, after)


def _below(path: str, folders: set[str]) -> bool:
    """Whether ``path`` lies below one of ``folders``."""
    parent = path.rpartition("/")[0]
    while parent:
        if parent in folders:
            return True
        parent = parent.rpartition("/")[0]
    return False


def _same(a: PathEntry, b: PathEntry) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == "dir":
        return True
    return (a.content_id, a.size, a.target, a.mode & 0o111) == (
        b.content_id,
        b.size,
        b.target,
        b.mode & 0o111,
    )


def _place(store: SnapshotStore, dir_fd: int, name: str, entry: PathEntry) -> None:
    """Make ``entry`` as ``name`` in the folder ``dir_fd`` (never through a link: the new
    entry is created with ``O_EXCL|O_NOFOLLOW``). A file is this view's own copy of the
    object, never a hard link to it: a shared inode's link count would tell a reader how
    many other workspaces' views hold the same content (docs/security.md, "Read views")."""
    if entry.kind == "dir":
        os.mkdir(name, 0o755, dir_fd=dir_fd)
        return
    if entry.kind == "symlink":
        os.symlink(entry.target or "", name, dir_fd=dir_fd)
        return
    mode = 0o555 if entry.mode & 0o111 else 0o444
    out = os.open(name, workspace_paths.O_NEW, mode, dir_fd=dir_fd)
    try:
        if entry.content_id is not None and entry.size:
            source = os.open(store.blobs.object_path(entry.content_id), _O_OBJECT)
            try:
                workspace_paths.copy_fd(source, out, entry.size)
            finally:
                os.close(source)
        os.fchmod(out, mode)
    finally:
        os.close(out)


def _name(view: Path) -> tuple[str, str, int]:
    """(workspace, root hash, seq) of a view's folder name ``WORKSPACE.ROOT.SEQ``."""
    workspace_id, _, rest = view.name.partition(".")
    root_hash, _, seq = rest.partition(".")
    return workspace_id, root_hash, int(seq) if seq.isdigit() else -1


def remove(destination: Path) -> None:
    """Drop a view (its own copies: the objects stay in the store), through descriptors
    (workspace_paths.remove_at): a link in the view is removed, never followed. The tree is made
    read-only for the sandbox by the bind, not by modes, so the runner may remove it."""
    try:
        with workspace_paths.open_root(destination.parent) as fd:
            workspace_paths.remove_at(fd, destination.name)
    except OSError:  # as rmtree(ignore_errors=True) did: a leftover is swept at startup
        log.warning("could not remove the view %s", destination, exc_info=True)


class ReadViews:
    """The shared committed views of one runner (``directory``) and which readers use each."""

    def __init__(self, directory: Path, store: SnapshotStore, mounts: OwnMounts) -> None:
        self.directory = directory
        self.store = store
        #: R2: each view a read-only overlay of its own (own_mounts.py: no host path in the
        #: sandbox's mountinfo); unmounted before it is renamed or removed
        self._mounts = mounts
        self._users: dict[Path, set[str]] = {}
        #: R2: views whose last reader ended, each with the mark its unmount timer checks
        self._released: dict[Path, object] = {}
        self._lock = threading.Lock()
        #: Views taken out of use under the lock, removed after it
        self._pending: list[Path] = []

    def startup(self) -> None:
        # bwrap, already the sandbox uid, must reach a view to bind it: the runner adds that
        # uid's search entry (sandbox/folder_access.py); nobody else passes, nobody lists them.
        filemodes.private_dir(self.directory)

    def acquire(self, workspace_id: str, execution_id: str, link: Path) -> Path:
        """The view of the workspace's head for ``execution_id`` (built on first use), and
        ``link`` (in the execution's folder) pointing at it."""
        with self._lock:
            head = self.store.head(workspace_id)
            views = sorted(self.directory.glob(f"{workspace_id}.*"))
            found = [v for v in views if _name(v)[1] == head.root_hash]
            view = found[0] if found else self._build(workspace_id, head, views, execution_id)
            self._mounts.mount(view, read_only=True)
            self._released.pop(view, None)  # in use again: no pending unmount
            self._users.setdefault(view, set()).add(execution_id)
            os.symlink(view, link)
            pending, self._pending = self._pending, []
        for trash in pending:
            remove(trash)
        return view

    def _build(
        self, workspace_id: str, head: SnapshotInfo, views: list[Path], execution_id: str
    ) -> Path:
        """The head's view: an unused older one patched when there is one, else built."""
        view = self.directory / f"{workspace_id}.{head.root_hash}.{head.seq}"
        building = self.directory / f".{workspace_id}.{execution_id}"
        stale = [v for v in views if v not in self._users]  # older heads', kept after use
        for extra in stale[1:]:
            self._pending.append(self._trash(extra, execution_id))
        built = False
        if stale:
            self._mounts.unmount(stale[0])
            os.rename(stale[0], building)
            try:
                patch(self.store, workspace_id, building, _name(stale[0])[2], head.seq)
                built = True
            except Exception:  # its snapshot was pruned, or the view was damaged: rebuild
                log.warning("rebuilding the view of %s", workspace_id, exc_info=True)
                remove(building)
        if not built:
            materialise(self.store, workspace_id, building, head.seq)
        os.rename(building, view)
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
        """The reader ended. Its view stays while it is the head's content or the only view
        of the workspace (the base the next head's view is patched from), unmounted when
        no reader is left; otherwise it goes."""
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
            workspace_id, root_hash, _seq = _name(view)
            others = [v for v in self.directory.glob(f"{workspace_id}.*") if v != view]
            try:
                current = self.store.head(workspace_id).root_hash
            except Exception:  # the workspace is gone: so is its view
                current, others = None, [view]
            if current == root_hash or not others:
                # R2: kept, but plain until its next reader mounts it again (acquire): an
                # overlay kept for the runner's life per workspace ever read was copied by
                # bwrap into every sandbox start (the cost own_mounts.py holds avoid). An
                # unmount takes 8-20 ms: off the reader's finish, after the holds' linger,
                # so readers in a row reuse one overlay
                if self._mounts.enabled:  # else a plain folder: nothing to unmount
                    self._released[view] = stamp = object()
                    timer = threading.Timer(
                        self._mounts.linger_s, self._unmount_unused, args=(view, stamp)
                    )
                    timer.daemon = True
                    timer.start()
                return
            trash = self._trash(view, execution_id)
        remove(trash)  # outside the lock: a big view takes a while, readers need not wait

    def _unmount_unused(self, view: Path, stamp: object) -> None:
        """Unmount ``view`` unless a reader took it since its release of ``stamp`` (acquire
        mounts and counts it under the same lock, so no reader's bwrap binds it half
        unmounted)."""
        with self._lock:
            if self._released.get(view) is not stamp:
                return
            del self._released[view]
            if view not in self._users and view.is_dir():
                try:
                    self._mounts.unmount(view)
                except OSError:  # a thread has no caller to tell; the restart cleans up
                    log.exception("could not unmount the view %s", view)

    def _trash(self, view: Path, tag: str) -> Path:
        """Take ``view`` out of use at once (a rename); the caller removes it."""
        trash = self.directory / f".trash.{view.name}.{tag}"
        self._mounts.unmount(view)
        os.rename(view, trash)
        return trash

    def unmount_unused(self) -> None:
        """At the runner's stop: a view no reader uses is a plain folder again (the next
        start mounts it when a reader takes it); those in use stay with their readers."""
        with self._lock:
            for view in self.directory.iterdir() if self.directory.is_dir() else ():
                if view not in self._users:
                    self._mounts.unmount(view)

    def _drop(self, view: Path) -> None:
        self._mounts.unmount(view)
        remove(view)

    def forget_unused(self) -> None:
        """After re-attaching: half-built views and trash go, and of the views no reader
        uses each workspace keeps its newest (the base the next head's view is patched
        from: a view's files are copies, so building one whole costs its bytes)."""
        with self._lock:
            kept: dict[str, Path] = {}
            for view in sorted(self.directory.iterdir(), key=lambda v: _name(v)[2]):
                if view in self._users:
                    continue
                workspace_id = _name(view)[0]
                if view.name.startswith(".") or view.is_symlink() or not view.is_dir():
                    self._drop(view)
                    continue
                try:
                    self.store.head(workspace_id)
                except Exception:  # the workspace is gone: so is its view
                    self._drop(view)
                    continue
                older = kept.get(workspace_id)
                kept[workspace_id] = view
                if older is not None:
                    self._drop(older)
            for view in kept.values():  # R2: a killed runner's overlay of a view nobody reads
                self._mounts.unmount(view)
