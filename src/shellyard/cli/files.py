"""CLI verbs of workspace files, snapshot history, transfers and artifacts:
``shellyard files ls|cat|get|put|rm|mv|diff|history|restore|gc``, ``shellyard transfer
discover|start|list|status|files|cancel``, ``shellyard artifact declare|list|get``. Each takes
``--json``; uploads, downloads and transfers show a progress bar on a terminal. ``cli.py``
calls ``register``."""

from __future__ import annotations

import json
import queue
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from shellyard.cli.common import HomeOption, JsonOption, err, fail, out, show
from shellyard.cli.common import print_json as _json
from shellyard.cli.manual import EXIT_FAILED
from shellyard.config import default_home
from shellyard.errors import InvalidInput, ShellyardError

files_app = typer.Typer(
    help=(
        "Workspace files as committed in snapshots: list, read, download, upload, delete, move; "
        "history, diff, restore; retention."
    ),
    no_args_is_help=True,
)
transfer_app = typer.Typer(
    help="Copy files between workspaces (yours on every runner, your parent's, your children's).",
    no_args_is_help=True,
)
artifact_app = typer.Typer(help="Deliverable files (artifacts).", no_args_is_help=True)

AgentOption = Annotated[
    str | None,
    typer.Option("--agent", envvar="SHELLYARD_AGENT", help="Act for this agent."),
]
WorkspaceOption = Annotated[
    str | None, typer.Option("--workspace", "-w", help="A workspace id (default: yours).")
]
RunnerOption = Annotated[
    str | None, typer.Option("--runner", help="Your workspace on this runner (default: local).")
]
SeqOption = Annotated[
    int | None, typer.Option("--seq", help="A snapshot number (default: the latest).")
]
QueueOption = Annotated[
    bool, typer.Option("--queue", help="Wait for the workspace's writer instead of failing.")
]


def register(app: typer.Typer) -> None:
    app.add_typer(files_app, name="files")
    app.add_typer(transfer_app, name="transfer")
    app.add_typer(artifact_app, name="artifact")


def _run(home: Path | None, agent: str | None, action: Callable[[Any], Any]) -> Any:
    from shellyard.sdk.client import Client

    try:
        with Client.for_home(home or default_home(), agent_id=agent) as client:
            return action(client)
    except ShellyardError as exc:
        fail(exc)


def _where(workspace: str | None, runner: str | None) -> dict[str, Any]:
    return {"workspace_id": workspace, "runner_id": runner}


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def _counted(chunks: Iterable[bytes], progress: Progress, task: Any) -> Iterator[bytes]:
    for chunk in chunks:
        progress.update(task, advance=len(chunk))
        yield chunk


def _edit_summary(edit: Any, as_json: bool) -> None:
    if as_json:
        _json(edit)
        return
    state = "new snapshot" if edit.new_snapshot else "unchanged, snapshot"
    out.print(f"{state} {edit.snapshot_seq} of {edit.workspace_id}", highlight=False)


# ---------------------------------------------------------------------- files: reads


@files_app.command("ls")
def files_ls(
    path: Annotated[str, typer.Argument()] = "",
    recursive: Annotated[bool, typer.Option("--recursive", "-r")] = False,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    seq: SeqOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a folder as committed (every page of it)."""

    def listing(client: Any) -> list[Any]:
        entries: list[Any] = []
        after = None
        while True:
            page = client.list_files(
                path, recursive=recursive, seq=seq, after=after, **_where(workspace, runner)
            )
            entries += page.entries
            if page.next_after is None:
                return entries
            after = page.next_after

    entries = _run(home, agent, listing)
    if as_json:
        _json(entries)
        return
    table = Table("path", "kind", "size", "mode", box=None)
    for e in entries:
        name = e.path + ("/" if e.kind == "dir" else f" -> {e.target}" if e.target else "")
        table.add_row(name, e.kind, str(e.size) if e.kind == "file" else "", oct(e.mode))
    out.print(table)


@files_app.command("cat")
def files_cat(
    path: str,
    offset: int = 0,
    length: Annotated[int | None, typer.Option(help="Bytes to read (default: to the end).")] = None,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    seq: SeqOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one page (up to --length or 1 MiB) as JSON: text or base64."
        ),
    ] = False,
) -> None:
    """Write a file's committed bytes to stdout (streamed)."""

    def cat(client: Any) -> None:
        if as_json:
            limit = min(length or 1 << 20, 1 << 20)
            where = _where(workspace, runner)
            _json(client.read_text(path, seq=seq, offset=offset, limit=limit, **where))
            return
        for chunk in client.iter_file(
            path, seq=seq, offset=offset, length=length, **_where(workspace, runner)
        ):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    _run(home, agent, cat)


@files_app.command("get")
def files_get(
    path: str,
    dest: Annotated[Path | None, typer.Argument(help="Where to write (default: its name).")] = None,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    seq: SeqOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was written as JSON on stdout.")
    ] = False,
) -> None:
    """Download a file, or a folder (unpacked into DEST, or kept as a tar if DEST ends .tar)."""

    def get(client: Any) -> dict[str, Any]:
        entry = client.stat(path, seq=seq, **_where(workspace, runner))
        name = entry.path.rsplit("/", 1)[-1] or "workspace"
        target = dest or Path(name)
        with _progress() as progress:
            if entry.kind == "file":
                task = progress.add_task(f"get {name}", total=entry.size)
                chunks = client.iter_file(path, seq=seq, **_where(workspace, runner))
                with open(target, "wb") as handle:
                    for chunk in _counted(chunks, progress, task):
                        handle.write(chunk)
                return {"path": str(target), "kind": "file", "size": entry.size}
            task = progress.add_task(f"get {name}/", total=None)
            chunks = _counted(
                client.iter_archive(path, seq=seq, **_where(workspace, runner)), progress, task
            )
            if str(target).endswith(".tar"):
                with open(target, "wb") as handle:
                    for chunk in chunks:
                        handle.write(chunk)
                return {"path": str(target), "kind": "tar"}
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=_IterReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    # members are named below the folder's own name: unpack them into DEST
                    inner = member.name.partition("/")[2] if entry.path else member.name
                    if not inner:
                        continue
                    member.name = inner
                    tar.extract(member, target, filter="data")
            return {"path": str(target), "kind": "dir"}

    _wrote(_run(home, agent, get), as_json)


@files_app.command("history")
def files_history(
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every snapshot of a workspace with what made it."""
    history = _run(home, agent, lambda c: c.history(**_where(workspace, runner)))
    if as_json:
        _json(history)
        return
    table = Table("seq", "made by", "files", "bytes", "created", "retained", box=None)
    for s in history.snapshots:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at or 0))
        made = f"{s.made_by_kind} {s.made_by_id or ''}".strip()
        table.add_row(
            str(s.seq), made, str(s.files), str(s.bytes), when, "yes" if s.retained else "no"
        )
    out.print(f"workspace {history.workspace_id} on {history.runner_id}, head {history.head_seq}")
    out.print(table)


@files_app.command("diff")
def files_diff(
    from_seq: int,
    to_seq: Annotated[int | None, typer.Argument(help="Default: the latest.")] = None,
    path: Annotated[str, typer.Option("--path", help="Only below this folder.")] = "",
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """What changed between two snapshots."""

    def diff(client: Any) -> list[Any]:
        changes: list[Any] = []
        after = None
        while True:
            page = client.diff(from_seq, to_seq, path, after=after, **_where(workspace, runner))
            changes += page.changes
            if page.next_after is None:
                return changes
            after = page.next_after

    changes = _run(home, agent, diff)
    if as_json:
        _json(changes)
        return
    sign = {"added": "+", "removed": "-", "changed": "~"}
    for c in changes:
        detail = c.kind
        if c.kind == "file" or c.old_kind == "file":
            old = "" if c.old_size is None else f"{c.old_size} B"
            new = "" if c.new_size is None else f"{c.new_size} B"
            changed = f", {old or '-'} -> {new or '-'}"
            detail += changed if c.change == "changed" else f", {old or new}"
        out.print(f"{sign[c.change]} {c.path}  ({detail})", highlight=False)


# ---------------------------------------------------------------------- files: writes


@files_app.command("put")
def files_put(
    source: Annotated[Path, typer.Argument(help="A local file or folder ('-' for stdin).")],
    path: Annotated[str | None, typer.Argument(help="Where in the workspace.")] = None,
    mode: Annotated[str | None, typer.Option(help="Permission bits, octal (e.g. 755).")] = None,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    queue_: QueueOption = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Upload a file (streamed, any size) or a folder (as one tar stream): a writer operation
    that ends with a snapshot."""
    try:
        bits = int(mode, 8) if mode is not None else None
    except ValueError:
        fail(InvalidInput(f"--mode must be octal permission bits such as 644, not {mode!r}"))
    where = {**_where(workspace, runner), "queue": queue_}

    def put(client: Any) -> Any:
        with _progress() as progress:
            if str(source) == "-":
                return client.write_file(path or "stdin", sys.stdin.buffer, mode=bits, **where)
            if source.is_dir():
                task = progress.add_task(f"put {source.name}/", total=_tree_size(source))
                chunks = _counted(_tar_chunks(source), progress, task)
                return client.upload_archive(chunks, path or source.name, **where)
            if not source.is_file():
                raise InvalidInput(f"{source} is not a file or folder on this machine")
            task = progress.add_task(f"put {source.name}", total=source.stat().st_size)
            with open(source, "rb") as handle:
                chunks = _counted(_read_chunks(handle), progress, task)
                return client.write_file(path or source.name, chunks, mode=bits, **where)

    _edit_summary(_run(home, agent, put), as_json)


@files_app.command("rm")
def files_rm(
    path: str,
    recursive: Annotated[bool, typer.Option("--recursive", "-r")] = False,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    queue_: QueueOption = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a file or (with -r) a folder."""
    where = {**_where(workspace, runner), "queue": queue_}
    _edit_summary(
        _run(home, agent, lambda c: c.delete(path, recursive=recursive, **where)), as_json
    )


@files_app.command("mv")
def files_mv(
    source: str,
    destination: str,
    overwrite: bool = False,
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    queue_: QueueOption = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move or rename a file or folder."""
    where = {**_where(workspace, runner), "queue": queue_}
    edit = _run(home, agent, lambda c: c.move(source, destination, overwrite=overwrite, **where))
    _edit_summary(edit, as_json)


@files_app.command("restore")
def files_restore(
    seq: int,
    path: Annotated[str, typer.Option("--path", help="Only this file or folder.")] = "",
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    queue_: QueueOption = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Restore the workspace (or --path) to snapshot SEQ: a new snapshot; history is kept."""
    where = {**_where(workspace, runner), "queue": queue_}
    _edit_summary(_run(home, agent, lambda c: c.restore(seq, path, **where)), as_json)


@files_app.command("gc")
def files_gc(
    keep_last: Annotated[int | None, typer.Option(help="Snapshots kept per workspace.")] = None,
    grace_s: Annotated[
        float | None, typer.Option(help="Keep younger unreferenced objects.")
    ] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply the retention policy now: prune old snapshots, collect unreferenced objects."""
    result = _run(home, None, lambda c: c.collect(keep_last, grace_s))
    if as_json:
        _json(result)
        return
    removed = sum(len(p.removed) for p in result.pruned)
    freed = sum(g.bytes_removed for g in result.collected.values())
    out.print(f"pruned {removed} snapshots; freed {freed} bytes", highlight=False)
    for runner_id, message in result.errors.items():
        err.print(f"runner {runner_id}: {message}", highlight=False)


# ---------------------------------------------------------------------- transfers

TRANSFER_COLUMNS = (
    "transfer_id",
    "state",
    "files_total",
    "files_copied",
    "files_unchanged",
    "files_skipped",
    "files_failed",
    "bytes_done",
    "target_seq",
)


def _show_transfer(view: Any, as_json: bool) -> None:
    if as_json:
        _json(view)
        return
    table = Table(show_header=False, box=None)
    for key in (*TRANSFER_COLUMNS, "source_workspace_id", "source_seq", "target_workspace_id"):
        value = getattr(view, key)
        if value is not None:
            table.add_row(key, str(value))
    if view.error:
        table.add_row("error", view.error)
    out.print(table)


@transfer_app.command("discover")
def transfer_discover(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """The workspaces you may copy between."""
    views = _run(home, agent, lambda c: c.workspaces())
    if as_json:
        _json(views)
        return
    table = Table("workspace", "runner", "agent", "relation", "head", "writer", box=None)
    for v in views:
        table.add_row(
            v.workspace_id, v.runner_id, v.agent_id, v.relation, str(v.head_seq), v.writer or ""
        )
    out.print(table)


@transfer_app.command("start")
def transfer_start(
    source: Annotated[str, typer.Argument(help="The source workspace id.")],
    paths: Annotated[list[str], typer.Argument(help="Files, folders or globs to copy.")],
    to: Annotated[str, typer.Option("--to", help="The target workspace id.")],
    folder: Annotated[str, typer.Option("--folder", help="Folder in the target.")] = "",
    queue_: QueueOption = False,
    batch_files: Annotated[int | None, typer.Option(help="Files per committed batch.")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow it to the end.")] = True,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start a transfer; with --wait (default) follow it with a progress bar."""
    options = {"batch_files": batch_files} if batch_files else {}

    def start(client: Any) -> Any:
        view = client.transfer_start(source, paths, to, folder, queue=queue_, **options)
        return _follow_transfer(client, view) if wait else view

    view = _run(home, agent, start)
    _show_transfer(view, as_json)
    if wait and view.state != "completed":
        raise typer.Exit(EXIT_FAILED)


def _follow_transfer(client: Any, view: Any) -> Any:
    """Wait for a transfer to end, with a progress bar of its bytes on a terminal."""
    with _progress() as progress:
        task = progress.add_task(f"transfer {view.transfer_id}", total=view.bytes_total)
        while not view.terminal:
            view = client.transfer_wait(view.transfer_id, 1.0)
            progress.update(
                task, total=view.bytes_total, completed=view.bytes_done + view.bytes_in_flight
            )
    return view


@transfer_app.command("list")
def transfer_list(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """Your transfers, newest first."""
    views = _run(home, agent, lambda c: c.transfers())
    show(views, as_json, TRANSFER_COLUMNS)


@transfer_app.command("status")
def transfer_status(
    transfer_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow it to the end with a progress bar.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """One transfer: state and progress. With --follow, exit 1 unless it completed."""

    def status(client: Any) -> Any:
        view = client.transfer(transfer_id)
        return _follow_transfer(client, view) if follow else view

    view = _run(home, agent, status)
    _show_transfer(view, as_json)
    if follow and view.state != "completed":
        raise typer.Exit(EXIT_FAILED)


@transfer_app.command("files")
def transfer_files(
    transfer_id: str,
    outcome: Annotated[str | None, typer.Option(help="copied, unchanged, skipped, failed…")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-file outcomes of a transfer."""

    def files(client: Any) -> list[Any]:
        rows: list[Any] = []
        offset: int | None = 0
        while offset is not None:
            page = client.transfer_files(transfer_id, outcome, offset, 10_000)
            rows += page.files
            offset = page.next_offset
        return rows

    rows = _run(home, agent, files)
    if as_json:
        _json(rows)
        return
    for r in rows:
        reason = f"  ({r.reason})" if r.reason else ""
        out.print(f"{r.outcome:9} {r.source_path} -> {r.target_path}{reason}", highlight=False)


@transfer_app.command("cancel")
def transfer_cancel(
    transfer_id: str,
    wait_s: float = 15.0,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel a transfer: files already committed stay."""
    _show_transfer(_run(home, agent, lambda c: c.transfer_cancel(transfer_id, wait_s)), as_json)


# ---------------------------------------------------------------------- artifacts

ARTIFACT_COLUMNS = ("artifact_id", "name", "path", "seq", "size", "sha256")


@artifact_app.command("declare")
def artifact_declare(
    path: str,
    name: Annotated[str | None, typer.Option(help="Default: the file's name.")] = None,
    workspace: WorkspaceOption = None,
    seq: SeqOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Declare a committed file of your local workspace as an artifact."""
    view = _run(
        home, agent, lambda c: c.artifact_declare(path, name, workspace_id=workspace, seq=seq)
    )
    if as_json:
        _json(view)
        return
    out.print(f"{view.artifact_id} {view.name} ({view.size} bytes, sha256 {view.sha256})")


@artifact_app.command("list")
def artifact_list(
    home: HomeOption = None, agent: AgentOption = None, as_json: JsonOption = False
) -> None:
    """Your artifacts."""
    views = _run(home, agent, lambda c: c.artifacts())
    show(views, as_json, ARTIFACT_COLUMNS)


@artifact_app.command("get")
def artifact_get(
    artifact_id: str,
    dest: Annotated[Path | None, typer.Argument(help="Default: its name.")] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was written as JSON on stdout.")
    ] = False,
) -> None:
    """Download an artifact's bytes."""

    def get(client: Any) -> dict[str, Any]:
        view = client.artifact(artifact_id)
        target = dest or Path(view.name)
        with _progress() as progress, open(target, "wb") as handle:
            task = progress.add_task(f"get {view.name}", total=view.size)
            for chunk in _counted(client.iter_artifact(artifact_id), progress, task):
                handle.write(chunk)
        return {"path": str(target), "kind": "file", "size": view.size}

    _wrote(_run(home, agent, get), as_json)


def _wrote(written: dict[str, Any], as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(written))
        return
    size = f" ({written['size']} bytes)" if "size" in written else ""
    err.print(f"wrote {written['path']}{size}", highlight=False)


# ---------------------------------------------------------------------- helpers


def _read_chunks(handle: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    while True:
        chunk = handle.read(size)
        if not chunk:
            return
        yield chunk


def _tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


class _QueueWriter:
    def __init__(self, chunks: queue.Queue[bytes | BaseException | None]) -> None:
        self._chunks = chunks
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        if len(self._buf) >= 1 << 20:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._buf:
            self._chunks.put(bytes(self._buf))
            self._buf.clear()


def _tar_chunks(root: Path) -> Iterator[bytes]:
    """A tar of ``root``'s contents, made on a thread while it is sent (bounded memory)."""
    chunks: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=8)

    def produce() -> None:
        writer = _QueueWriter(chunks)
        try:
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for child in sorted(root.iterdir()):
                    tar.add(child, arcname=child.name)
            writer.flush()
            chunks.put(None)
        except BaseException as exc:
            chunks.put(exc)

    threading.Thread(target=produce, daemon=True).start()
    while True:
        item = chunks.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class _IterReader:
    """A file-like reader over an iterator of chunks (for ``tarfile`` in stream mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf += chunk
        if n < 0:
            n = len(self._buf)
        data, self._buf = self._buf[:n], self._buf[n:]
        return data
