"""The runner's managed environments (V1–V8): prefixes, changes, journal and rollback.

On disk, under ``<runner root>/environments``::

    <env_id>/prefix/          the prefix; executions mount it read-only at its ``built-at``
    <env_id>/env.json         language and the ``base`` records of ``create``: it exists = the
                              environment exists
    <env_id>/journal.json     while a change runs: change id, request, base snapshot, tool pids
    <env_id>/lock             flock'd by the process running a change of this environment
    changes/<change_id>.json  the change's record (running, then succeeded or failed)
    changes/<change_id>/      its tool log (``log``) and, while it runs, its ``scratch`` folder
    cache/                    package caches shared by every change (uv's, rattler's, ...)
    store/                    a SnapshotStore: each prefix committed, the environment id as
                              its workspace id; the base a failed change is rolled back to
    staging/                  the Editor's temp files (a rollback writes through it)

How a change is made safe (V8, docs/environments.md): the prefix is committed before the
change (normally a no-op walk: nothing else writes it), the journal is written, the manager
runs, and on success the prefix is committed again, the record written, the journal dropped.
On failure — or at startup, for a journal without a succeeded record — leftover tools are
killed and the prefix is rolled back by committing what is there and restoring the base
snapshot with ``Editor.restore`` (files the change added are deleted, changed and deleted ones
come back with their modes); a rollback cut short is simply run again (recovery.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shellyard import filemodes
from shellyard.errors import Conflict, InvalidInput, NotFound, ShellyardError
from shellyard.runner.edits.editor import Editor
from shellyard.runner.environments import create, derive, recovery, seen, sources
from shellyard.runner.environments.managers import MANAGERS
from shellyard.runner.environments.managers.base import ManagerContext, ManagerError
from shellyard.runner.environments.managers.readers import Readers
from shellyard.runner.environments.recovery import (
    ENV_FILE,
    INTERRUPTED,
    JOURNAL_FILE,
    RESERVED,
    TOOLS_OWN,
    interrupted,
    try_lock,
    write_atomic,
)
from shellyard.runner.environments.tools import (
    SandboxedTools,
    fresh_private,
    give_to_tools,
    kill_recorded,
    tool_ids,
)
from shellyard.runner.limits import reserve
from shellyard.runner.protocol import (
    EnvChangeState,
    EnvErrorKind,
    EnvironmentChange,
    EnvironmentChangeRequest,
    EnvironmentInfo,
    PackageRecord,
    SandboxPolicy,
)
from shellyard.runner.sandbox import folder_access, launch
from shellyard.runner.sandbox.spawn import Sandboxes
from shellyard.runner.sandbox.tool_groups import ToolGroups
from shellyard.runner.snapshots import history, objects
from shellyard.runner.snapshots.objects import StoreLock
from shellyard.runner.snapshots.store import SnapshotStore

log = logging.getLogger(__name__)

#: An environment's own folders beside its prefix: the running change's scratch and the
#: package caches only its changes use (docs/environments.md, "Caches").
SCRATCH = "scratch"
CACHE = "cache"
#: Managers whose every write is a tool's (all: conda's rattler runs in a tool sandbox too).
TOOLS_ONLY = frozenset({"conda", "pip", "cran", "bioconductor"})
#: A change's tools are killed after this long (a hung download must not hold the prefix).
DEFAULT_TOOL_TIMEOUT_S = 3600.0
#: How long ``aclose`` lets running changes roll back before abandoning them to recovery.
CLOSE_GRACE_S = 20.0
#: Unreferenced objects younger than this survive a collection: a commit of another
#: environment may have written them and not yet its manifest.
GC_GRACE_S = 600.0


@dataclass
class _Running:
    request: EnvironmentChangeRequest
    record: EnvironmentChange
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tools: SandboxedTools | None = None
    task: asyncio.Task[None] | None = None
    #: local sources as resolved → as the request named them (sources.Checked)
    origins: dict[str, str] = field(default_factory=dict)
    #: R2: the hold on the asking workspace's folders, let go when the change ends
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    #: the readers of the sources it names (as the workspace's uid), killed with its tools
    readers: Readers = field(default_factory=Readers)

    def stop(self) -> None:
        """Kill the change's tools and readers and start no other (abandoned or failed)."""
        if self.tools is not None:
            self.tools.kill_all()
        self.readers.kill_all()


class EnvironmentStore:
    """The environments of one LocalRunner. ``users(env_id)`` names the running executions
    that use an environment (a change is refused while there are any)."""

    def __init__(
        self,
        root: Path,
        policy: SandboxPolicy,
        *,
        sandboxes: Sandboxes,
        users: Callable[[str], list[str]],
        tool_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        workspace_path: Callable[[str], Path] | None = None,
    ) -> None:
        self.root = root
        self._workspace_path = workspace_path
        self._sources = sources.parse(policy.allowed_sources, policy.packages_offline)
        self.policy = policy
        #: copies or hard links of a base's files (``SHELLYARD_BASE_SHARING``, derive.py)
        self.sharing = derive.sharing(policy)
        self._sandboxes = sandboxes
        self._users = users
        self._tool_timeout_s = tool_timeout_s
        self._changes = root / "changes"
        self._cache = root / "cache"
        #: local wheels and sdists an install used, by sha256 (managers/wheels.py)
        self._wheels = root / "wheels"
        self._store = SnapshotStore(root / "store")
        self._lock = StoreLock(root / "store")
        self._editor = Editor(self._store, self._lock, root / "staging", None, self.prefix)
        self._running: dict[str, _Running] = {}
        #: environment id → the change running on it
        self._by_env: dict[str, str] = {}
        #: environments whose rollback failed at startup: refused until an operator looks
        self._broken: dict[str, str] = {}
        #: environment id → the commit that follows a successful change (see ``_settle``)
        self._settling: dict[str, asyncio.Task[None]] = {}
        self._bwrap = ""
        self._closing = False
        self.hold: Callable[[str], contextlib.AbstractContextManager[None]] | None = None  # R2

    # ----------------------------------------------------------------- paths

    def env_dir(self, environment_id: str) -> Path:
        _check_id(environment_id, "environment id")
        if environment_id in RESERVED:
            raise InvalidInput(
                f"{environment_id!r} is reserved on the runner; choose another environment id"
            )
        return self.root / environment_id

    def prefix(self, environment_id: str) -> Path:
        return self.env_dir(environment_id) / "prefix"

    def exists(self, environment_id: str) -> bool:
        return (self.env_dir(environment_id) / ENV_FILE).is_file()

    # ----------------------------------------------------------------- lifecycle

    async def startup(self, bwrap: str) -> None:
        self._bwrap = bwrap
        # The sandbox uid walks through to each prefix: the runner adds its search entry
        # (sandbox/folder_access.py); nobody else passes, nobody lists the others
        # (filemodes.py).
        filemodes.private_dir(self.root)
        self._changes.mkdir(mode=0o700, exist_ok=True)
        # Runner-side stores, root's alone: the snapshots of prefixes and the local packages
        # installs used (their files are 0444/0400; no other local user reads them).
        for private in (self.root / "store", self._wheels, self.root / "verified"):
            private.mkdir(mode=0o700, exist_ok=True)
            private.chmod(0o700)
        # The cache every change once shared (and wrote): no install reads it any more.
        await asyncio.to_thread(shutil.rmtree, self._cache, True)
        await asyncio.to_thread(self._editor.startup)
        await asyncio.to_thread(self._recover)
        if self.sharing == "copies":  # links mode keeps what an older release linked
            await asyncio.to_thread(recovery.unshare_all, self.root)

    async def aclose(self) -> None:
        """Stop: kill running tools and let their changes roll back (a change that does not
        finish in time is left to the next startup's recovery, as after a crash)."""
        self._closing = True
        for running in self._running.values():
            running.stop()
        tasks = [r.task for r in self._running.values() if r.task is not None]
        tasks += self._settling.values()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
            for task in pending:
                task.cancel()
        self._editor.close()
        await asyncio.to_thread(self._store.close)

    # ----------------------------------------------------------------- the protocol

    async def change(self, request: EnvironmentChangeRequest) -> EnvironmentChange:
        _check_id(request.change_id, "change id")
        env_dir = self.env_dir(request.environment_id)
        known = self._known(request.change_id)
        if known is not None:
            if (known.environment_id, known.action) != (request.environment_id, request.action):
                raise InvalidInput(
                    f"change id {request.change_id} was already used for a {known.action} of "
                    f"environment {known.environment_id}; use a new change id"
                )
            return known
        # R2: its workspace read through the overlay, checks to end, never unmounted midway
        with contextlib.ExitStack() as stack:
            if (workspace := sources.named_workspace(request)) and self.hold is not None:
                stack.enter_context(self.hold(workspace))
            checked = self._validate(request)
            request = checked.request
            holder = self._by_env.get(request.environment_id)
            if holder is not None:
                raise Conflict(
                    f"environment {request.environment_id} is being changed by change {holder}; "
                    f"wait for it to end, then try again",
                    change_id=holder,
                )
            users = self._users(request.environment_id)
            if users:
                raise Conflict(
                    f"environment {request.environment_id} is in use by running executions "
                    f"{', '.join(sorted(users))}; a change waits until they end",
                    executions=sorted(users),
                )
            if (env_dir / JOURNAL_FILE).exists():
                raise ShellyardError(
                    f"environment {request.environment_id} could not be rolled back after an "
                    f"interrupted change ({self._broken.get(request.environment_id, 'see the log')}"
                    f"); restart the runner to retry the rollback"
                )
            record = EnvironmentChange(
                change_id=request.change_id,
                environment_id=request.environment_id,
                action=request.action,
                state=EnvChangeState.running,
                progress="starting",
                started_at=time.time(),
            )
            self._save_record(record)
            held = stack.pop_all()  # from here, the change's own (``_run`` lets it go)
        running = _Running(
            request=request,
            record=record,
            origins=checked.origins,
            held=held,
            readers=Readers(stall_s=self.policy.source_stall_s),
        )
        self._running[request.change_id] = running
        self._by_env[request.environment_id] = request.change_id
        running.task = asyncio.ensure_future(self._run(running))
        return record.model_copy()

    async def status(self, change_id: str) -> EnvironmentChange:
        _check_id(change_id, "change id")
        known = self._known(change_id)
        if known is not None:
            return known
        return EnvironmentChange(
            change_id=change_id,
            environment_id="",
            action="install",  # unknown: the field is required, the state says it all
            state=EnvChangeState.lost,
            error=f"this runner holds no trace of environment change {change_id}",
        )

    async def wait(self, change_id: str, timeout_s: float) -> EnvironmentChange:
        running = self._running.get(change_id)
        if running is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(running.done.wait(), timeout=max(0.0, timeout_s))
        return await self.status(change_id)

    async def info(self, environment_id: str) -> EnvironmentInfo:
        mount = seen.mount(self.prefix(environment_id))  # V4: as a command sees it
        return EnvironmentInfo(
            environment_id=environment_id,
            language=self._meta(environment_id)["language"],
            prefix=str(mount.prefix),
            mounted_at=str(mount.seen),
            env=mount.variables,
            changing=environment_id in self._by_env,
        )

    def mount(self, environment_id: str) -> seen.Mount:
        """For an execution about to start (V4): the prefix to bind read-only and the
        variables to set. Refused while the environment is missing or changing."""
        if not self.exists(environment_id):
            raise Conflict(
                f"environment {environment_id} does not exist on this runner (never created, "
                f"or its creation failed); create it, or use an environment of this runner",
                environment_id=environment_id,
            )
        if (holder := self._by_env.get(environment_id)) is not None:
            raise Conflict(
                f"environment {environment_id} is being changed by change {holder}; the "
                f"execution can start once the change has ended",
                environment_id=environment_id,
                change_id=holder,
            )
        return seen.mount(self.prefix(environment_id))

    # ----------------------------------------------------------------- checks and records

    def _validate(self, request: EnvironmentChangeRequest) -> sources.Checked:
        env_id = request.environment_id
        if request.action == "create":
            if request.language not in ("python", "r"):
                raise InvalidInput(
                    f"create needs language 'python' or 'r', not {request.language!r}"
                )
            if self.exists(env_id):
                raise InvalidInput(
                    f"environment {env_id} already exists on this runner; install into it, "
                    f"or create another environment id"
                )
            if request.base is not None:
                if request.language != "python":
                    raise InvalidInput(f"{request.base} is a python base; create with language "
                                       f"'python' to start from it")  # fmt: skip
                try:
                    derive.resolve(request.base)
                except ManagerError as exc:
                    raise NotFound(exc.message) from None
            return sources.Checked(request)
        if not self.exists(env_id):
            raise NotFound(
                f"environment {env_id} does not exist on this runner; create it first",
                environment_id=env_id,
            )
        if request.manager is None or request.manager not in MANAGERS:
            raise InvalidInput(
                f"unknown package manager {request.manager!r}; use one of {', '.join(MANAGERS)}"
            )
        if not request.specs:
            raise InvalidInput(f"{request.action} needs at least one package spec")
        workspace = None
        if request.workspace_id is not None and self._workspace_path is not None:
            workspace = self._workspace_path(request.workspace_id)
        # docs/environments.md: the operator's allowed sources, before anything is written (V8)
        return sources.check_request(
            self._sources, request, runner_root=self.root.parent, workspace=workspace
        )

    def _known(self, change_id: str) -> EnvironmentChange | None:
        running = self._running.get(change_id)
        if running is not None:
            return running.record.model_copy()
        path = self._changes / f"{change_id}.json"
        try:
            return EnvironmentChange.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None

    def _save_record(self, record: EnvironmentChange) -> None:
        write_atomic(self._changes / f"{record.change_id}.json", record.model_dump_json())

    def _meta(self, environment_id: str) -> dict[str, Any]:
        try:
            meta: dict[str, Any] = json.loads((self.env_dir(environment_id) / ENV_FILE).read_text())
        except FileNotFoundError:
            raise NotFound(
                f"environment {environment_id} does not exist on this runner",
                environment_id=environment_id,
            ) from None
        return meta

    # ----------------------------------------------------------------- running a change

    async def _run(self, running: _Running) -> None:
        request, record = running.request, running.record
        env_id = request.environment_id
        env_dir = self.env_dir(env_id)
        prefix = env_dir / "prefix"
        change_dir = self._changes / request.change_id
        # Beside the prefix, where the tools' uid can reach them (env_dir is 0711), each the
        # environment's own: one change runs at a time (the lock), and no other environment's
        # build writes this cache (docs/environments.md, "Caches").
        scratch = env_dir / SCRATCH
        cache = env_dir / CACHE
        ids = tool_ids(self._sandboxes)
        reader = self._sandboxes.ids_of(request.workspace_id) if request.workspace_id else ids
        journal: dict[str, Any] = {
            "change_id": request.change_id,
            "request": request.model_dump(mode="json"),
            "base_seq": None,
            "pids": [],
        }
        journal_written = False
        lock_fd: int | None = None

        def on_spawn(pid: int, started: int) -> None:
            journal["pids"].append([pid, started])
            if journal_written:
                write_atomic(env_dir / JOURNAL_FILE, json.dumps(journal))

        def progress(line: str) -> None:
            record.progress = line

        failure: tuple[EnvErrorKind, str] | None = None
        rolled_back = True
        succeeded = False
        try:
            change_dir.mkdir(mode=0o700, exist_ok=True)
            filemodes.private_dir(env_dir)
            if self._sandboxes.ids is not None:  # bwrap, as the sandbox uid, binds the prefix
                folder_access.grant_folder(env_dir, *self._sandboxes.ids)
            lock_fd = try_lock(env_dir)
            if lock_fd is None:
                raise ShellyardError(
                    f"another process holds environment {env_id}'s lock; is a second runner "
                    f"using this runner's folder?"
                )
            await asyncio.to_thread(fresh_private, scratch, cache, ids)
            tools = SandboxedTools(
                sandboxes=self._sandboxes,
                prefix=prefix,
                cache=cache,
                scratch=scratch,
                log_path=change_dir / "log",
                base_env={},
                on_spawn=on_spawn,
                timeout_s=self._tool_timeout_s,
                groups=ToolGroups.of(self._sandboxes.cgroups, request),
                seen=seen.settle(prefix, fresh=request.action == "create"),  # V4
            )
            running.tools = tools
            running.readers.front = launch.prefix(
                self._sandboxes.launcher, network=None, ids=reader, limits=()
            )
            ctx = ManagerContext(
                prefix=prefix,
                scratch=scratch,
                cache=cache,
                progress=progress,
                run_tool=tools,
                origins=running.origins,
                wheels=self._wheels,
                verified=self.root / "verified",
                # Sources the agent named are read as its workspace's uid (docs/security.md).
                read_as=running.readers,
                inside=tools.places.inside,
                room=lambda what: reserve.require_room(prefix.parent, self.policy, what),
            )
            if request.action == "create":
                if prefix.exists():  # what an earlier failed create of this id left
                    await asyncio.to_thread(shutil.rmtree, prefix)
                write_atomic(env_dir / JOURNAL_FILE, json.dumps(journal))
                journal_written = True
                prefix.mkdir(mode=0o755)
                prefix.chmod(0o755)
                await asyncio.to_thread(give_to_tools, prefix, ids)
                if request.base is not None:
                    base = await derive.create(ctx, request.base, self._room(prefix), self.sharing)
                else:
                    base = await create.create(ctx, request)
                # what the runner made as root (a derived prefix's folders and copies, the
                # venv's copy of uv) becomes the tools' too
                await asyncio.to_thread(give_to_tools, prefix, ids)
            else:
                settling = self._settling.pop(env_id, None)
                if settling is not None:
                    progress("waiting for the previous change's commit")
                    await asyncio.wait([settling])
                progress("checking the prefix")
                head = await asyncio.to_thread(self._editor.commit, env_id)
                if head.new:  # the last change's commit had not run (a restart since)
                    log.info("environment %s committed as seq %s", env_id, head.seq)
                journal["base_seq"] = head.seq
                write_atomic(env_dir / JOURNAL_FILE, json.dumps(journal))
                journal_written = True
                base = [PackageRecord(**p) for p in self._meta(env_id).get("base", [])]
                # what the runner wrote as root (a rollback's restores, conda of older runners) and
                # prefixes of older runners become the tools' (none of a base's files); the
                # marker says the last change left nothing of root's (a walk of a large
                # prefix is a second on a loaded machine)
                owned = env_dir / TOOLS_OWN
                if not owned.exists():
                    await asyncio.to_thread(give_to_tools, prefix, ids)
                owned.unlink(missing_ok=True)
                await MANAGERS[str(request.manager)].apply(ctx, request)
            ctx.env = seen.prefix_variables(prefix)
            progress("listing the packages")
            packages = base + await self._packages(ctx)
            if request.action == "create":
                meta = {
                    "environment_id": env_id,
                    "language": request.language,
                    "from_base": request.base,
                    "created_at": time.time(),
                    "created_by": request.change_id,
                    "base": [p.model_dump(mode="json") for p in base],
                }
                write_atomic(env_dir / ENV_FILE, json.dumps(meta))
            if request.action == "create" or request.manager in TOOLS_ONLY:  # nothing to own
                write_atomic(env_dir / TOOLS_OWN, "")
            record.packages = packages
            record.state = EnvChangeState.succeeded
            record.progress = "done"
            record.finished_at = time.time()
            self._save_record(record)
            succeeded = True
        except asyncio.CancelledError:
            # Abandoned at close: the journal stays, the next startup rolls back.
            running.stop()
            rolled_back = False
            raise
        except ManagerError as exc:
            failure = (exc.kind, sources.unresolve(exc.message, running.origins))
        except ShellyardError as exc:
            failure = ("failed", sources.unresolve(exc.message, running.origins))
        except Exception as exc:
            log.exception("environment change %s failed", request.change_id)
            failure = ("failed", f"{type(exc).__name__}: {exc}")
        finally:
            if failure is not None:
                rolled_back = await self._fail(running, journal, journal_written, failure)
            if journal_written and rolled_back:
                with contextlib.suppress(FileNotFoundError):
                    (env_dir / JOURNAL_FILE).unlink()
            if lock_fd is not None:
                os.close(lock_fd)
            await asyncio.to_thread(shutil.rmtree, scratch, True)
            if succeeded and not self._closing:
                self._settling[env_id] = asyncio.ensure_future(self._settle(env_id))
            self._running.pop(request.change_id, None)
            if self._by_env.get(env_id) == request.change_id:
                del self._by_env[env_id]
            running.held.close()
            running.done.set()

    async def _fail(
        self,
        running: _Running,
        journal: dict[str, Any],
        journal_written: bool,
        failure: tuple[EnvErrorKind, str],
    ) -> bool:
        """Kill the change's tools, roll the prefix back, record the failure. False when the
        rollback itself failed (the journal then stays for the next startup)."""
        record = running.record
        kind, message = failure
        if running.tools is not None:  # R2 tenants: the limit that stopped a tool, first
            message = running.tools.groups.explain(message)
        if self._closing:
            kind, message = "interrupted", f"{INTERRUPTED} ({message})"
        running.stop()
        rolled_back = True
        if journal_written:
            record.progress = "rolling back"
            try:
                await asyncio.to_thread(self._rollback, journal)
            except Exception as exc:
                log.exception("rollback of environment change %s failed", record.change_id)
                self._broken[record.environment_id] = str(exc)
                message += f" (rolling the prefix back failed too: {exc}; it is retried when "
                message += "the runner restarts)"
                rolled_back = False
        record.state = EnvChangeState.failed
        record.error = message
        record.error_kind = kind
        record.progress = "failed"
        record.finished_at = time.time()
        self._save_record(record)
        return rolled_back

    async def _settle(self, environment_id: str) -> None:
        """After a success: commit the new prefix (the next change's rollback base), then drop
        the older snapshots and the objects only they named. Off the change's path because
        the commit reads every new file (measured: 0.46 s for numpy's 57 MB, as long as uv's
        install itself); the next change of the environment waits for it, and if the runner
        dies first that change's own commit-before-change does the same work."""
        try:
            head = await asyncio.to_thread(self._editor.commit, environment_id)
            await asyncio.to_thread(history.prune, self._store, environment_id, [head.seq])
            await asyncio.to_thread(objects.collect_garbage, self._store, self._lock, GC_GRACE_S)
        except Exception:
            log.exception("committing environment %s after its change failed", environment_id)

    async def _packages(self, ctx: ManagerContext) -> list[PackageRecord]:
        """The full package state (V2): every manager's view of the prefix, in turn."""
        out: list[PackageRecord] = []
        for manager in MANAGERS.values():
            out += await manager.packages(ctx)
        return out

    # ----------------------------------------------------------------- rollback, recovery

    def _rollback(self, journal: dict[str, Any]) -> None:
        """Make the prefix what it was before the change (synchronous; re-runnable)."""
        recovery.rollback(self._editor, self._store, self.env_dir, journal)

    def _recover(self) -> None:
        """Startup: finish what a dead runner left. A journal without a succeeded record is
        a change that was cut short: kill its tools, roll back, record ``interrupted``."""
        for env_dir in sorted(self.root.iterdir()):
            if env_dir.name in RESERVED or not (env_dir / JOURNAL_FILE).is_file():
                continue
            lock_fd = try_lock(env_dir)
            if lock_fd is None:
                log.warning("environment %s is locked by another process", env_dir.name)
                continue
            try:
                self._recover_one(env_dir)
            except Exception as exc:
                log.exception("recovering environment %s failed", env_dir.name)
                self._broken[env_dir.name] = str(exc)
            finally:
                os.close(lock_fd)
        for path in sorted(self._changes.glob("*.json")):
            record = EnvironmentChange.model_validate_json(path.read_text())
            if record.state == EnvChangeState.running:
                # Cut short before its journal was written: the prefix was never touched.
                self._save_record(interrupted(record))
            shutil.rmtree(self._changes / record.change_id / "scratch", ignore_errors=True)
            shutil.rmtree(self.root / record.environment_id / SCRATCH, ignore_errors=True)

    def _room(self, prefix: Path) -> Callable[[], None]:
        """Raises ``LowOnSpace`` while the prefix's volume is below the free-space reserve."""
        policy = self._sandboxes.policy

        def check() -> None:
            reserve.require_room(prefix.parent, policy, "copying the base into the environment")

        return check

    def _recover_one(self, env_dir: Path) -> None:
        journal = json.loads((env_dir / JOURNAL_FILE).read_text())
        kill_recorded([list(p) for p in journal.get("pids", [])])
        change_id = str(journal["change_id"])
        record = self._known(change_id)
        if record is None or record.state != EnvChangeState.succeeded:
            self._rollback(journal)
            if record is None:
                request = EnvironmentChangeRequest.model_validate(journal["request"])
                record = EnvironmentChange(
                    change_id=change_id,
                    environment_id=request.environment_id,
                    action=request.action,
                    state=EnvChangeState.running,
                )
            if record.state == EnvChangeState.running:
                self._save_record(interrupted(record))
        (env_dir / JOURNAL_FILE).unlink()


def _check_id(value: str, what: str) -> None:
    if (
        not value
        or len(value) > 128
        or not value[0].isalnum()
        or not all(ch.isalnum() or ch in "-_" for ch in value)
    ):
        raise InvalidInput(f"invalid {what} {value!r}: use letters, digits, '-' and '_'")
