"""What every verb module of the CLI shares: the consoles, the common options, calling the
home's server, progress bars, printing a result as a table or JSON, and turning a
ShellyardError into the documented exit code."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from shellyard.cli.exits import EXIT_BY_STATE as EXIT_BY_STATE
from shellyard.cli.exits import exit_code_of as exit_code_of
from shellyard.cli.exits import say_error
from shellyard.errors import InvalidInput, ShellyardError
from shellyard.errors import visible as visible

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from shellyard.contract.executions import ExecutionView
    from shellyard.sdk.client import Client

# Start-up time is part of every verb (docs/benchmarks.md: ``shellyard run -- true`` within 150 ms),
# so this module and every verb module import nothing heavy at module level: rich, pydantic, httpx
# and the public models are imported where a verb first needs them.


class _LazyConsole:
    """A rich Console made on first use (importing rich costs more than most verbs' work)."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = _visible_console(self._stderr)
        return getattr(self._console, name)


def escaped(text: object) -> str:
    """``text`` as rich markup that shows it literally (for a ``markup=True`` message)."""
    from rich.markup import escape

    return escape(str(text))


def _visible_console(stderr: bool) -> Console:
    """A rich Console that prints the text it is given with its control characters shown, not
    sent: names, commands and messages are the agent's, and ``ESC ] 52`` (the clipboard), a
    title or a cursor move would act on the operator's terminal (docs/security.md "Attack pass
    (session 45)"). Rich's own styles and cursor moves are not text and pass as before; command
    output (``run``, ``logs``, ``files cat``) is written raw, by design, as ``cat`` would.
    Markup is off for the same reason: a file named ``[link=https://…]x`` would become a link
    the operator clicks, ``[bold]`` a style; a message that styles its own words passes
    ``markup=True`` and ``escaped()`` every name in it."""
    from rich.console import Console
    from rich.segment import Segment

    class VisibleConsole(Console):
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            return super()._render_buffer(
                s if s.control else Segment(visible(s.text), s.style, s.control) for s in buffer
            )

    return VisibleConsole(stderr=stderr, markup=False)


if TYPE_CHECKING:
    err: Console
    out: Console
else:
    err = _LazyConsole(stderr=True)
    out = _LazyConsole(stderr=False)


#: What an id looks like (``ex_``, ``ws_``, ``tr_`` … and hex): never cut in a table.
_ID = re.compile(r"^[a-z]{1,6}_[0-9A-Za-z]{6,}$")


def new_table(*columns: str, **options: Any) -> Table:
    """A rich Table (rich is imported on first use) whose ids are never cut: a column holding
    ids is as wide as its longest and never wraps; the other columns give way (docs/cli.md)."""
    from rich.table import Table

    class IdTable(Table):
        def __rich_console__(self, console: Any, options: Any) -> Any:
            for column in self.columns:
                ids = [c for c in column._cells if isinstance(c, str) and _ID.match(c)]
                if ids:
                    column.no_wrap = True
                    column.min_width = max(len(c) for c in ids)
            return super().__rich_console__(console, options)

    return IdTable(*columns, **options)


def print_json(result: BaseModel | Sequence[BaseModel]) -> None:
    """One model, or a list of them, as JSON on stdout (every verb's ``--json``)."""
    from pydantic import BaseModel

    if isinstance(result, BaseModel):
        out.print_json(result.model_dump_json())
    else:
        out.print_json(json.dumps([r.model_dump(mode="json") for r in result]))


def paged(fetch: Callable[[str | None], Any], items: str) -> Iterator[Any]:
    """Every item of a paged listing (``fetch(after)`` returns a page with ``items`` and
    ``next_after``), with one page in memory at a time: a tree of a million files lists in
    the memory of a thousand."""
    after: str | None = None
    while True:
        page = fetch(after)
        yield from getattr(page, items)
        if page.next_after is None:
            return
        after = page.next_after


def print_json_lines(results: Iterable[BaseModel]) -> None:
    """A JSON array written item by item, so a long listing is never held whole."""
    first = True
    sys.stdout.write("[")
    for result in results:
        sys.stdout.write(("\n  " if first else ",\n  ") + result.model_dump_json())
        first = False
    sys.stdout.write("\n]\n" if not first else "]\n")
    sys.stdout.flush()


def show(result: BaseModel | Sequence[BaseModel], as_json: bool, columns: Sequence[str]) -> None:
    """``--json``, or a human table: one model as key/value rows, a list with a row each."""
    from pydantic import BaseModel

    if as_json:
        print_json(result)
        return
    if isinstance(result, BaseModel):
        table = new_table(show_header=False, box=None)
        for key in columns:
            value = getattr(result, key)
            if value is not None:
                table.add_row(key, str(value.value if hasattr(value, "value") else value))
        out.print(table)
        return
    table = new_table(*columns)
    for row in result:
        values = (getattr(row, key) for key in columns)
        table.add_row(*("" if v is None else str(getattr(v, "value", v)) for v in values))
    out.print(table)


HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="State folder (default $SHELLYARD_HOME, ~/.shellyard, or "
        "/var/lib/shellyard for root).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
AgentOption = Annotated[
    str | None,
    typer.Option("--agent", envvar="SHELLYARD_AGENT", help="Act for this agent."),
]
WorkspaceOption = Annotated[
    str | None, typer.Option("--workspace", "-w", help="A workspace id (default: yours).")
]
SeqOption = Annotated[
    int | None, typer.Option("--seq", help="A snapshot number (default: the latest).")
]
QueueOption = Annotated[
    bool, typer.Option("--queue", help="Wait for the workspace's writer instead of failing.")
]


def fail(exc: ShellyardError) -> NoReturn:
    """Say the error on stderr (``exits.say_error``) and exit with its code."""
    raise typer.Exit(say_error(exc))


def client_for(home: Path | None, agent: str | None = None) -> Client:
    """The client of the home's server (started if need be), with ``$SHELLYARD_TOKEN`` when
    set (else the home's admin token), acting for ``agent`` or ``$SHELLYARD_AGENT``. Says on
    a terminal when this shell's settings are not the ones the server runs with
    (``shellyard server status`` says it always)."""
    import os

    from shellyard.home import default_home, ensure_server, settings_drift
    from shellyard.sdk.client import Client

    info = ensure_server(home or default_home())
    drift = settings_drift(info)
    if drift and sys.stderr.isatty():  # a script's stderr stays the command's own
        err.print(f"shellyard: note: {drift}", highlight=False)
    token = os.environ.get("SHELLYARD_TOKEN") or info.token
    return Client(info.url, token, agent_id=agent or os.environ.get("SHELLYARD_AGENT") or None)


LogLevelOption = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="SHELLYARD_LOG_LEVEL",
        help="What is logged to stderr: warning (the default: warnings and errors), info, "
        "debug or error.",
    ),
]
_LEVELS = ("debug", "info", "warning", "error", "critical")


def configure_logging(level: str) -> None:
    """Plain log lines on stderr at ``level``. Set before any library does it its own way: the
    mcp SDK would otherwise install a rich handler at INFO (three lines per tool call)."""
    import logging

    if level.lower() not in _LEVELS:
        fail(InvalidInput(f"--log-level must be one of {', '.join(_LEVELS)}, not {level!r}"))
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def configure_json_logging(level: str) -> None:
    """``serve --log-format json`` (docs/operations.md): one JSON object per line on stderr,
    for log collectors. Each line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and
    ``message``, and every field the code attached to the record (``execution_id``,
    ``session_id``, ``runner_id``, ``agent_id``, ``wake_id``, ``action``, …) where it knows
    them. Built here on first use: logging is not imported by the other verbs."""
    import logging
    from datetime import UTC, datetime

    #: The attributes every LogRecord has; anything else was passed as ``extra``.
    standard = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            line: dict[str, object] = {
                "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                    timespec="milliseconds"
                ),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
            for key, value in vars(record).items():
                if key not in standard and not key.startswith("_"):
                    line[key] = value
            if record.exc_info:
                line["exception"] = self.formatException(record.exc_info)
            return json.dumps(line, default=str, ensure_ascii=False)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def refuse_initialize(message: str, wait_s: float = 10.0) -> None:
    """Answer an MCP host's ``initialize`` request (JSON-RPC over stdio) with an error, so the
    host shows why this server cannot serve. Returns at once when stdin is a terminal, and
    after ``wait_s`` if no request came."""
    import os
    import select
    import time

    stdin = sys.stdin.buffer
    if sys.stdin.isatty():
        return
    deadline = time.monotonic() + wait_s
    fd = stdin.fileno()
    pending = b""
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], deadline - time.monotonic())[0]:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if isinstance(request, dict) and request.get("method") == "initialize":
                answer = {
                    "jsonrpc": "2.0",
                    "id": request.get("id"),
                    "error": {"code": -32603, "message": message},
                }
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
                return


def run_as(home: Path | None, agent: str | None, action: Callable[[Any], Any]) -> Any:
    """Call the home's server (started on demand) as ``agent``; a shellyard error exits with
    its documented code and text."""
    from shellyard.home import default_home
    from shellyard.sdk.client import Client

    try:
        with Client.for_home(home or default_home(), agent_id=agent) as client:
            return action(client)
    except ShellyardError as exc:
        fail(exc)


def progress_bar() -> Progress:
    """A byte progress bar on stderr, shown only on a terminal (uploads, downloads, transfers)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("{task.description}", markup=False),  # names are the agent's
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def counted(chunks: Iterable[bytes], progress: Progress, task: TaskID) -> Iterator[bytes]:
    """Pass chunks through, advancing the progress bar's task by their sizes."""
    for chunk in chunks:
        progress.update(task, advance=len(chunk))
        yield chunk


def wrote(written: dict[str, Any], as_json: bool) -> None:
    """Report a download: JSON on stdout, or one line on stderr (stdout may be the data)."""
    if as_json:
        out.print_json(json.dumps(written))
        return
    size = f" ({written['size']} bytes)" if "size" in written else ""
    err.print(f"wrote {written['path']}{size}", highlight=False)


def print_view(view: ExecutionView, as_json: bool) -> None:
    if as_json:
        out.print_json(view.model_dump_json())
        return
    table = new_table(show_header=False, box=None)
    for key in (
        "execution_id",
        "state",
        "exit_code",
        "workspace_id",
        "runner_id",
        "command",
        "script_path",
        "error",
        "limit",
        "peak_memory_bytes",
        "cpu_seconds",
        "snapshot_seq",
        "environment_id",
        "environment_revision",
        "waiting_for",
    ):
        value = getattr(view, key)
        if value is not None:
            table.add_row(key, str(value))
    out.print(table)
