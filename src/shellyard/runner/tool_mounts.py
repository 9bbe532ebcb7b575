"""A file system of its own for each folder a package tool writes (R2, V4; docs/security.md
"Host paths", "A package tool's folders").

A package tool (uv, Rscript, the conda child) writes an environment's prefix, its cache and
the change's scratch folder, seen at /env, /env-cache and /env-scratch. A bind of such a
folder prints, in ``/proc/self/mountinfo`` field 4, its path inside its file system, which
names the home (``<home>/runners/local/environments/env_…/prefix``), and a build backend
reads it. Only a mount whose own root is the folder hides that, so a root runner binds,
instead of each folder, a writable overlay of it: upper layer the folder itself (what the
tool writes lands there, no copy-up: the one lower layer is an empty folder), work folder
beside it (overlayfs wants it on the same mount; kept for the folder's next run), layers
named by descriptors. The line reads ``/ /env rw,… - overlay overlay
rw,lowerdir=/proc/self/fd/N,upperdir=…,volatile,index=off``.

One overlay per tool run, mounted just before its spawn and detached as soon as it has
exited: between tools the runner reads and writes these folders directly (the package
list, ownership, sources' copies), and overlayfs leaves a layer changed beside a mounted
overlay undefined (docs/security.md, own_mounts.py). ``volatile``: an unmount would
otherwise sync the whole upper file system (measured: 0.39 s with 50 MiB dirty, 4 ms
volatile), which a plain bind never did; nothing of the runner relies on a tool's fsync.

Mount points live in ``directory`` (0711: bwrap, run as the tools' uid, walks there); a
killed runner's are detached at the next start. Not root, ``SHELLYARD_OWN_MOUNTS=off``, or
a refused mount: the folder is bound itself and its path shows (docs/security.md "Known
limits").
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from shellyard.runner.own_mounts import mount_overlay, unmount_all

log = logging.getLogger(__name__)

#: Beside a folder a tool writes: overlayfs' work folder for its overlay (one tool at a time
#: per folder: the environment's lock, a base's build lock).
WORK_SUFFIX = ".tool-work"


class ToolMounts:
    """The overlays of one runner's (or one operator build's) package tools."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._empty = directory / "empty"
        self._names = itertools.count()
        #: the work folders made beside the tools' folders (kept for the next run)
        self._works: set[Path] = set()
        self.enabled = False

    def startup(self, enabled: bool) -> None:
        """``enabled``: this process mounts overlays (``own_mounts.allowed``). What a killed
        runner left mounted here is detached: its tools died with it (--die-with-parent)."""
        if not enabled:
            return
        self.directory.mkdir(mode=0o711, exist_ok=True)
        self.directory.chmod(0o711)
        self._empty.mkdir(mode=0o700, exist_ok=True)
        self.close()
        self.enabled = True

    @contextlib.contextmanager
    def mounted(self, binds: Sequence[tuple[Path, Path]]) -> Iterator[list[tuple[Path, Path]]]:
        """``binds`` (host folder, where the tool sees it) with each host folder replaced by
        its overlay's mount point, for one tool run; all detached on leaving. A folder the
        kernel refuses stays bound itself (logged)."""
        shown: list[tuple[Path, Path]] = []
        points: list[tuple[Path, Path]] = []
        try:
            for host, seen in binds:
                point = self._mount(host) if self.enabled else None
                if point is None:
                    shown.append((host, seen))
                else:
                    points.append((point, host))
                    shown.append((point, seen))
            yield shown
        finally:
            for point, host in points:
                try:
                    _remove(point)
                except OSError as exc:  # close() or the next start detaches it
                    log.warning("overlay of %s left mounted: %s", host, exc)

    def close(self) -> None:
        """Detach every overlay left here (none after a tool run that ended normally), so
        no walk of the folder that holds ``directory`` ever enters a tool's folder; then
        remove the work folders this object made beside the tools' folders."""
        self.enabled = False
        if self.directory.is_dir():
            for entry in os.scandir(self.directory):
                if entry.name != self._empty.name:
                    _remove(Path(entry.path))
        for work in list(self._works):  # a copy: a change's thread may add one meanwhile
            shutil.rmtree(work, ignore_errors=True)
            self._works.discard(work)

    def _mount(self, host: Path) -> Path | None:
        point = self.directory / f"{os.getpid()}.{next(self._names)}"
        work = _work_of(host)
        try:
            _clear_volatile(work)
            work.mkdir(mode=0o700, exist_ok=True)
            self._works.add(work)
            point.mkdir(mode=0o700)
            mount_overlay(point, self._empty, work=work, upper=host, volatile=True)
        except OSError as exc:
            log.warning("%s is bound itself (mountinfo shows its path): %s", host, exc)
            with contextlib.suppress(OSError):
                point.rmdir()
            return None
        return point


def shown_below(path: Path, binds: Sequence[tuple[Path, Path]], mounted: Sequence[Path]) -> Path:
    """``path`` (a copy the runner made inside one of ``binds``' host folders) reached
    through that folder's overlay in ``mounted`` (same order as ``binds``), so its own
    bind's mountinfo root is the path inside the overlay, not the home's."""
    for (host, _seen), point in zip(binds, mounted, strict=True):
        if point != host and path.is_relative_to(host):
            return point / path.relative_to(host)
    return path


def _work_of(host: Path) -> Path:
    return host.with_name(f".{host.name}{WORK_SUFFIX}")


def _clear_volatile(work: Path) -> None:
    """overlayfs leaves a mark in a volatile overlay's work folder and refuses another mount
    on it while the mark is there (EINVAL, "incompat feature 'volatile'"). Removed by name,
    three calls: a walk of the whole folder cost 10 ms a run on a loaded machine."""
    mark = work / "work" / "incompat" / "volatile"
    for remove, path in ((os.unlink, mark / "dirty"), (os.rmdir, mark)):
        with contextlib.suppress(FileNotFoundError):
            remove(path)


def _remove(point: Path) -> None:
    unmount_all(point)
    with contextlib.suppress(OSError):  # never a walk: rmdir of the bare mount point
        point.rmdir()
