"""Local package files (wheels, sdists) copied into the environments' content-addressed store
before pip installs them (docs/environments.md).

A file named by ``find_links`` or ``name @ file://…`` may be in the caller's workspace, where
it can change or vanish right after the install. So it is read once, streamed into
``<store>/<sha256>`` (hashed on the way), and the install reads a copy of that in the change's
scratch folder: what uv installs is exactly the bytes whose sha256 the revision records, and
the store keeps them for as long as the runner keeps its environments.

The runner never opens a path the caller named as root (docs/environments.md, "Package tools
run as the sandbox uid"): a small reader process, dropped to the tools' uid by ``front``
(``launch.prefix``), walks the path one component at a time with ``O_NOFOLLOW`` and streams
the files' bytes to the runner through a pipe. A symbolic link anywhere on the way, or in a
``find_links`` folder, is refused: a link to the runner's token or a host key yields nothing,
and even a link the reader could follow runs into what the sandbox uid may read. The store
is 0700 and its files 0400 (root's): no other local user reads another session's packages.
A whole folder of the workspace (a local index, a project folder, a CRAN repository) is read
by the same reader into a copy of its own (``copy_tree``, ``FolderCopies``), not the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shellyard.contract.sources import WORKSPACE, in_workspace, is_local, local_path
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.readers import Pipe, Readers, Stalled, Stopped

#: The files of a find_links folder pip may use (what uv's flat index reads).
PACKAGE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz")

#: The most a copied folder (a local index, a project folder: ``copy_tree``) may hold.
TREE_ENTRIES = 100_000
TREE_BYTES = 2 << 30

#: Interpreters the reader may run with once dropped to the tools' uid.
READER_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")

#: The reader, run as the tools' uid with ``python -I -c``: argv[1] is ``file``, ``folder``
#: or ``tree``, argv[2] the path. It writes one JSON header line per file ({"name", "size",
#: "x"}: x, an execute bit set) followed by exactly ``size`` bytes, for a tree also one
#: ({"folder"}) per folder before what it holds, then {"end": true}; or {"error": …} and
#: stops.
_READER = r"""
import json, os, stat, sys
out = sys.stdout.buffer
def fail(text):
    out.write((json.dumps({"error": text}) + "\n").encode()); out.flush(); sys.exit(0)
def walk(path):
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        # folders on the way need only search rights (O_PATH): a 0711 home is crossed; the
        # last is opened O_NONBLOCK: a FIFO there would block the open for ever (send then
        # refuses what is not a regular file)
        way = os.O_RDONLY | os.O_NONBLOCK if last else os.O_PATH | os.O_DIRECTORY
        flags = way | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            nxt = os.open(part, flags, dir_fd=fd)
        except OSError as exc:
            fail(f"{'/' + '/'.join(parts[:i + 1])}: {exc.strerror}")
        os.close(fd)
        fd = nxt
    return fd
def send(name, fd):
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        fail(f"{name} is not a regular file")
    if st.st_size > 65536 and st.st_blocks * 512 < st.st_size // 2:
        # holes: a package file is compressed, never sparse; its zeros would be copied by
        # root at their apparent size, past the free-space reserve (docs/security.md)
        fail(f"{name} is a sparse file ({st.st_size} bytes, {st.st_blocks * 512} on disk)")
    head = {"name": name, "size": st.st_size, "x": bool(st.st_mode & 0o111)}
    out.write((json.dumps(head) + "\n").encode())
    left = st.st_size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            fail(f"{name} shrank while it was read")
        out.write(chunk)
        left -= len(chunk)
    os.close(fd)
def tree(root, entries, size):
    # every folder and file below ``root``, parents first; each folder is reopened from
    # ``root`` one component at a time without following a link, so a link swapped in on
    # the way is met, never followed
    folders = [""]
    while folders:
        rel = folders.pop()
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
        for part in rel.split("/") if rel else []:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        for name in sorted(os.listdir(fd)):
            sub = f"{rel}/{name}" if rel else name
            entries -= 1
            if entries < 0:
                fail(f"{path} holds more than {sys.argv[3]} files and folders{sys.argv[5]}")
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                out.write((json.dumps({"folder": sub}) + "\n").encode())
                folders.append(sub)
            elif stat.S_ISREG(st.st_mode):
                size -= st.st_size
                if size < 0:
                    fail(f"{path} holds more than {sys.argv[4]} bytes{sys.argv[5]}")
                # O_NONBLOCK: a FIFO swapped in since the stat would block the open for ever
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                send(sub, os.open(name, flags, dir_fd=fd))
            elif stat.S_ISLNK(st.st_mode):
                fail(f"{path}/{sub} is a symbolic link")
            else:
                fail(f"{path}/{sub} is neither a regular file nor a folder")
        os.close(fd)
kind, path = sys.argv[1], sys.argv[2]
fd = walk(path)
if kind == "file":
    send(os.path.basename(path), fd)
elif kind == "tree":
    tree(fd, int(sys.argv[3]), int(sys.argv[4]))
else:
    suffixes = tuple(sys.argv[3].split(","))
    for name in sorted(os.listdir(fd)):
        if not name.endswith(suffixes):
            continue
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            fail(f"{path}/{name} is a symbolic link")
        if stat.S_ISREG(st.st_mode):
            # O_NONBLOCK: a FIFO swapped in since the stat would block the open for ever
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            send(name, os.open(name, flags, dir_fd=fd))
out.write(b'{"end": true}\n'); out.flush()
"""


@dataclass(frozen=True)
class Stashed:
    name: str
    sha256: str
    copy: Path


def stash(
    source: Path,
    store: Path,
    into: Path,
    readers: Readers | None = None,
    budget: TreeBudget | None = None,
) -> tuple[Path, str]:
    """Copy the file ``source`` into ``store`` under its sha256 (once), and as ``into/<its
    name>`` (counted in ``budget``); returns that copy and the sha256."""
    files = _stash(["file", str(source)], store, into, readers, budget)
    if len(files) != 1:
        raise ManagerError("failed", f"reading {source} gave {len(files)} files, not one")
    return files[0].copy, files[0].sha256


def stash_folder(
    folder: Path,
    store: Path,
    into: Path,
    readers: Readers | None = None,
    suffixes: Sequence[str] = PACKAGE_SUFFIXES,
    budget: TreeBudget | None = None,
) -> dict[str, str]:
    """Every package file directly in ``folder`` (names ending in ``suffixes``), stashed
    into ``into`` (each copy counted in ``budget``: hard links of one file are one file of
    the workspace's quota but a copy each); returns {file name: sha256}. A symbolic link
    among them is refused, not followed."""
    into.mkdir(mode=0o755, parents=True, exist_ok=True)  # uv reads it even when empty
    files = _stash(["folder", str(folder), ",".join(suffixes)], store, into, readers, budget)
    return {f.name: f.sha256 for f in files}


def _stash(
    args: list[str],
    store: Path,
    into: Path,
    readers: Readers | None,
    budget: TreeBudget | None,
) -> list[Stashed]:
    left = budget if budget is not None else TreeBudget.fresh()
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    store.chmod(0o700)
    into.mkdir(mode=0o755, parents=True, exist_ok=True)
    out: list[Stashed] = []

    def take(header: dict[str, object], pipe: Pipe) -> None:
        name = os.path.basename(str(header["name"]))
        size = int(str(header["size"]))
        left.take(Path(args[1]), 1, size)
        out.append(_store_one(pipe, name, size, store, into))

    _read(args, readers or Readers(), take)
    return out


#: Bytes a change's local-source copies may write between two checks of the free-space
#: reserve (``TreeBudget.room``): the reserve (at least 2 GiB by default) is far larger.
ROOM_EVERY = 64 << 20


def _any_room(what: str) -> None:
    """No reserve to hold to (a copy made outside an environment change)."""


@dataclass
class TreeBudget:
    """What the copies of one change may still hold: ``TREE_ENTRIES`` entries and
    ``TREE_BYTES`` bytes for all of them, not per folder (nested folders named as sources are
    each copied whole, so a bound per folder let N names write N times the workspace's bytes
    as root); ``room`` raises when the volume is below the free-space reserve, checked before
    the first copy and then every ``ROOM_EVERY`` bytes (the copies are the runner's, written
    before any tool runs, so the tools' reserve watch does not see them)."""

    entries: int
    size: int
    room: Callable[[str], None] = _any_room
    _unchecked: int | None = None

    @classmethod
    def fresh(cls, room: Callable[[str], None] = _any_room) -> TreeBudget:
        return cls(TREE_ENTRIES, TREE_BYTES, room)

    def take(self, folder: Path, entries: int, size: int) -> None:
        """Count an entry of ``size`` bytes about to be written; ManagerError once the bound
        is passed (the runner's own count: a file may grow between the reader's stat and its
        read), LowOnSpace below the reserve."""
        self.entries -= entries
        self.size -= size
        if self.entries < 0 or self.size < 0:
            raise ManagerError(
                "invalid_spec",
                f"the local sources this change copies ({folder} among them) come to more "
                f"than {TREE_ENTRIES} files and folders or {TREE_BYTES} bytes in all, the "
                f"most one change copies; name fewer or smaller folders (a folder named "
                f"inside another one it names is copied twice, and so is each hard link)",
            )
        unchecked = (self._unchecked or 0) + size
        if self._unchecked is None or unchecked >= ROOM_EVERY:
            self.room("copying the change's local sources")
            unchecked = 0
        self._unchecked = unchecked


def copy_tree(
    folder: Path,
    into: Path,
    readers: Readers | None = None,
    budget: TreeBudget | None = None,
) -> int:
    """Copy every folder and file below ``folder`` (a local index, a project folder) to the
    new folder ``into``, read by a reader of ``readers`` (as the workspace's uid), no link
    followed (one is refused), within ``budget`` (shared by a change's copies; the runner
    writes the copy: past the free-space reserve's checks of the tools). Returns the files'
    count.
    The copy is root's and read-only for the tools: 0755 folders, 0644 files (0755 with an
    execute bit: a project's scripts)."""
    left = budget if budget is not None else TreeBudget.fresh()
    into.mkdir(mode=0o755)
    files = 0

    def take(header: dict[str, object], pipe: Pipe) -> None:
        nonlocal files
        name = str(header.get("folder", header.get("name", "")))
        parts = Path(name).parts
        if not parts or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ManagerError("failed", f"the reader named {name!r} in {folder}")
        if "folder" in header:
            left.take(folder, 1, 0)
            os.mkdir(into / name, 0o755)
            return
        size = int(str(header["size"]))
        left.take(folder, 1, size)
        mode = 0o755 if header.get("x") else 0o644
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(into / name, flags, mode)
        with os.fdopen(fd, "wb") as writer:
            _pipe_bytes(pipe, size, writer.write, name)
        os.chmod(into / name, mode)
        files += 1

    rest = f" (what is left of the {TREE_ENTRIES} entries and {TREE_BYTES} bytes one change copies)"
    bounds = [str(max(left.entries, 0)), str(max(left.size, 0)), rest]
    _read(["tree", str(folder), *bounds], readers or Readers(), take)
    return files


class FolderCopies:
    """The workspace's folders a change names as sources (pip's local index or project
    folder, a CRAN repository), each copied once into the scratch folder by ``copy_tree`` as
    the workspace's uid (``ctx.read_as``), following no link, and shown to the tool
    read-only where the request named it (``/workspace/…``, ``mounts``). bwrap, as the tools'
    uid, could not bind a folder of a workspace that is another uid's (0700); the tool sees
    no host path of the home (its cwd, mountinfo, what it records: ``direct_url.json``, a
    repository's URL); a file changed mid-change changes nothing (docs/security.md, "Attack
    pass (session 43)"). Folders outside the workspace (an operator's) are left to bind."""

    def __init__(self, ctx: ManagerContext, budget: TreeBudget | None = None) -> None:
        self._ctx = ctx
        self._copies: dict[Path, Path] = {}
        self._budget = budget if budget is not None else TreeBudget.fresh(ctx.room)
        #: where the tool sees a copy → the copy, parents first (bound in this order)
        self.mounts: dict[Path, Path] = {}

    @property
    def copied(self) -> set[Path]:
        """The runner paths of the folders copied (no longer to be bound)."""
        return set(self._copies)

    def shown(self, text: str) -> Path | None:
        """Where the tool sees the local source ``text`` (a checked runner path or
        ``file://`` URL of it) once copied; None when it names nothing of the workspace. A
        file (a ``find_links`` page of links, an index named by a file) is copied with its
        folder, which its relative links name, and shown in the copy: bound, its folder
        would be the workspace's live one, at the home's host path."""
        named = self._ctx.origins.get(text)
        if not is_local(text) or named is None or not is_local(named):
            return None
        folder = Path(local_path(text))
        seen = Path(os.path.normpath(local_path(named)))
        if not in_workspace(str(seen)) or not os.path.lexists(folder):
            return None
        if folder.is_dir():
            return self._copy(folder, seen)
        if seen == Path(WORKSPACE):
            return None  # the workspace itself is no file: the reader refuses it
        return self._copy(folder.parent, seen.parent) / folder.name

    def _copy(self, folder: Path, seen: Path) -> Path:
        if folder not in self._copies:
            copy = self._ctx.scratch / "sources" / str(len(self._copies))
            copy.parent.mkdir(mode=0o755, exist_ok=True)
            copy_tree(folder, copy, self._ctx.read_as, self._budget)
            self._copies[folder] = copy
        self.mounts[seen] = self._copies[folder]
        self.mounts = dict(sorted(self.mounts.items()))
        return seen


def _read(
    args: list[str], readers: Readers, take: Callable[[dict[str, object], Pipe], None]
) -> None:
    """Run the reader on ``args`` and hand each header (with the pipe at its bytes) to
    ``take``; ManagerError with what the reader said when it refused, or when it sent
    nothing for ``readers.stall_s`` (then killed) or the change was stopped."""
    argv = [*readers.front, _interpreter(bool(readers.front)), "-I", "-c", _READER, *args]
    error: str | None = None
    current = ""  # the file or folder being sent: a stall names it
    try:
        with readers.run(argv) as pipe:
            while True:
                line = pipe.readline()
                if not line.endswith(b"\n"):  # nothing, or a header cut by the reader's end
                    error = "the reader stopped early"
                    break
                header = json.loads(line)
                if "error" in header:
                    error = str(header["error"])
                    break
                if header.get("end"):
                    break
                current = str(header.get("name", header.get("folder", "")))
                take(header, pipe)
    except Stalled as exc:
        where = f" (while sending {current})" if current else ""
        raise ManagerError(
            "failed",
            f"local package source {args[1]} could not be read: its reader {exc}{where} and "
            f"was stopped; a file whose reads block (a device, a FUSE mount) cannot be a "
            f"package source: copy the files into your workspace",
        ) from None
    except Stopped as exc:
        raise ManagerError("failed", f"local package source {args[1]}: {exc}") from None
    if error is not None:
        detail = error if error != "the reader stopped early" else f"{error}: {pipe.stderr.strip()}"
        advice = (
            "name fewer or smaller folders (a folder named inside another one is copied twice)"
            if "holds more than" in detail
            else "local sources are read without following symbolic links: put the files "
            "themselves in your workspace"
        )
        raise ManagerError(
            "not_found" if "No such file" in detail else "invalid_spec",
            f"local package source {args[1]} could not be read as the sandbox user ({detail}); "
            f"{advice}",
        )


def _interpreter(dropped: bool) -> str:
    """A Python the tools' uid can run: the runner's own may live where only root reaches
    (a pyenv under /root); the system's is world-readable."""
    if dropped:
        for candidate in READER_PYTHONS:
            if os.access(candidate, os.X_OK):
                return candidate
    return sys.executable


def _store_one(pipe: Pipe, name: str, size: int, store: Path, into: Path) -> Stashed:
    digest = hashlib.sha256()
    temp = store / f".tmp-{os.getpid()}-{name}"
    with temp.open("wb") as writer:

        def write(chunk: bytes) -> None:
            digest.update(chunk)
            writer.write(chunk)

        try:
            _pipe_bytes(pipe, size, write, name)
        except ManagerError:
            temp.unlink()
            raise
    sha = digest.hexdigest()
    stored = store / sha
    if stored.exists():
        temp.unlink()
    else:
        os.chmod(temp, 0o400)
        os.replace(temp, stored)
    target = into / name
    # a copy the tool may read (the store stays root's alone), made read-only for it
    temp_copy = into / f".{name}.tmp"
    shutil.copyfile(stored, temp_copy)
    os.chmod(temp_copy, 0o444)
    os.replace(temp_copy, target)
    return Stashed(name, sha, target)


def _pipe_bytes(pipe: Pipe, size: int, write: Callable[[bytes], object], name: str) -> None:
    """Hand the next ``size`` bytes of the reader's pipe to ``write``."""
    left = size
    while left:
        chunk = pipe.read(min(left, 1 << 20))
        if not chunk:
            raise ManagerError("failed", f"{name}: the reader stopped in the middle")
        write(chunk)
        left -= len(chunk)
