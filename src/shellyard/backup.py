"""``shellyard backup DEST`` and ``shellyard restore SRC`` (docs/operations.md).

A backup is a folder: the database (an SQLite online-backup copy, or a ``pg_dump`` custom
archive), the local runner's folder (snapshot manifests first, then the objects, execution
folders, live workspace trees, environments) and ``backup.json``. It is taken while the home
serves and restores to a state where every record the database copy holds has what it names:

- the database is copied first, in one consistent read (SQLite's backup API in one step; for
  PostgreSQL ``pg_dump`` from a snapshot exported by a transaction that also lists the
  executions), so everything a finished record names already exists when the files are copied;
- a retention pass cannot delete anything meanwhile (``maintenance.lock``), nor a garbage
  collection any object (the snapshot store's ``gc.lock``, held shared);
- an execution the copy shows unfinished gets a ``result.json`` saying it was running when the
  backup was taken (so the restored control plane records it ``unknown`` instead of
  re-attaching to a process of the original home); one the copy does not know is left out.

Remote runners keep their folders on their own hosts: back those up there (docs/operations.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import sqlite3
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from pydantic import BaseModel

from shellyard import __version__, filemodes
from shellyard.config import Settings
from shellyard.control.retention import maintenance_lock
from shellyard.errors import Conflict, InvalidInput, ShellyardError
from shellyard.home import is_served
from shellyard.runner.protocol import RunnerExecState, RunnerExecution
from shellyard.runner.snapshots.objects import StoreLock
from shellyard.runner.tree_walk import CHANGED, Step, Walked, copy_meta, walk_at
from shellyard.runner.workspace_paths import (
    O_DIR,
    O_FILE,
    O_NEW,
    Folders,
    copy_fd,
    open_root,
    remove_at,
)
from shellyard.store.executions import TERMINAL_STATES

MANIFEST = "backup.json"
SQLITE_NAME = "shellyard.db"
PG_NAME = "database.pgdump"
RUNNER_DIR = Path("runners") / "local"
#: Copy order inside the runner folder (manifests before the objects they name), with the
#: names never copied there: locks, temp files, scratch space, and the caches rebuilt by the
#: first commit (a stat cache is only valid for the inodes it was made from). Live workspace
#: trees are copied whole: any name may be an agent's file.
ORDER: tuple[tuple[str, frozenset[str]], ...] = (
    ("snapshots/workspaces", frozenset({"lock", "statcache", "statcache.log", "clock"})),
    ("snapshots/objects", frozenset({"tmp"})),
    ("executions", frozenset()),
    ("workspaces", frozenset()),
    ("environments", frozenset({"staging"})),
)
LOST_ERROR = "the execution was running when the backup was taken; its outcome is not in it"
#: Files the runner folder shares by hard link with a base environment's prefix (an environment
#: made ``--from python-base``; docs/environments.md): not copied, one JSON line each
#: (``path`` in the runner folder, ``source`` in the base, ``size``), linked again on restore.
BASE_LINKS = "base-links.jsonl"


class BackupReport(BaseModel):
    destination: str
    database: str
    executions: int
    unfinished: int
    files: int
    bytes: int
    duration_s: float
    #: Files that were hard links of a file already copied: linked again, not copied.
    linked: int = 0
    #: Files shared with a base environment, named in base-links.jsonl instead of copied.
    base_files: int = 0


class RestoreReport(BaseModel):
    home: str
    database: str
    files: int
    bytes: int
    linked: int = 0


class _Counter:
    """What a copy wrote, and the hard links it keeps: the first copy of each inode with more
    than one link, so the others become links of it (an environment made from a base, files an
    agent linked); ``bases``: a folder whose files are named in ``refs``, not copied."""

    def __init__(self, tree: Path | None = None, bases: Path | None = None) -> None:
        self.files = 0
        self.bytes = 0
        self.linked = 0
        self.base_files = 0
        self.first: dict[tuple[int, int], Path] = {}
        self.tree = tree
        self.bases = bases
        self._base_index: dict[tuple[int, int], Path] | None = None
        self.refs: IO[str] | None = None
        #: The runner folder copied from (set by a backup): where environments are found.
        self.source: Path | None = None
        self._env_bases: dict[str, Path | None] = {}

    def base_file(self, key: tuple[int, int]) -> Path | None:
        """The base file that is this inode, if any (the bases indexed once, linked files only)."""
        if self.bases is None or self.refs is None:
            return None
        if self._base_index is None:
            self._base_index = {}
            for folder, _dirs, names in _walk_prefixes(self.bases):
                for name in names:
                    with contextlib.suppress(OSError):
                        info = os.lstat(os.path.join(folder, name))
                        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                            self._base_index[(info.st_dev, info.st_ino)] = Path(folder, name)
        return self._base_index.get(key)

    def copy_file(
        self, src_fd: int, dir_fd: int, name: str, destination: Path, info: os.stat_result
    ) -> None:
        """Copy one regular file (open as ``src_fd``, ``fstat`` ``info``) as ``name`` below
        ``dir_fd`` (``destination`` is that path), or link it to its first copy, or name its
        base file in ``refs`` instead."""
        self.files += 1
        key = (info.st_dev, info.st_ino)
        if info.st_nlink > 1:
            first = self.first.get(key)
            if first is not None:
                os.link(first, name, dst_dir_fd=dir_fd, follow_symlinks=False)
                self.linked += 1
                return
            base = self.base_file(key)
            if base is not None and self.refs is not None and self.tree is not None:
                line = {"path": str(destination.relative_to(self.tree)), "source": str(base)}
                self.refs.write(json.dumps({**line, "size": info.st_size}) + "\n")
                self.base_files += 1
                return
            self.first[key] = destination
        twin = self.base_twin(src_fd, destination, info) if info.st_nlink == 1 else None
        if twin is not None and self.refs is not None and self.tree is not None:
            line = {"path": str(destination.relative_to(self.tree)), "source": str(twin)}
            self.refs.write(json.dumps({**line, "size": info.st_size}) + "\n")
            self.base_files += 1
            return
        dst = os.open(name, O_NEW, 0o600, dir_fd=dir_fd)
        try:
            # the snapshot objects' holes stay holes (copy_fd), unlike copy2's
            self.bytes += copy_fd(src_fd, dst, info.st_size)
            copy_meta(src_fd, dst, info)
        finally:
            os.close(dst)

    def base_twin(self, src_fd: int, destination: Path, info: os.stat_result) -> Path | None:
        """The file of the base an environment was made from that the file open as ``src_fd``
        (copied to ``destination``, a file of that environment's prefix) is a copy of: the same
        place in the prefix, size, mtime and bytes (docs/operations.md: environments may copy
        their base's files, sharing no inode)."""
        if self.bases is None or self.source is None or self.tree is None:
            return None
        if not destination.is_relative_to(self.tree):
            return None
        parts = destination.relative_to(self.tree).parts
        if len(parts) < 4 or parts[0] != "environments" or parts[2] != "prefix":
            return None
        if parts[1] not in self._env_bases:
            self._env_bases[parts[1]] = _base_prefix(self.source / parts[0] / parts[1], self.bases)
        base = self._env_bases[parts[1]]
        if base is None:
            return None
        twin = base.joinpath(*parts[3:])
        try:
            st = os.lstat(twin)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or (st.st_size, st.st_mtime_ns) != (
            info.st_size,
            info.st_mtime_ns,
        ):
            return None
        return twin if _same_bytes(src_fd, twin) else None


# ---------------------------------------------------------------------- backup


def backup(settings: Settings, destination: Path, *, full: bool = False) -> BackupReport:
    """Copy ``settings.home`` (served or not) into the new folder ``destination``. Hard links
    stay links; files shared with a base environment are named, not copied, unless ``full``
    (docs/operations.md "Backups")."""
    started = time.monotonic()
    home = settings.home
    if not (home / SQLITE_NAME).exists() and settings.database_url is None:
        raise InvalidInput(f"{home} holds no shellyard database; check --home")
    destination = destination.absolute()
    if destination.exists() and any(destination.iterdir()):
        raise InvalidInput(f"{destination} is not empty; give a new folder for the backup")
    if destination.is_relative_to(home):
        raise InvalidInput(f"{destination} is inside the home {home}; put the backup elsewhere")
    destination.mkdir(mode=0o700, parents=True, exist_ok=True)
    counter = _Counter(destination / RUNNER_DIR, None if full else _bases_folder())
    counter.source = settings.local_runner_root
    with maintenance_lock(home, wait=True), open(destination / BASE_LINKS, "w") as refs:
        counter.refs = refs
        if settings.database_url is None:
            kind = "sqlite"
            states = _sqlite_backup(home / SQLITE_NAME, destination / SQLITE_NAME)
        else:
            kind = "postgresql"
            states = _pg_backup(settings, destination / PG_NAME)
        root = settings.local_runner_root
        if root.exists():
            snapshots = root / "snapshots"
            snapshots.mkdir(exist_ok=True)
            # Shared like a commit: a garbage collection (exclusive) waits until the copy ends.
            with StoreLock(snapshots).hold():
                _copy_runner(root, destination / RUNNER_DIR, states, counter)
        token = home / "admin.token"
        if token.exists():
            shutil.copy2(token, destination / "admin.token")
    unfinished = sum(1 for state in states.values() if state not in TERMINAL_STATES)
    manifest = {
        "format": 1,
        "shellyard_version": __version__,
        "created_at": time.time(),
        "database": kind,
        "database_schema": settings.database_schema,
        "executions": len(states),
        "unfinished": unfinished,
    }
    (destination / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return BackupReport(
        destination=str(destination),
        database=kind,
        executions=len(states),
        unfinished=unfinished,
        files=counter.files,
        bytes=counter.bytes,
        duration_s=round(time.monotonic() - started, 3),
        linked=counter.linked,
        base_files=counter.base_files,
    )


def _sqlite_backup(source: Path, target: Path) -> dict[str, str]:
    """SQLite's online backup in one step (a consistent read; writers go on meanwhile in
    WAL mode), then the executions' states as the copy has them."""
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    filemodes.create_private(target)  # 0600, like the home's own (filemodes.py)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # pages=-1: all pages at once, from one read transaction
        dst.commit()
        return dict(dst.execute("SELECT id, state FROM executions").fetchall())
    finally:
        dst.close()
        src.close()


def _pg_backup(settings: Settings, target: Path) -> dict[str, str]:
    """``pg_dump`` from a snapshot exported by the transaction that lists the executions, so
    both see the same database."""
    import psycopg

    url = settings.effective_database_url.replace("postgresql+psycopg://", "postgresql://")
    if shutil.which("pg_dump") is None:
        raise ShellyardError("pg_dump is not installed; install the PostgreSQL client tools")
    with psycopg.connect(url, autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None
        schema = settings.database_schema
        table = f'"{schema}".executions' if schema else "executions"
        states = {str(i): str(s) for i, s in conn.execute(f"SELECT id, state FROM {table}")}
        argv = ["pg_dump", "--format=custom", f"--snapshot={row[0]}", f"--file={target}"]
        if schema:
            argv.append(f"--schema={schema}")
        done = subprocess.run([*argv, url], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ShellyardError(f"pg_dump failed: {done.stderr.strip()[:2000]}")
    return states


def _copy_runner(root: Path, target: Path, states: dict[str, str], counter: _Counter) -> None:
    target.mkdir(parents=True, exist_ok=True)
    _copy_meta(root, target)
    for part, skipped in ORDER:
        source = root / part
        if not source.exists():
            continue
        (target / part).parent.mkdir(parents=True, exist_ok=True)
        if part != "executions":
            _copy_tree(source, target / part, counter, skipped)
            continue
        (target / part).mkdir(exist_ok=True)
        _copy_meta(source, target / part)
        for entry in os.scandir(source):
            state = states.get(entry.name)
            if state is None or not entry.is_dir(follow_symlinks=False):
                continue  # started after the database copy: not in this backup
            _copy_tree(Path(entry.path), target / part / entry.name, counter)
            if state not in TERMINAL_STATES:
                _write_lost(target / part / entry.name, entry.name)


def _write_lost(directory: Path, execution_id: str) -> None:
    # in the backup's copy, where links were copied as links: none is followed here
    workspace_id = ""
    with (
        contextlib.suppress(OSError, ValueError, KeyError),
        open(os.open(directory / "meta.json", O_FILE), "rb") as meta,
    ):
        workspace_id = str(json.loads(meta.read(1 << 20))["workspace_id"])
    result = RunnerExecution(
        execution_id=execution_id,
        workspace_id=workspace_id,
        state=RunnerExecState.lost,
        finished_at=time.time(),
        error=LOST_ERROR,
    )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / "result.json")  # a link, if anything (unfinished: no result)
    with open(os.open(directory / "result.json", O_NEW, 0o644), "w") as out:
        out.write(result.model_dump_json())


# ---------------------------------------------------------------------- restore


def restore(settings: Settings, source: Path) -> RestoreReport:
    """Restore a backup folder into ``settings.home``, which must be empty and not served
    (and, for PostgreSQL, its database or schema empty)."""
    source = source.absolute()
    try:
        manifest = json.loads((source / MANIFEST).read_text())
    except (OSError, ValueError):
        raise InvalidInput(f"{source} is not a shellyard backup (no readable {MANIFEST})") from None
    home = settings.home
    if home.exists() and is_served(home):
        raise Conflict(f"{home} is being served; stop it and restore into an empty home")
    _check_bases(source / BASE_LINKS)
    if home.exists() and any(p.name != "maintenance.lock" for p in home.iterdir()):
        raise InvalidInput(f"{home} is not empty; restore into a new, empty home")
    filemodes.private_dir(home)
    counter = _Counter()
    kind = str(manifest.get("database"))
    if kind == "sqlite":
        if settings.database_url is not None:
            raise InvalidInput("this backup holds an SQLite database; restore without a URL")
        shutil.copy2(source / SQLITE_NAME, home / SQLITE_NAME)
    elif kind == "postgresql":
        if settings.database_url is None:
            raise InvalidInput("this backup holds a PostgreSQL dump; give --database-url")
        url = settings.effective_database_url.replace("postgresql+psycopg://", "postgresql://")
        done = subprocess.run(
            ["pg_restore", "--no-owner", f"--dbname={url}", str(source / PG_NAME)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ShellyardError(f"pg_restore failed: {done.stderr.strip()[:2000]}")
    else:
        raise InvalidInput(f"unknown database kind {kind!r} in {source / MANIFEST}")
    if (source / RUNNER_DIR).exists():
        _copy_tree(source / RUNNER_DIR, settings.local_runner_root, counter)
        _share_bases(source / BASE_LINKS, settings, counter)
    if (source / "admin.token").exists():
        shutil.copy2(source / "admin.token", home / "admin.token")
    # The same modes as a served home's, even from a backup an older release made: the
    # service user's alone (docs/security.md "The home's files").
    root = settings.local_runner_root
    filemodes.secure_home(home)
    if root.is_dir():
        filemodes.tighten_once(root, filemodes.runner_spare(root))
    return RestoreReport(
        home=str(home), database=kind, files=counter.files, bytes=counter.bytes,
        linked=counter.linked,
    )  # fmt: skip


def _walk_prefixes(bases: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """The folders of every complete base revision's prefix (``<name>/<revision>/prefix`` with
    its ``<revision>.json``; never uv's cache, which may be pruned)."""
    for record in sorted(bases.glob("*/*.json")):
        prefix = record.with_suffix("") / "prefix"
        if prefix.is_dir():
            yield from os.walk(prefix)


def _base_prefix(env_dir: Path, bases: Path) -> Path | None:
    """The prefix of the base revision the environment in ``env_dir`` was made from (its
    ``env.json``'s base record, ``<prefix> (copies)`` or ``(hard links)``), if below ``bases``."""
    try:
        meta = json.loads((env_dir / "env.json").read_text())
    except (OSError, ValueError):
        return None
    for record in meta.get("base") or []:
        source = str(record.get("source", "")) if isinstance(record, dict) else ""
        if record.get("manager") == "base" and " (" in source:
            prefix = Path(source.rsplit(" (", 1)[0])
            if prefix.is_absolute() and prefix.is_relative_to(bases) and ".." not in prefix.parts:
                return prefix
    return None


def _same_bytes(fd: int, other: Path, chunk: int = 1 << 20) -> bool:
    """Whether the open file ``fd`` and ``other`` hold the same bytes (read in bounded chunks
    at offsets, ``fd`` read where the walk opened it; no link followed to ``other``)."""
    try:
        two = os.open(other, O_FILE)
    except OSError:
        return False
    try:
        offset = 0
        while True:
            x, y = os.pread(fd, chunk, offset), os.pread(two, chunk, offset)
            if x != y:
                return False
            if not x:
                return True
            offset += len(x)
    except OSError:
        return False
    finally:
        os.close(two)


def _bases_folder() -> Path | None:
    from shellyard.runner.environments.bases import bases_root

    root = bases_root()
    return root if root.is_dir() else None


def _base_refs(refs: Path) -> Iterator[dict[str, object]]:
    with contextlib.suppress(FileNotFoundError), open(refs) as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _check_bases(refs: Path) -> None:
    """Before anything is written: every base file the backup names is on this host, the same
    size (a base revision never changes in place), or the restore is refused."""
    for ref in _base_refs(refs):
        source = Path(str(ref["source"]))
        try:
            same = source.stat().st_size == ref["size"]
        except OSError:
            same = False
        if not same:
            raise InvalidInput(
                f"this backup shares files with a base environment this host lacks ({source}); "
                f"prepare the same base revision here (`shellyard env prepare`, SHELLYARD_BASES) "
                f"or restore a backup made with `shellyard backup --full`"
            )


def _share_bases(refs: Path, settings: Settings, counter: _Counter) -> None:
    """The files a backup shares with a base, as the runner would share them now: hard links
    or copies (``SHELLYARD_BASE_SHARING``, docs/environments.md)."""
    from shellyard.runner.environments.derive import sharing

    linking = sharing(settings.local_policy) == "links"
    _link_bases(refs, settings.local_runner_root, counter, linking)


def _link_bases(refs: Path, root: Path, counter: _Counter, linking: bool = True) -> None:
    """Link each file a backup shares with a base to the base's file again (``linking``; a
    copy where a link cannot be made: another file system), or copy it, an inode of its own
    owned as its folder, as an environment's copy is made (docs/security.md "Environments
    share no inode with a base"; a backup of an older release names the files it shared by
    link the same way). Each path is walked from the runner folder with ``O_NOFOLLOW``
    (``Folders``): a link the restore made never leads a name elsewhere."""
    with open_root(root) as root_fd, Folders(root_fd, create=True) as folders:
        for ref in _base_refs(refs):
            source = Path(str(ref["source"]))
            try:
                at = folders.resolve(str(ref["path"]))
            except InvalidInput as exc:
                raise InvalidInput(
                    f"this backup's {BASE_LINKS} names {ref['path']!r}, which its own files "
                    f"do not hold as folders ({exc}); it was changed after `shellyard backup` "
                    f"made it: restore an unchanged backup"
                ) from None
            counter.files += 1
            if linking:
                try:
                    os.link(source, at.name, dst_dir_fd=at.dir_fd, follow_symlinks=False)
                    counter.linked += 1
                    continue
                except OSError:
                    pass
            counter.bytes += _copy_base_file(source, at.dir_fd, at.name, own=not linking)


def _copy_base_file(source: Path, dir_fd: int, name: str, own: bool) -> int:
    """Copy a base's file as ``name`` below ``dir_fd``; ``own``: mode 0755/0644 and owned as
    its folder (an environment's own copy, ``derive.copy_file``), else as the base's file."""
    src = os.open(source, O_FILE)
    try:
        dst = os.open(name, O_NEW, 0o600, dir_fd=dir_fd)
        try:
            info = os.fstat(src)
            written = copy_fd(src, dst, info.st_size)
            copy_meta(src, dst, info)
            if own:
                folder = os.fstat(dir_fd)
                os.fchown(dst, folder.st_uid, folder.st_gid)
                os.fchmod(dst, 0o755 if info.st_mode & stat.S_IXUSR else 0o644)
            return written
        finally:
            os.close(dst)
    finally:
        os.close(src)


# ---------------------------------------------------------------------- copying


def _room_for_descriptors() -> None:
    """The walk holds three descriptors a folder level (``tree_walk``, and the copy's folder):
    the soft limit is raised to the hard one, so an agent's tree 1,000 folders deep does not
    fail the backup with EMFILE under a default soft limit of 1,024. This process only (the
    CLI's ``backup`` and ``restore`` verbs)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _copy_tree(
    source: Path, target: Path, counter: _Counter, skipped: frozenset[str] = frozenset()
) -> None:
    """Files, folders and symbolic links (never followed) with modes, times and owners;
    streamed by the kernel (no file is read into memory); what vanishes meanwhile is left out,
    and so are entries named in ``skipped`` (at any depth). Both trees are walked by
    descriptors only (``tree_walk``): an agent swapping a folder of its workspace for a link
    while root copies it never has a host folder copied (backup) nor a restored link followed
    (restore)."""
    _room_for_descriptors()
    try:
        src_root = os.open(source, O_DIR)
    except FileNotFoundError:
        return
    targets = [_make_folder(target)]  # the copy of each folder being walked, innermost last
    try:
        for walked in walk_at(src_root, skipped):
            if walked.step is Step.LEAF:
                _copy_leaf(walked, targets[-1], target / walked.rel, counter)
            elif walked.step is Step.ENTER:
                targets.append(_make_folder_at(targets[-1], walked.name))
            else:
                made = targets.pop()
                try:
                    if walked.step is Step.DONE:
                        copy_meta(walked.fd, made, walked.st)
                finally:
                    os.close(made)
                if walked.step is Step.GONE:  # left out, as if it had vanished
                    remove_at(targets[-1], walked.name)
        copy_meta(src_root, targets[0], os.fstat(src_root))
    finally:
        for fd in targets:
            os.close(fd)
        os.close(src_root)


def _copy_leaf(walked: Walked, dir_fd: int, destination: Path, counter: _Counter) -> None:
    """A file or a link as listed in ``walked``, into the folder ``dir_fd``; gone or changed
    kind meanwhile: left out. Sockets, fifos, devices: nothing a snapshot holds."""
    st = walked.st
    try:
        if stat.S_ISLNK(st.st_mode):
            os.symlink(
                os.readlink(walked.name, dir_fd=walked.parent_fd), walked.name, dir_fd=dir_fd
            )
            with contextlib.suppress(PermissionError):
                os.chown(walked.name, st.st_uid, st.st_gid, dir_fd=dir_fd, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            # O_NONBLOCK: a fifo swapped in is opened without waiting, then left out
            src = os.open(walked.name, O_FILE, dir_fd=walked.parent_fd)
            try:
                info = os.fstat(src)
                if stat.S_ISREG(info.st_mode):
                    counter.copy_file(src, dir_fd, walked.name, destination, info)
            finally:
                os.close(src)
    except OSError as exc:
        if exc.errno not in CHANGED and exc.errno != errno.EINVAL:  # EINVAL: no longer a link
            raise


def _make_folder(path: Path) -> int:
    """The runner's own folder (or the backup's), made if missing; a link there is refused."""
    path.mkdir(parents=True, exist_ok=True)
    return os.open(path, O_DIR)


def _make_folder_at(dir_fd: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=dir_fd)  # its own mode comes with DONE
    return os.open(name, O_DIR, dir_fd=dir_fd)


def _copy_meta(source: Path, target: Path) -> None:
    """One of the runner's own folders' mode, times and owner onto its copy."""
    with contextlib.suppress(FileNotFoundError):
        src = os.open(source, O_DIR)
        try:
            dst = os.open(target, O_DIR)
            try:
                copy_meta(src, dst, os.fstat(src))
            finally:
                os.close(dst)
        finally:
            os.close(src)


__all__ = ["BackupReport", "RestoreReport", "backup", "restore"]
