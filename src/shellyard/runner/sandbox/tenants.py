"""A host uid per workspace (R2; docs/security.md "A uid per workspace").

A root runner gives each workspace its own unprivileged uid (gid the same number) from a
range (``SHELLYARD_UID_RANGE``, default ``DEFAULT_RANGE``): its files, its processes and its
per-uid rlimits are its own, so one workspace's processes never count against another's
(RLIMIT_NPROC counts per uid). The map is kept runner-side in ``<runner home>/uids.json``
(written atomically under a lock), so it survives restarts and a daemon on another host keeps
its own consistent map. A uid any account of the host uses (``getpwuid``) or that
``/etc/subuid`` hands out is never chosen; a uid is given again only after its workspace is
gone (``release``). A runner that is not root keeps its own single uid (``runner show``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from shellyard.errors import InvalidInput, SandboxUnavailable
from shellyard.runner.policy import SandboxPolicy

log = logging.getLogger(__name__)

#: 1,000 uids above the shared sandbox uid (61000, sandbox.py) and the bases' owner (60999),
#: below the 65534 of ``nobody``; free on the hosts we know (no account, not in /etc/subuid).
DEFAULT_RANGE = (61001, 61999)
#: The owner of the base environments' files (python-base, r-base): a uid nothing runs as,
#: just below the shared sandbox uid, never given to a workspace (even by a range that holds
#: it), so no sandbox, package tool or local process can chmod or rewrite a base file
#: (docs/security.md, "The bases' owner").
BASES_UID = 60999


def parse_range(raw: str | None) -> tuple[int, int] | None:
    """``FIRST-LAST`` → (first, last); None or ``off`` → None (one uid for every workspace)."""
    if raw is None:
        return DEFAULT_RANGE
    text = raw.strip()
    if text == "off":
        return None
    first, _, last = text.partition("-")
    if not (first.isdigit() and last.isdigit()) or not 1000 <= int(first) <= int(last) < 65534:
        raise InvalidInput(
            f"SHELLYARD_UID_RANGE must be FIRST-LAST, two uids between 1000 and 65533 "
            f"(e.g. 61001-61999), or off, not {raw!r}"
        )
    return int(first), int(last)


def range_of(policy: SandboxPolicy) -> tuple[int, int] | None:
    """The policy's uid range: ``uid_range`` when set; otherwise the default range, unless
    the operator chose one ``sandbox_uid`` for every workspace (then None)."""
    if policy.uid_range is None and policy.sandbox_uid is not None:
        return None
    return parse_range(policy.uid_range)


def subordinate_ranges() -> list[tuple[int, int]]:
    """The ranges /etc/subuid and /etc/subgid hand to users' namespaces (start, count)."""
    found: list[tuple[int, int]] = []
    for name in ("/etc/subuid", "/etc/subgid"):
        with contextlib.suppress(OSError):
            for line in Path(name).read_text().splitlines():
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    found.append((int(parts[1]), int(parts[2])))
    return found


def in_use(uid: int, subordinate: list[tuple[int, int]]) -> bool:
    """Not for a workspace: an account's, a subordinate range's, or the bases' owner."""
    return uid == BASES_UID or held_by_host(uid, subordinate)


def held_by_host(uid: int, subordinate: list[tuple[int, int]]) -> bool:
    """An account of this host has ``uid``, or /etc/subuid or /etc/subgid hands it out."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    return any(start <= uid < start + count for start, count in subordinate)


class UidMap:
    """workspace id → uid, durable in ``path``."""

    def __init__(self, path: Path, first: int, last: int) -> None:
        self.path = path
        self.first, self.last = first, last
        self._lock = threading.Lock()
        self._map: dict[str, int] = {}

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, int]]:
        lock = self.path.with_name(self.path.name + ".lock")
        # The runner's files are its user's alone (filemodes.py): 0600 from the start.
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with self._lock, os.fdopen(fd, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._map = json.loads(self.path.read_text()) if self.path.exists() else {}
            except (OSError, ValueError):
                self._map = {}
            yield self._map

    def _save(self) -> None:
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(self._map, sort_keys=True))
        os.replace(tmp, self.path)

    def uid(self, workspace_id: str) -> int:
        """The workspace's uid, given now (the lowest free one) if it has none yet."""
        known = self._map.get(workspace_id)
        if known is not None:
            return known
        with self._locked() as mapping:
            if workspace_id in mapping:
                return mapping[workspace_id]
            taken = set(mapping.values())
            subordinate = subordinate_ranges()
            free = [
                uid
                for uid in range(self.first, self.last + 1)
                if uid not in taken and not in_use(uid, subordinate)
            ]
            if free:
                uid = free[0]
            else:
                # Every uid given: share the least shared one rather than refuse the
                # workspace (its sandbox still sees only its own tree; the pids cgroup still
                # bounds its processes). Logged: widen SHELLYARD_UID_RANGE.
                usable = [u for u in range(self.first, self.last + 1) if not in_use(u, subordinate)]
                if not usable:
                    raise SandboxUnavailable(
                        f"every uid of SHELLYARD_UID_RANGE {self.first}-{self.last} is used by "
                        f"an account of this host: choose a range no account uses"
                    )
                counts = {u: 0 for u in usable}
                for given in mapping.values():
                    if given in counts:
                        counts[given] += 1
                uid = min(usable, key=lambda u: (counts[u], u))
                log.warning(
                    "every uid of %d-%d is given: workspace %s shares uid %d; widen "
                    "SHELLYARD_UID_RANGE",
                    self.first,
                    self.last,
                    workspace_id,
                    uid,
                )
            mapping[workspace_id] = uid
            self._save()
            return uid

    def release(self, workspace_id: str) -> None:
        """The workspace is gone: its uid may be given again."""
        with self._locked() as mapping:
            if mapping.pop(workspace_id, None) is not None:
                self._save()

    def known(self) -> dict[str, int]:
        with self._locked() as mapping:
            return dict(mapping)


def described(uids: UidMap | None, ids: tuple[int, int] | None) -> str:
    """Which uids a runner's sandboxes run as, for its limits' view (docs/limits.md)."""
    if uids is not None:
        return f"one per workspace ({uids.first}-{uids.last})"
    if ids is not None:
        return f"one uid for every workspace ({ids[0]})"
    return f"this runner's own uid ({os.geteuid()}): not root"


def chown_tree(tree: Path, uid: int, gid: int) -> int:
    """Give every entry of ``tree`` to ``uid`` (a workspace made before it had its own uid,
    or by another): links are changed themselves, never followed. Returns the count."""
    count = 0
    os.lchown(tree, uid, gid)
    for folder, dirs, files in os.walk(tree):
        for name in [*dirs, *files]:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(folder, name), uid, gid)
                count += 1
    return count


def close_root(tree: Path, mode: int | None = None) -> None:
    """R2 tenants: a workspace's root is 0700 at every use and after every execution. Its uid
    may chmod /workspace from inside (it owns it); left 0755/0777, any other workspace's uid
    (they share the sandbox group, which may pass every folder above) could read it from the
    host. Inside the root, the agent's own modes (0664, 0777) stay its own choice: nothing above
    lets another uid reach them (docs/security.md "Tenants: attack pass (second engineer)")."""
    with contextlib.suppress(FileNotFoundError):
        if mode is None:  # else the caller's lstat of it just now
            mode = tree.lstat().st_mode
        if mode & 0o7777 != 0o700:
            os.chmod(tree, 0o700, follow_symlinks=False)


def give_and_close(tree: Path, uid: int, gid: int) -> int | None:
    """R2 tenants, at every use of a workspace: its root (tree or home) given to ``uid`` and
    ``gid`` (``chown_tree``) when it is not theirs, and closed to 0700 (``close_root``), both
    from one ``lstat`` where a stat for the owner and an lstat for the mode were taken (two
    roots, 1-2 uses per execution, docs/benchmarks.md §75). The runner makes each root a
    folder, whose own owner and mode are what stat gives; a link there is looked at as before
    (the owner through it, the mode of the link). The entries given, None: none or no root."""
    try:
        info = os.lstat(tree)
    except FileNotFoundError:
        return None
    owner: os.stat_result | None = info
    if stat.S_ISLNK(info.st_mode):
        try:
            owner = os.stat(tree)
        except FileNotFoundError:
            owner = None
    if owner is not None and (owner.st_uid != uid or owner.st_gid != gid):
        try:
            moved = chown_tree(tree, uid, gid)
        except FileNotFoundError:  # removed meanwhile: nothing to give or close
            return None
        close_root(tree)  # its mode read again after the walk
        return moved
    close_root(tree, info.st_mode)
    return None
