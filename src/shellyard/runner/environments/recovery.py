"""Keeping an environment's folder whole across crashes (V8; docs/environments.md): the flock
one change or recovery holds, records written atomically, a change cut short rolled back to its
journal's base snapshot, its record marked ``interrupted``, and at startup in copies mode an
environment made ``--from`` a base by hard links given copies of its own (store.py runs these).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shellyard.errors import ShellyardError
from shellyard.runner.edits.editor import Editor
from shellyard.runner.environments import derive
from shellyard.runner.environments.tools import BASE_OWNER, LEGACY_BASE_OWNER
from shellyard.runner.protocol import EnvChangeState, EnvironmentChange, EnvironmentChangeRequest
from shellyard.runner.snapshots import history
from shellyard.runner.snapshots.store import SnapshotStore

log = logging.getLogger(__name__)

ENV_FILE = "env.json"
JOURNAL_FILE = "journal.json"
#: Present when the last change left every file of the prefix to the tools' uid (or a base):
#: the next change skips the ownership walk (``give_to_tools``).
TOOLS_OWN = "tools-own"
#: Present once an environment made ``--from`` a base by hard links has
#: copies of its own instead (``unshare_all``, docs/security.md "Environments share no inode").
UNSHARED = "base-copies"
BASE_OWNERS = frozenset({BASE_OWNER, LEGACY_BASE_OWNER})
#: Names under the environments folder that are not environments.
RESERVED = frozenset({"changes", "cache", "store", "staging", "wheels", "verified"})

INTERRUPTED = (
    "the runner stopped (a crash or a restart) during the change; the environment was rolled "
    "back to its state before the change: run the change again"
)


def rollback(
    editor: Editor,
    store: SnapshotStore,
    env_dir_of: Callable[[str], Path],
    journal: dict[str, Any],
) -> None:
    """Make the prefix what it was before the change (synchronous; re-runnable)."""
    request = EnvironmentChangeRequest.model_validate(journal["request"])
    env_id = request.environment_id
    env_dir = env_dir_of(env_id)
    if request.action == "create":
        # Nothing was there: the environment stops existing first, then its files go.
        with contextlib.suppress(FileNotFoundError):
            (env_dir / ENV_FILE).unlink()
        shutil.rmtree(env_dir / "prefix", ignore_errors=True)
        return
    base_seq = journal["base_seq"]
    if base_seq is None:  # the journal names no base: the manager never ran
        return
    base = history.manifest(store, env_id, int(base_seq)).info
    # Commit what the failed change left, then restore the base over it: the Editor
    # compares the two manifests and rewrites only the difference.
    editor.commit(env_id)
    restored = editor.restore(env_id, int(base_seq), "").snapshot
    if restored.root_hash != base.root_hash:
        raise RuntimeError(
            f"the prefix of {env_id} differs from snapshot {base_seq} after the restore "
            f"(snapshot {restored.seq})"
        )


def unshare_all(root: Path) -> None:
    """Startup in copies mode, once per environment: one made ``--from`` a base by hard
    links (an older release, or ``SHELLYARD_BASE_SHARING=links`` before) shares the base's
    inodes, whose link count tells every session how many environments all sessions made
    from it; its files become copies of its own."""
    for env_dir in sorted(root.iterdir()):
        if env_dir.name in RESERVED or (env_dir / UNSHARED).exists():
            continue
        try:
            meta = json.loads((env_dir / ENV_FILE).read_text())
        except (OSError, ValueError):
            continue
        records = meta.get("base") or []
        if not any(str(r.get("source", "")).endswith("(hard links)") for r in records):
            continue
        lock_fd = try_lock(env_dir)
        if lock_fd is None:
            log.warning("environment %s is locked by another process", env_dir.name)
            continue
        try:
            copied = derive.unshare(env_dir / "prefix", BASE_OWNERS)
            (env_dir / TOOLS_OWN).unlink(missing_ok=True)  # the copies are root's
            write_atomic(env_dir / UNSHARED, "")
            log.info("environment %s: %d hard links of its base copied", env_dir.name, copied)
        except (OSError, ShellyardError):
            log.exception("copying environment %s's base files failed", env_dir.name)
        finally:
            os.close(lock_fd)


def interrupted(record: EnvironmentChange) -> EnvironmentChange:
    return record.model_copy(
        update={
            "state": EnvChangeState.failed,
            "error": INTERRUPTED,
            "error_kind": "interrupted",
            "progress": "failed",
            "packages": [],
            "finished_at": time.time(),
        }
    )


def try_lock(env_dir: Path) -> int | None:
    """The environment's flock, or None when another process holds it: one process changes
    (or recovers) an environment at a time, even with two runners wrongly on one folder."""
    fd = os.open(env_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def write_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)
