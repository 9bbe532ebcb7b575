"""LocalRunner: runs executions in bubblewrap sandboxes on this host (R1, R2, E7, E8, E11).

This module is the Runner protocol's face: start-up, workspaces, files and history. The jobs
behind it live in the rooms beside it: ``sandbox/`` (``spawn.py``: one sandbox's command line
and files; ``supervise.py``: watching, cancel, logs, re-attach; ``bwrap.py``, ``seccomp.py``:
the sandbox itself), ``network/`` (a workspace's network, ports, the egress proxy),
``limits/``, ``snapshots/`` and ``edits/`` (files), ``environments/``.

On disk, under ``root``::

    workspaces/<workspace_id>/      the live tree, owned by the sandbox uid
    executions/<execution_id>/      meta.json, stdout, stderr, status, cancel, result.json
    snapshots/                      SnapshotStore (content-addressed objects + manifests)
    sandbox/                        the seccomp filter, the egress proxy's socket
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
from pathlib import Path

from shellyard import __version__, filemodes
from shellyard.errors import InvalidInput, NotFound, WorkspaceBusy
from shellyard.runner import closing, kept, state_id, volume
from shellyard.runner.edits.editor import Editor
from shellyard.runner.edits.tarscan import TarLimits
from shellyard.runner.edits.writers import Writers
from shellyard.runner.environments import bases
from shellyard.runner.environments.store import EnvironmentStore
from shellyard.runner.limits import cgroups, retention
from shellyard.runner.limits.reserve import require_room  # limits (R2, docs/limits.md)
from shellyard.runner.limits.watcher import Guard as LimitsGuard  # limits (R2, docs/limits.md)
from shellyard.runner.network import netns
from shellyard.runner.network.egress_proxy import EgressProxy
from shellyard.runner.network.netns import WorkspaceNetworks
from shellyard.runner.network.ports import Relays
from shellyard.runner.own_mounts import OwnMounts
from shellyard.runner.prefix_mounts import PrefixMounts
from shellyard.runner.protocol import (
    PROTOCOL_VERSION,
    ApplyEntry,
    ApplyResult,
    ByteStream,
    DiffResult,
    DirListing,
    EditResult,
    EnvironmentChange,
    EnvironmentChangeRequest,
    EnvironmentInfo,
    FileChunk,
    GcResult,
    LogChunk,
    LogPruneRequest,
    LogPruneResult,
    LogStream,
    ObjectResult,
    PathEntry,
    PortView,
    PruneResult,
    RunnerExecution,
    RunnerInfo,
    SandboxPolicy,
    SnapshotInfo,
    StartRequest,
    coalesce,
)
from shellyard.runner.sandbox import bwrap as sandbox
from shellyard.runner.sandbox import clean_namespace, folder_access, launch, tenants, warm
from shellyard.runner.sandbox.clean_namespace import CleanNamespace
from shellyard.runner.sandbox.log_root import LogRoot
from shellyard.runner.sandbox.seccomp import SeccompProfile
from shellyard.runner.sandbox.spawn import Sandboxes, check_start, script_argv
from shellyard.runner.sandbox.supervise import Supervisor, TerminalDoor, check_id
from shellyard.runner.sandbox.warm import SOURCE as WARM
from shellyard.runner.snapshots import history, objects
from shellyard.runner.snapshots.budget import HashBudget
from shellyard.runner.snapshots.objects import PackImporter, StoreLock, aiter_thread
from shellyard.runner.snapshots.store import SnapshotStore
from shellyard.runner.tool_mounts import ToolMounts

log = logging.getLogger(__name__)


class LocalRunner(TerminalDoor):  # E13: send_input, screen, resize
    """The Runner protocol on this host. Call ``startup()`` before use, ``aclose()`` after."""

    def __init__(
        self,
        root: Path,
        policy: SandboxPolicy | None = None,
        *,
        hidden: list[Path] | None = None,
    ) -> None:
        self.root = root.absolute()
        self.policy = policy or SandboxPolicy()
        self._workspaces = self.root / "workspaces"
        #: Each workspace's home, bound at /home/agent (docs/contract.md "The home").
        self._homes = self.root / "homes"
        self._executions = self.root / "executions"
        self._paths_of = kept.folders(  # tree and home, the id checked (~9 asks a run)
            lambda ws: check_id(ws, "workspace id"), self._workspaces, self._homes
        )
        self._sandbox_dir = self.root / "sandbox"
        #: R2: an overlay of its own per workspace, home and view (own_mounts.py)
        self._mounts = OwnMounts(self._sandbox_dir / "overlays", (self._workspaces, self._homes))
        self._prefixes = PrefixMounts(self._sandbox_dir / "prefixes")  # and each prefix's
        self._tool_mounts = ToolMounts(self._sandbox_dir / "tools")  # a tool's folders'
        self._snapshots = SnapshotStore(self.root / "snapshots")
        # a tree newly mounted: the change hints' watches were added through the last overlay
        self._mounts.mounted = lambda folder: self._snapshots.forget_changes(folder.name)
        #: the busy spawns' clean mount namespace; None: not root, or refused
        self._clean: CleanNamespace | None = None
        self._store_lock = StoreLock(self.root / "snapshots")
        self._ids = sandbox.sandbox_ids(self.policy)
        # R2 tenants: a uid per workspace (tenants.py) when root and a range is set
        uid_range = tenants.range_of(self.policy) if self._ids else None
        self._uids = tenants.UidMap(self.root / "uids.json", *uid_range) if uid_range else None
        self._reached: set[int] = set()
        self._editor = Editor(
            self._snapshots,
            self._store_lock,
            self.root / "staging",
            self._ids,
            self.workspace_path,
            self._workspace_ids if self._uids is not None else None,
        )
        self._editor.room = lambda: require_room(self.root, self.policy, "unpacking an upload")
        self._editor.hold = self._mounts.held  # R2: its start-up sweep through the overlay
        self._hidden = [self.root, *(hidden or [])]
        self._proxy: EgressProxy | None = None
        self._relays: Relays | None = None  # R5: forwarded ports, egress relays
        self._sandboxes = Sandboxes(
            policy=self.policy,
            ids=self._ids,
            bwrap="",
            view=sandbox.HostView((), ()),
            seccomp=SeccompProfile(self._sandbox_dir / "seccomp.bpf"),
            disable_userns=False,
            workspace_ids=self._workspace_ids if self._uids is not None else None,
            home_of=self.home_path,
            logs=LogRoot(self.root),
        )
        # limits (R2, docs/limits.md): quota and log cap while commands run (limits/watcher.py)
        self._guard = LimitsGuard(self.root, self.policy, self._snapshots.head)
        self._runs = Supervisor(
            self._executions,
            self._sandboxes,
            self._commit,
            self.policy.cancel_grace_s,
            self._guard,
            self.workspace_path,
            self._snapshots,
            self._mounts,
        )
        # W1: the writer-operation lock of each workspace (edits/writers.py)
        self._writers = Writers(
            self.policy,
            self._editor,
            self._snapshots,
            require_workspace=self._require_workspace,
            require_room=lambda what: require_room(self.root, self.policy, what),
            forget_usage=self._guard.forget,
            busy=self._runs.busy_workspaces,
            held=self._mounts.held,
        )
        self._environments = EnvironmentStore(
            self.root / "environments",
            self.policy,
            sandboxes=self._sandboxes,
            users=lambda env_id: sorted(self._runs.environment_users.get(env_id, ())),
            workspace_path=self.workspace_path,
        )
        self._environments.hold = self._mounts.held  # R2: a change reads its workspace held

    # ----------------------------------------------------------------- lifecycle

    async def startup(self) -> None:
        # The service user's alone (docs/security.md "The home's files"): 0700 folders,
        # 0600 files; what a runner of an older release made wider is narrowed once.
        for directory in (self.root, self._workspaces, self._executions, self._sandbox_dir):
            filemodes.private_dir(directory)
        filemodes.private_dir(self._homes)
        spare = filemodes.runner_spare(self.root)
        await asyncio.to_thread(filemodes.tighten_once, self.root, spare)
        slow_volume = await asyncio.to_thread(volume.warning, self.root)
        if slow_volume is not None:
            log.warning("%s", slow_volume)
        # before any answer: a NO_TRACE must say which state folder holds no trace (E9)
        self._runs.state_id = await asyncio.to_thread(state_id.load_or_create, self.root)
        await self._prepare_sandboxes()
        await asyncio.to_thread(self._editor.startup)
        await self._environments.startup(self._sandboxes.bwrap)
        await asyncio.to_thread(self._runs.views.startup)
        if self._ids is not None:  # not root: the sandbox runs as this user
            roots = (self._workspaces, self._homes, self._runs.views.directory)
            folder_access.grant_sandbox_uid(
                (*roots, self._environments.root), self._sandbox_dir, *self._ids
            )
        await self._runs.recover()
        await asyncio.to_thread(self._runs.views.forget_unused)  # W2: none in use
        # R2: a killed runner's overlays go but those of the sandboxes adopted above (E11)
        await asyncio.to_thread(self._mounts.unmount_unheld)
        if self._sandboxes.networks is not None:  # R2: none of a finished workspace
            await asyncio.to_thread(self._sandboxes.networks.forget_unused)
        if self._relays is not None:
            await asyncio.to_thread(self._relays.forget_unused)

    async def _prepare_sandboxes(self) -> None:
        """Build once what every spawn reuses: bwrap, the host view, seccomp, the proxy."""
        box = self._sandboxes
        box.logs.open()  # R2: one detached copy of the root for the runner's life (log_root.py)
        await asyncio.to_thread(self._mounts.startup)
        # R2: an overlay of its own per prefix a sandbox binds, where the workspaces get theirs
        await asyncio.to_thread(self._prefixes.startup, self._mounts.enabled)
        box.prefixes = self._prefixes if self._prefixes.enabled else None
        # ...and per folder a package tool writes, for each tool run (tool_mounts.py)
        await asyncio.to_thread(self._tool_mounts.startup, self._mounts.enabled)
        box.tool_mounts = self._tool_mounts if self._tool_mounts.enabled else None
        box.bwrap = sandbox.find_bwrap()
        box.disable_userns = await asyncio.to_thread(
            sandbox.bwrap_supports, box.bwrap, "--disable-userns"
        )
        box.view.close()
        box.view = await asyncio.to_thread(
            sandbox.HostView.build,
            self.policy.host_paths,
            self._hidden,
            self._sandbox_dir / "empty",
            True,  # bwrap's own empty files: no host path in mountinfo
        )
        await asyncio.to_thread(box.seccomp.write)
        box.launcher = await asyncio.to_thread(launch.build, self._sandbox_dir / "bin")
        if box.launcher is not None and os.geteuid() == 0:
            # every busy workspace's overlays and network stay out of another's spawn: a
            # busy runner's spawns start from its clean namespace (clean_namespace.py)
            self._close_clean()
            view = sandbox.Detach.of(self.root).keeps(box.view.argv) or []
            self._clean = await asyncio.to_thread(
                clean_namespace.for_runner, box.launcher, self.root, view
            )
            mounts = self._mounts
            box.detach = sandbox.Detach.of(
                self.root,
                self._clean,
                lambda: mounts.mounted_count() >= clean_namespace.BUSY_MOUNTS,
            )
        box.waiter = await asyncio.to_thread(launch.compile_c, self._sandbox_dir / "bin", WARM)
        # R2 tenants: cgroups per execution inside one per workspace, or rlimits only
        box.cgroups = await asyncio.to_thread(cgroups.for_runner, self.root, self.policy)
        if box.cgroups is not None:  # groups used again wait as long as a warm sandbox
            box.cgroups.ready.pool_idle_s = warm.configured_idle_s()
        self._guard.cgroups = box.cgroups
        self._guard.uids = tenants.described(self._uids, self._ids)
        if self._environments.sharing == "copies":
            how = "copies"
        elif self._ids is not None:
            how = "hard links"
        else:  # derive.can_link: the tools run as the base's owner and could chmod a link
            how = "copies (links are not safe on a runner that is not root)"
        self._guard.base_sharing = f"{how} (SHELLYARD_BASE_SHARING={self.policy.base_sharing})"
        if "egress" in (self.policy.network, self.policy.tools_network):
            box.socat = sandbox.find_socat()
            # R2: no path of the home in the mountinfo line of its bind (own_mounts.py)
            path = self._mounts.tmpfs(self._sandbox_dir / "egress") / "egress.sock"
            self._proxy = EgressProxy(path, self.policy.egress_rules())
            await self._proxy.start()
            box.egress_socket = path
        # R2: one network per workspace (a probe of user namespaces when not root)
        if await asyncio.to_thread(netns.supported, self.policy.network):
            egress = box.egress_socket if self.policy.network == "egress" else None
            box.networks = WorkspaceNetworks(self._sandbox_dir / "netns", egress)
            box.networks.startup()
            # ports for the host, and (as root) the egress relay of each namespace
            self._relays = Relays(self._sandbox_dir / "relays", box.networks, egress, self._ids)
            self._relays.startup()

    async def aclose(self) -> None:
        """Stop watching; the sandboxes themselves keep running (E11). Every step is taken
        even when one before it failed (closing.py)."""
        await self._runs.warm.drain()  # none left half made
        running = self._runs.live_ids()  # before close forgets them
        cgroups = self._sandboxes.cgroups
        steps: tuple[closing.Step, ...] = (
            self._runs.close,
            # R2 tenants: no group left but running ones'
            lambda: asyncio.to_thread(cgroups.close, running) if cgroups is not None else None,
            self._guard.aclose,  # limits (R2, docs/limits.md)
            self._environments.aclose,
            closing.egress(self._proxy, self._mounts.unmount, self._sandbox_dir / "egress"),
            self._editor.close,
            lambda: asyncio.to_thread(self._snapshots.close),
            self._sandboxes.view.close,
            self._sandboxes.logs.close,
            self._mounts.close,
            self._close_clean,
            # detached: running sandboxes keep theirs
            lambda: asyncio.to_thread(self._prefixes.close),
            lambda: asyncio.to_thread(self._tool_mounts.close),  # a cancelled change's
            # R2: what a sandbox that runs on holds stays mounted (E11), the rest goes
            lambda: asyncio.to_thread(self._mounts.unmount_unheld),
        )
        await closing.take_every(steps)

    async def info(self) -> RunnerInfo:
        return RunnerInfo(
            runner_version=__version__,
            protocol=PROTOCOL_VERSION,
            sandbox="bubblewrap",
            network=self.policy.network,
            sandbox_uid=self._ids[0] if self._ids else os.geteuid(),
            limits=self._guard.limits_view(),  # limits (R2, docs/limits.md)
            state_id=self._runs.state_id,
        )

    # ----------------------------------------------------------------- workspaces

    def _workspace_ids(self, workspace_id: str) -> tuple[int, int]:
        """R2 tenants: the workspace's own uid, its tree given to it on first use (a workspace
        of an older runner, made as the shared uid, is migrated here). Its primary group is
        the sandbox group every workspace uid shares: the runner's folders on the way to
        what bwrap binds (workspaces, views, environments, the egress socket) grant that group
        search, one ACL entry for all of them; each workspace's own tree is 0700, so the
        shared group opens no workspace to another."""
        assert self._uids is not None and self._ids is not None
        uid, group = self._uids.uid(workspace_id), self._ids[1]
        if uid not in self._reached:
            folder_access.make_reachable(self._workspaces, uid, group)
            folder_access.make_reachable(self._homes, uid, group)
            self._reached.add(uid)
        for tree in self._paths_of(workspace_id):  # its owner and its mode, one lstat
            moved = tenants.give_and_close(tree, uid, group)
            if moved is not None:
                log.info("gave %s (%d entries) to its uid %d", tree, moved, uid)
        return uid, group

    def home_path(self, workspace_id: str) -> Path:
        """The workspace's home, owned like its tree, outside it (no snapshot holds it)."""
        home = self._paths_of(workspace_id)[1]
        if not home.is_dir():
            home.mkdir(mode=0o700, exist_ok=True)
            self._give(home, workspace_id)
        return home

    def _give(self, folder: Path, workspace_id: str) -> None:
        """A new workspace tree or home: its uid's (mounted by the first hold, own_mounts)."""
        if self._uids is not None:
            self._workspace_ids(workspace_id)
        elif self._ids is not None:
            os.chown(folder, *self._ids)

    def _close_clean(self) -> None:
        if self._clean is not None:
            self._clean.close()
            self._clean = None

    def _close_root(self, workspace_id: str) -> None:
        if self._ids is not None:  # docs/security.md "Tenants: attack pass"
            for tree in self._paths_of(workspace_id):
                tenants.close_root(tree)

    def workspace_path(self, workspace_id: str) -> Path:
        return self._paths_of(workspace_id)[0]

    async def ensure_workspace(self, workspace_id: str) -> SnapshotInfo:
        tree = self.workspace_path(workspace_id)
        if not tree.exists():
            require_room(self.root, self.policy, "a new workspace")  # not ENOSPC: inodes too
            tree.mkdir(mode=0o700)
            self._give(tree, workspace_id)
        return await asyncio.to_thread(self._snapshots.ensure_workspace, workspace_id)

    async def commit(self, workspace_id: str) -> SnapshotInfo:
        holder = self._runs.busy_workspaces.get(workspace_id)
        if holder is not None:
            raise WorkspaceBusy(
                f"workspace {workspace_id} is in use by execution {holder}; its snapshot is "
                f"committed when it ends",
                holder=holder,
            )
        return await self._commit(workspace_id)

    async def _commit(self, workspace_id: str, budget: HashBudget | None = None) -> SnapshotInfo:
        with self._mounts.held(workspace_id):  # R2: read through its overlay (own_mounts)
            self._close_root(workspace_id)  # R2 tenants: what the ended command opened
            # under the store's shared lock: a garbage collection never runs mid-commit.
            # A workspace nothing changed in is answered here, on the loop (a worker thread's
            # hop cost more CPU than the few stats, docs/benchmarks.md §36 "Thread hops").
            unchanged = self._editor.commit_if_unchanged(workspace_id)
            if unchanged is not None:
                return unchanged
            return await asyncio.to_thread(self._editor.commit, workspace_id, budget)

    async def head(self, workspace_id: str) -> SnapshotInfo:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.head, workspace_id)

    async def stat_path(self, workspace_id: str, seq: int | None, path: str) -> PathEntry | None:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(history.stat, self._snapshots, workspace_id, seq, path)

    async def read_file(
        self, workspace_id: str, seq: int | None, path: str, offset: int, limit: int
    ) -> FileChunk:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.read, workspace_id, seq, path, offset, limit)

    def _require_workspace(self, workspace_id: str) -> None:
        if not self.workspace_path(workspace_id).is_dir():
            raise NotFound(f"workspace {workspace_id} does not exist on this runner")

    # ----------------------------------------------------------------- files and history
    # Reads come from committed snapshots only (W2); writer operations end with a commit
    # (W1, W3). The logic lives in snapshots/history.py, edits/ and snapshots/objects.py.

    async def list_snapshots(self, workspace_id: str) -> list[SnapshotInfo]:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._snapshots.list_snapshots, workspace_id)

    async def list_dir(
        self,
        workspace_id: str,
        seq: int | None,
        path: str,
        recursive: bool,
        after: str | None,
        limit: int,
    ) -> DirListing:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(
            history.list_dir, self._snapshots, workspace_id, seq, path, recursive, after, limit
        )

    async def diff(
        self,
        workspace_id: str,
        from_seq: int,
        to_seq: int | None,
        path: str,
        after: str | None,
        limit: int,
    ) -> DiffResult:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(
            history.diff, self._snapshots, workspace_id, from_seq, to_seq, path, after, limit
        )

    async def read_stream(
        self, workspace_id: str, seq: int | None, path: str, offset: int, length: int | None
    ) -> ByteStream:
        self._require_workspace(workspace_id)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidInput(f"offset ({offset}) and length ({length}) must be zero or more")
        handle, entry = await asyncio.to_thread(
            history.open_file, self._snapshots, workspace_id, seq, path
        )
        start = min(offset, entry.size)
        end = entry.size if length is None else min(entry.size, start + length)
        return aiter_thread(history.read_chunks(handle, start, end))

    async def export_tar(self, workspace_id: str, seq: int | None, path: str) -> ByteStream:
        self._require_workspace(workspace_id)

        def check() -> int:
            m = history.manifest(self._snapshots, workspace_id, seq)
            history.lookup(m, path)
            return m.info.seq

        fixed = await asyncio.to_thread(check)
        return aiter_thread(history.tar_chunks(self._snapshots, workspace_id, fixed, path))

    async def write_file(
        self, workspace_id: str, path: str, data: ByteStream, mode: int | None
    ) -> EditResult:
        async with self._writers.writing(workspace_id):
            room = await asyncio.to_thread(self._writers.room_left, workspace_id)
            upload = await asyncio.to_thread(
                self._editor.begin_write, workspace_id, path, mode, room
            )
            try:
                async for chunk in coalesce(data):
                    await asyncio.to_thread(upload.write, chunk)
            except BaseException:
                await asyncio.to_thread(upload.abort)
                raise
            return await asyncio.to_thread(upload.finish)

    async def write_tar(self, workspace_id: str, path: str, data: ByteStream) -> EditResult:
        async with self._writers.writing(workspace_id):
            room = await asyncio.to_thread(self._writers.room_left, workspace_id)
            chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
            unpacking = asyncio.ensure_future(
                asyncio.to_thread(
                    self._editor.unpack,
                    workspace_id,
                    path,
                    chunks,
                    # an upload never expands past the room left under the workspace quota
                    # (R2, tarscan.py, docs/limits.md "Uploads and the quota")
                    TarLimits(max_bytes=room),
                )
            )
            try:
                async for chunk in coalesce(data):
                    await asyncio.to_thread(chunks.put, chunk)
            finally:
                await asyncio.to_thread(chunks.put, None)
            return await unpacking

    async def delete_path(self, workspace_id: str, path: str, recursive: bool) -> EditResult:
        async with self._writers.writing(workspace_id, frees=True):
            return await asyncio.to_thread(self._editor.delete, workspace_id, path, recursive)

    async def move_path(
        self, workspace_id: str, source: str, destination: str, overwrite: bool
    ) -> EditResult:
        async with self._writers.writing(workspace_id):
            return await asyncio.to_thread(
                self._editor.move, workspace_id, source, destination, overwrite
            )

    async def restore(self, workspace_id: str, seq: int, path: str) -> EditResult:
        async with self._writers.writing(workspace_id):
            return await asyncio.to_thread(self._editor.restore, workspace_id, seq, path)

    async def missing_objects(self, sha256s: list[str]) -> list[str]:
        return await asyncio.to_thread(objects.missing, self._snapshots, list(sha256s))

    async def export_objects(self, sha256s: list[str], pack_version: int = 1) -> ByteStream:
        for sha in sha256s:
            objects.check_sha(sha)
        if pack_version not in objects.PACK_VERSIONS:
            raise InvalidInput(
                f"no object pack version {pack_version}; ask for one of "
                f"{', '.join(map(str, objects.PACK_VERSIONS))}"
            )
        return aiter_thread(objects.pack_chunks(self._snapshots, list(sha256s), pack_version))

    async def import_objects(self, data: ByteStream) -> list[ObjectResult]:
        importer = PackImporter(self._snapshots)
        try:
            async for chunk in coalesce(data):
                await asyncio.to_thread(importer.feed, chunk)
        except ValueError as exc:
            importer.close()
            raise InvalidInput(f"bad object pack: {exc}") from None
        except BaseException:
            importer.close()  # a stream cut mid-object (R3): no temp file or descriptor left
            raise
        return importer.close()

    async def apply_entries(self, workspace_id: str, entries: list[ApplyEntry]) -> ApplyResult:
        async with self._writers.writing(workspace_id):
            outcomes, result = await asyncio.to_thread(
                self._editor.apply, workspace_id, list(entries)
            )
        return ApplyResult(outcomes=outcomes, snapshot=result.snapshot)

    async def prune_snapshots(self, workspace_id: str, keep: list[int]) -> PruneResult:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(history.prune, self._snapshots, workspace_id, list(keep))

    async def collect_garbage(self, grace_s: float) -> GcResult:
        if not grace_s >= 0:
            raise InvalidInput(f"grace_s must be zero or more, not {grace_s!r}")
        return await asyncio.to_thread(
            objects.collect_garbage, self._snapshots, self._store_lock, grace_s
        )

    async def prune_logs(self, request: LogPruneRequest) -> LogPruneResult:
        for execution_id in request.execution_ids:
            check_id(execution_id, "execution id")
        # Never one the runner still watches: only finished folders (result.json) go.
        ids = [e for e in request.execution_ids if not self._runs.watches(e)]
        return await asyncio.to_thread(
            retention.prune_logs,
            self._executions,
            ids,
            request.forget,
            request.free_bytes,
            request.keep_bytes,
        )

    # ----------------------------------------------------------------- executions

    async def start(self, request: StartRequest) -> RunnerExecution:
        check_id(request.execution_id, "execution id")
        if (self._executions / request.execution_id).exists():
            # E10: a retried start never spawns a second process. One that arrives while
            # the first's cold spawn is in its worker thread waits for it; a spawn that
            # failed (or was cancelled) took its folder along, nothing ran: this start goes
            # on, as it did when it could only come after that failure (with its reason,
            # not a "lost" record).
            await self._runs.spawned(request.execution_id)
            if (self._executions / request.execution_id).exists():
                return await self.status(request.execution_id)
        if (request.command is None) == (request.script_path is None):
            raise InvalidInput("give exactly one of command or script_path")
        tree = self.workspace_path(request.workspace_id)
        if not tree.is_dir():
            raise NotFound(f"workspace {request.workspace_id} does not exist on this runner")
        # W2: a read-only execution runs beside the writer, on the committed snapshot
        holder = self._runs.busy_workspaces.get(request.workspace_id)
        if holder is not None and not request.read_only:
            raise WorkspaceBusy(
                f"workspace {request.workspace_id} is in use by execution {holder}",
                holder=holder,
            )
        if request.workspace_id in self._writers.editing and not request.read_only:
            raise WorkspaceBusy(
                f"workspace {request.workspace_id} is in the middle of a file operation",
                holder="file operation",
            )
        self.home_path(request.workspace_id)  # made, then held (R2) until its end (supervise)
        self._mounts.hold(request.workspace_id)
        try:
            check_start(tree, request)  # E1 env and cwd
            command = (
                ["bash", "-c", request.command]
                if request.command is not None
                else [*script_argv(tree, request.script_path or ""), *request.args]
            )
            mount = (
                self._environments.mount(request.environment_id)
                if request.environment_id is not None
                else None
            )
            used: dict[str, object] = {}
            if request.environment_id is None:
                used, mount = bases.default_for_command()
            require_room(self.root, self.policy, "a new execution")  # limits (R2)
            started = await self._runs.launch(request, tree, command, mount)
        except BaseException:
            if not self._runs.watches(request.execution_id):  # else its _finish lets go
                self._mounts.let_go(request.workspace_id)
            raise
        return started.model_copy(update=used) if used else started

    async def status(self, execution_id: str) -> RunnerExecution:
        return await self._runs.status(execution_id)

    async def wait(self, execution_id: str, timeout_s: float) -> RunnerExecution:
        return await self._runs.wait(execution_id, timeout_s)

    async def cancel(self, execution_id: str) -> RunnerExecution:
        return await self._runs.cancel(execution_id)

    async def log_size(self, execution_id: str, stream: LogStream) -> int:
        return await self._runs.log_size(execution_id, stream)

    async def read_log(
        self, execution_id: str, stream: LogStream, offset: int, limit: int
    ) -> LogChunk:
        return await self._runs.read_log(execution_id, stream, offset, limit)

    # ----------------------------------------------------------------- environments (V1–V8)

    async def environment_change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        self._runs.warm.discard_environment(request.environment_id)  # V5: none keeps the old
        return await self._environments.change(request)

    async def environment_change_status(self, change_id: str) -> EnvironmentChange:
        return await self._environments.status(change_id)

    async def environment_change_wait(self, change_id: str, timeout_s: float) -> EnvironmentChange:
        return await self._environments.wait(change_id, timeout_s)

    # ----------------------------------------------------------------- ports (R5)

    def _port_relays(self) -> Relays:
        if self._relays is None:
            raise InvalidInput(
                f"this runner gives workspaces no network of their own to forward into "
                f"(network {self.policy.network!r}"
                + (
                    ": a server already listens on the host's own network"
                    if self.policy.network == "host"
                    else ", and this host lets the runner's user make no network namespace: "
                    "docs/decisions.md"
                )
                + ")"
            )
        return self._relays

    async def open_port(self, workspace_id: str, port: int, host_port: int) -> PortView:
        self._require_workspace(workspace_id)
        return await asyncio.to_thread(self._port_relays().open, workspace_id, port, host_port)

    async def list_ports(self, workspace_id: str | None) -> list[PortView]:
        if self._relays is None:
            return []
        return await asyncio.to_thread(self._relays.forwards, workspace_id)

    async def close_port(self, workspace_id: str, port: int) -> PortView:
        return await asyncio.to_thread(self._port_relays().close, workspace_id, port)

    async def environment_info(self, environment_id: str) -> EnvironmentInfo:
        return await self._environments.info(environment_id)
