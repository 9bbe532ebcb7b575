"""CLI verbs of workspace files and snapshot history: ``shellyard files
ls|cat|get|put|rm|mv|diff|history|restore|gc``. Each takes ``--json``; uploads and downloads
show a progress bar on a terminal. Folders travel as one tar stream, made and unpacked while it
flows (bounded memory). ``cli/app.py`` calls ``register``."""

from __future__ import annotations

import queue
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from shellyard.cli.common import (
    AgentOption,
    HomeOption,
    JsonOption,
    QueueOption,
    SeqOption,
    WorkspaceOption,
    counted,
    err,
    fail,
    new_table,
    out,
    paged,
    print_json,
    print_json_lines,
    progress_bar,
    run_as,
    wrote,
)
from shellyard.cli.unpack import no_link, unpack
from shellyard.errors import InvalidInput

files_app = typer.Typer(
    help=(
        "Workspace files as committed in snapshots: list, read, download, upload, delete, move; "
        "history, diff, restore; retention."
    ),
    no_args_is_help=True,
)

RunnerOption = Annotated[
    str | None, typer.Option("--runner", help="Your workspace on this runner (default: local).")
]


def register(app: typer.Typer) -> None:
    app.add_typer(files_app, name="files")


def _where(workspace: str | None, runner: str | None) -> dict[str, Any]:
    return {"workspace_id": workspace, "runner_id": runner}


def _edit_summary(edit: Any, as_json: bool) -> None:
    if as_json:
        print_json(edit)
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

    def listing(client: Any) -> None:
        entries = paged(
            lambda after: client.list_files(
                path, recursive=recursive, seq=seq, after=after, **_where(workspace, runner)
            ),
            "entries",
        )
        if as_json:
            print_json_lines(entries)
            return
        # line by line, not one table: a table would hold every entry to size its columns
        for e in entries:
            name = e.path + ("/" if e.kind == "dir" else f" -> {e.target}" if e.target else "")
            size = str(e.size) if e.kind == "file" else ""
            out.print(
                f"{oct(e.mode):>7} {e.kind:<7} {size:>12}  {name}", highlight=False, markup=False
            )

    run_as(home, agent, listing)


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
            print_json(client.read_text(path, seq=seq, offset=offset, limit=limit, **where))
            return
        for chunk in client.iter_file(
            path, seq=seq, offset=offset, length=length, **_where(workspace, runner)
        ):
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    run_as(home, agent, cat)


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
        with progress_bar() as progress:
            if entry.kind == "file":
                task = progress.add_task(f"get {name}", total=entry.size)
                chunks = client.iter_file(path, seq=seq, **_where(workspace, runner))
                with open(target, "wb", opener=no_link) as handle:
                    for chunk in counted(chunks, progress, task):
                        handle.write(chunk)
                return {"path": str(target), "kind": "file", "size": entry.size}
            task = progress.add_task(f"get {name}/", total=None)
            chunks = counted(
                client.iter_archive(path, seq=seq, **_where(workspace, runner)), progress, task
            )
            if str(target).endswith(".tar"):
                with open(target, "wb") as handle:
                    for chunk in chunks:
                        handle.write(chunk)
                return {"path": str(target), "kind": "tar"}
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=_IterReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]

                def inside() -> Iterator[tarfile.TarInfo]:
                    for member in tar:
                        # members are named below the folder's own name: unpack into DEST
                        inner = member.name.partition("/")[2] if entry.path else member.name
                        if inner:
                            member.name = inner
                            yield member

                # the agent's tree: never written through a link (cli/unpack.py)
                left_out = unpack(inside(), tar, target)
            for name in left_out:  # the agent's names: through err, control codes shown
                err.print(
                    f"left out {name}: a link that leads out of {target} or a hard link",
                    highlight=False,
                )
            return {"path": str(target), "kind": "dir", "links_left_out": left_out}

    wrote(run_as(home, agent, get), as_json)


@files_app.command("history")
def files_history(
    workspace: WorkspaceOption = None,
    runner: RunnerOption = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every snapshot of a workspace with what made it."""
    history = run_as(home, agent, lambda c: c.history(**_where(workspace, runner)))
    if as_json:
        print_json(history)
        return
    table = new_table("seq", "made by", "files", "bytes", "created", "retained", box=None)
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

    def diff(client: Any) -> None:
        changes = paged(
            lambda after: client.diff(
                from_seq, to_seq, path, after=after, **_where(workspace, runner)
            ),
            "changes",
        )
        if as_json:
            print_json_lines(changes)
            return
        for c in changes:
            print_change(c)

    run_as(home, agent, diff)


def print_change(c: Any) -> None:
    sign = {"added": "+", "removed": "-", "changed": "~"}
    detail = c.kind
    if c.kind == "file" or c.old_kind == "file":
        old = "" if c.old_size is None else f"{c.old_size} B"
        new = "" if c.new_size is None else f"{c.new_size} B"
        changed = f", {old or '-'} -> {new or '-'}"
        detail += changed if c.change == "changed" else f", {old or new}"
    out.print(f"{sign[c.change]} {c.path}  ({detail})", highlight=False, markup=False)


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
        with progress_bar() as progress:
            if str(source) == "-":
                return client.write_file(path or "stdin", sys.stdin.buffer, mode=bits, **where)
            if source.is_dir():
                task = progress.add_task(f"put {source.name}/", total=_tree_size(source))
                chunks = counted(_tar_chunks(source), progress, task)
                return client.upload_archive(chunks, path or source.name, **where)
            if not source.is_file():
                raise InvalidInput(f"{source} is not a file or folder on this machine")
            task = progress.add_task(f"put {source.name}", total=source.stat().st_size)
            with open(source, "rb") as handle:
                chunks = counted(_read_chunks(handle), progress, task)
                return client.write_file(path or source.name, chunks, mode=bits, **where)

    _edit_summary(run_as(home, agent, put), as_json)


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
        run_as(home, agent, lambda c: c.delete(path, recursive=recursive, **where)), as_json
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
    edit = run_as(home, agent, lambda c: c.move(source, destination, overwrite=overwrite, **where))
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
    _edit_summary(run_as(home, agent, lambda c: c.restore(seq, path, **where)), as_json)


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
    result = run_as(home, None, lambda c: c.collect(keep_last, grace_s))
    if as_json:
        print_json(result)
        return
    removed = sum(len(p.removed) for p in result.pruned)
    freed = sum(g.bytes_removed for g in result.collected.values())
    out.print(f"pruned {removed} snapshots; freed {freed} bytes", highlight=False)
    for runner_id, message in result.errors.items():
        err.print(f"runner {runner_id}: {message}", highlight=False)


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
