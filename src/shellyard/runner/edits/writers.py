"""The writer-operation lock of a runner's workspaces (W1): one writer operation (write,
upload, delete, move, restore, batch) at a time on a workspace, never beside an execution that
may change it, held through the workspace's overlay (R2, runner/own_mounts.py); and the room
left under the workspace quota for what it writes (limits R2, docs/limits.md)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator, Callable, Mapping

from shellyard.errors import NotFound, OutOfRoom, WorkspaceBusy
from shellyard.runner.edits.placing import Placer
from shellyard.runner.protocol import SandboxPolicy
from shellyard.runner.snapshots.store import SnapshotStore


class Writers:
    """Which workspaces are in the middle of a writer operation (``editing``)."""

    def __init__(
        self,
        policy: SandboxPolicy,
        placer: Placer,
        snapshots: SnapshotStore,
        *,
        require_workspace: Callable[[str], None],
        require_room: Callable[[str], None],
        forget_usage: Callable[[str], None],
        busy: Mapping[str, str],
        held: Callable[[str], contextlib.AbstractContextManager[None]],
    ) -> None:
        self._policy = policy
        self._placer = placer
        self._snapshots = snapshots
        self._require_workspace = require_workspace
        #: raises when the runner's volume is below its reserve (limits/reserve.py)
        self._require_room = require_room
        #: the limits guard forgets the workspace's measured usage (limits/watcher.py)
        self._forget_usage = forget_usage
        #: workspace id -> the execution that holds it (sandbox/supervise.py)
        self._busy = busy
        #: R2: a hold on the workspace's folders, through their overlay (own_mounts.py)
        self._held = held
        #: Workspaces in the middle of a file operation (write, move, restore, batch, ...).
        self.editing: set[str] = set()

    @contextlib.asynccontextmanager
    async def writing(self, workspace_id: str, frees: bool = False) -> AsyncIterator[None]:
        """One writer operation at a time on the workspace, never beside an execution."""
        self._require_workspace(workspace_id)
        # limits (R2, docs/limits.md): a delete may run below the reserve, it frees space
        if not frees:
            self._require_room(f"a change to workspace {workspace_id}")
        # limits (R2, docs/limits.md): its usage must be measured again
        self._forget_usage(workspace_id)
        # W1: one writer at a time, so one still here is an aborted one's tail: 5 s to unwind
        for _ in range(100):
            if workspace_id not in self.editing:
                break
            await asyncio.sleep(0.05)
        holder = self._busy.get(workspace_id)
        if holder is not None:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in use by execution {holder}; its files change "
                f"only when it ends",
                holder=holder,
            )
        if workspace_id in self.editing:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in the middle of another file operation",
                holder="file operation",
            )
        self.editing.add(workspace_id)
        try:
            # R2: through its overlay (own_mounts); a crash's temp files swept at start
            with self._held(workspace_id), self._placer.writing(workspace_id):
                yield
        except FileNotFoundError as exc:
            # the live tree changed under the operation (nothing but a writer should touch it)
            raise NotFound(
                f"a file or folder of workspace {workspace_id} vanished during the operation "
                f"({exc.strerror}: {exc.filename!r}); nothing was written outside it; try again"
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise OutOfRoom(
                    f"workspace {workspace_id}'s filesystem is out of room ({exc.strerror}); "
                    f"free space or write less"
                ) from None
            raise
        finally:
            self.editing.discard(workspace_id)

    def room_left(self, workspace_id: str) -> int | None:
        """Bytes the workspace may still grow by under its quota (None: no quota). A writer
        runs only beside no execution and commits its change, so the head snapshot is the
        tree's size (limits R2, docs/limits.md "Uploads and the quota")."""
        quota = self._policy.workspace_quota_bytes
        if not quota:
            return None
        try:
            used = self._snapshots.head(workspace_id).bytes
        except NotFound:
            used = 0
        return max(0, quota - used)
