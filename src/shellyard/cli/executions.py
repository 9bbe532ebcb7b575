"""Execution verbs: run, status, logs, cancel, input (E1–E7, E13 from a terminal); attach
and screen (E13: this terminal joined to an execution's pseudo-terminal, its screen now)."""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import select
import shlex
import signal
import sys
import termios
import threading
import tty
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.core import Context as ClickContext
from typer._click.exceptions import NoSuchOption, UsageError
from typer.core import TyperCommand

from shellyard.cli.common import (
    EXIT_BY_STATE,
    AgentOption,
    HomeOption,
    JsonOption,
    err,
    fail,
    new_table,
    out,
    print_json,
    print_view,
    run_as,
)
from shellyard.cli.common import client_for as _client
from shellyard.cli.exits import EXIT_RETRY, exit_code_of
from shellyard.errors import AnswerLost, InvalidInput, ShellyardError

if TYPE_CHECKING:
    from shellyard.contract.executions import ExecutionView, RunShellResult
    from shellyard.sdk.client import Client


#: How long Ctrl-C waits for the command it cancels to end (E7: SIGTERM, the grace period,
#: then the whole sandbox).
INTERRUPT_CANCEL_WAIT_S = 20.0
#: ``run``'s exit code when its command was cancelled (as a shell's for SIGINT).
EXIT_CANCELLED = 130


class RunCommand(TyperCommand):
    """``run [OPTIONS] -- COMMAND``: options are read up to the first word of the command (or
    ``--``); an option ``run`` does not know is refused with the list of those it knows, so a
    typo never becomes part of the command that runs."""

    def parse_args(self, ctx: ClickContext, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            known = sorted(
                name
                for param in self.params
                for name in getattr(param, "opts", [])
                if name.startswith("--")
            )
            raise UsageError(
                f"run has no option {exc.option_name}. Its options: {', '.join(known)}. "
                "The command goes after '--': shellyard run [OPTIONS] -- COMMAND",
                ctx,
            ) from None


def register(app: typer.Typer) -> None:
    app.command(
        cls=RunCommand,
        context_settings={"allow_extra_args": True, "allow_interspersed_args": False},
    )(run)
    for verb in (status, logs, cancel, attach, screen):
        app.command()(verb)
    app.command("input", no_args_is_help=True)(input_verb)  # E13: type into a running command


def new_idempotency_key() -> str:
    """A key for one foreground ``run``: Ctrl-C before the answer came asks the server for
    the execution by it (E10), without starting a second one."""
    return f"cli-{os.urandom(12).hex()}"


def interrupted(
    client: Client, command: str | None, options: dict[str, Any], execution_id: str | None
) -> int:
    """Ctrl-C during a foreground ``run``: cancel the execution it started and wait for its
    end (E7), say how it ended; the exit code ``run`` ends with. A second Ctrl-C leaves it
    running and says so."""
    err.print(
        "\nshellyard: Ctrl-C: cancelling the command (Ctrl-C again leaves it running)",
        highlight=False,
    )
    try:
        if execution_id is None:
            # The same key answers for the execution the interrupted call started (E10).
            execution_id = client.run(command, **{**options, "wait_ms": 0}).execution_id
        final = client.cancel(execution_id, INTERRUPT_CANCEL_WAIT_S)
    except KeyboardInterrupt:
        what = execution_id or "the command"
        err.print(f"shellyard: left running: {what} ('shellyard cancel ID' stops it)")
        return EXIT_CANCELLED
    err.print(f"shellyard: {final.state.value} ({final.execution_id})", highlight=False)
    if final.exit_code is not None:
        return final.exit_code
    return EXIT_BY_STATE.get(final.state, EXIT_CANCELLED)


def run(
    ctx: typer.Context,
    home: HomeOption = None,
    script: Annotated[str | None, typer.Option("--script", help="Run a workspace file.")] = None,
    runner_id: Annotated[
        str | None, typer.Option("--runner", help="Run on this runner (default: local).")
    ] = None,
    env: Annotated[
        str | None, typer.Option("--env", help="Run in this environment (id or name).")
    ] = None,
    wait_ms: Annotated[int, typer.Option(help="Response budget before following logs.")] = 30_000,
    background: Annotated[
        bool, typer.Option("--background", "-b", help="Print the execution id and return.")
    ] = False,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream the output live from the start.")
    ] = False,
    queue: Annotated[bool, typer.Option(help="Wait in line if the workspace is busy.")] = False,
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only",
            help="Run beside the workspace's writer (a background server) on its committed "
            "files, read-only; no snapshot.",
        ),
    ] = False,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", help="Cancel it after this long: 30s, 500ms, 5m, 2h, 1d."),
    ] = None,
    timeout_ms: Annotated[
        int | None, typer.Option("--timeout-ms", help="Cancel it after this many ms.")
    ] = None,
    var: Annotated[
        list[str] | None,
        typer.Option("--var", help="NAME=VALUE: an extra variable for the command (repeat)."),
    ] = None,
    cwd: Annotated[
        str | None, typer.Option("--cwd", help="Start in this folder of the workspace.")
    ] = None,
    on_terminal: Annotated[
        bool,
        typer.Option(
            "--tty", "-t", help="Run it on a terminal and attach to it (Ctrl-] d detaches)."
        ),
    ] = False,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run one command: shellyard run [OPTIONS] -- CMD [ARGS...], or --script PATH -- ARGS...
    Prints its output (after --wait-ms, or live with --follow) and exits with its exit code.
    Ctrl-C cancels it; --background leaves it running. --tty runs it on a terminal of this
    terminal's size and attaches, as 'shellyard attach' does."""
    words = list(ctx.args)
    command = words[0] if len(words) == 1 else shlex.join(words) if words else None
    if command is None and script is None:
        err.print("give a command after '--' (shellyard run -- ls -la) or --script PATH")
        raise typer.Exit(2)
    if script is not None:  # E1: the words after '--' are the script's arguments
        command = None
    try:
        client = _client(home, agent)
        if env is not None:
            from shellyard.cli.environments import _resolve

            env = _resolve(client, env)
        options: dict[str, Any] = {
            "script_path": script,
            "runner_id": runner_id,
            "environment_id": env,
            "background": background,
            "queue": queue,
            "read_only": read_only,
            "idempotency_key": None if background else new_idempotency_key(),
            **run_options(timeout, timeout_ms, var, cwd),
            "args": words if script is not None and words else None,
            **(terminal_options() if on_terminal else {}),
        }
        if on_terminal and not (background or as_json):
            # Attached from the first byte: keys typed (Ctrl-C too) go to the command.
            started = client.run(command, **{**options, "wait_ms": 0})
            try:
                code = attach_to(client, _client(home, agent), started.execution_id)
            except ShellyardError as exc:
                raise _started(started.execution_id, exc) from exc
            raise typer.Exit(code)
        try:
            result = client.run(command, wait_ms=0 if follow else wait_ms, **options)
        except KeyboardInterrupt:
            raise typer.Exit(interrupted(client, command, options, None)) from None
        if as_json:
            out.print_json(result.model_dump_json())
            raise typer.Exit(0)
        if background:
            _note(result)
            out.print(result.execution_id)
            raise typer.Exit(0)
        try:
            code = _foreground(client, result)
        except KeyboardInterrupt:
            code = interrupted(client, command, options, result.execution_id)
    except ShellyardError as exc:
        fail(exc)
    raise typer.Exit(code)


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``30s``, ``500ms``, ``5m``, ``2h``, ``1d`` or a number of seconds, in milliseconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", text)
    if match is None:
        raise typer.BadParameter(
            f"--timeout {text!r} is not a duration; write e.g. 30s, 500ms, 5m, 2h or 1d"
        )
    return max(1, round(float(match[1]) * _UNITS_MS[match[2] or "s"]))


def run_options(
    timeout: str | None, timeout_ms: int | None, variables: list[str] | None, cwd: str | None
) -> dict[str, Any]:
    """E1's per-command options from ``run``'s flags (the server checks their bounds)."""
    if timeout is not None and timeout_ms is not None:
        raise typer.BadParameter("give --timeout or --timeout-ms, not both")
    env: dict[str, str] = {}
    for item in variables or ():
        name, equals, value = item.partition("=")
        if not equals:
            raise typer.BadParameter(f"--var {item!r}: write NAME=VALUE")
        env[name] = value
    return {
        "timeout_ms": parse_duration_ms(timeout) if timeout is not None else timeout_ms,
        "env": env or None,
        "cwd": cwd,
    }


def _note(result: RunShellResult) -> None:
    if result.note and sys.stderr.isatty():
        # No base prepared yet, so the command ran with the host's tools only; the note names
        # the command that prepares one. On a terminal only: a script's stderr stays the
        # command's own (--json carries the note as a field).
        err.print(f"shellyard: note: {result.note}", highlight=False)


def _foreground(client: Client, result: RunShellResult) -> int:
    _note(result)
    return finish_run(client, result)


def finish_run(client: Client, result: RunShellResult) -> int:
    """Print a foreground run's output (following it live if it is still going) and its
    error line; the exit code ``run`` ends with. Shared with the fast path (``cli.entry``)."""
    if result.state.terminal:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        final: ExecutionView = result
    else:
        try:
            for text in client.follow(result.execution_id, "stdout"):
                sys.stdout.write(text)
                sys.stdout.flush()
            for text in client.follow(result.execution_id, "stderr"):
                sys.stderr.write(text)
            final = client.wait(result.execution_id, 30)
        except ShellyardError as exc:
            raise _started(result.execution_id, exc) from exc
    if final.error:
        err.print(f"shellyard: {final.state.value}: {final.error}", highlight=False)
    return final.exit_code if final.exit_code is not None else EXIT_BY_STATE.get(final.state, 1)


def _started(execution_id: str, exc: ShellyardError) -> ShellyardError:
    """An error while following a started command: one whose advice is "retry" (exit 75:
    the server went away, a GET's break) would run the command again if followed, so it is
    ``AnswerLost`` (124, look first) naming the execution, as a POST's lost answer is
    (docs/security.md "Attack pass (session 51)"); any other is left as it is."""
    if exit_code_of(exc) != EXIT_RETRY:
        return exc
    # the break itself, without the error's own "retry" advice
    why = str(exc.__cause__) if exc.__cause__ is not None else exc.message
    return AnswerLost(
        f"execution {execution_id} was started and following it broke ({why}); it "
        f"may still be running: look with `shellyard status {execution_id}` before running "
        "the command again"
    )


def status(
    execution_id: Annotated[str | None, typer.Argument()] = None,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show one execution, or list recent ones."""
    try:
        client = _client(home, agent)
        if execution_id is not None:
            print_view(client.status(execution_id), as_json)
            return
        views = client.list()
    except ShellyardError as exc:
        fail(exc)
    if as_json:
        out.print_json(json.dumps([v.model_dump(mode="json") for v in views]))
        return
    table = new_table("execution", "state", "exit", "command")
    for view in views:
        table.add_row(
            view.execution_id,
            view.state.value,
            "" if view.exit_code is None else str(view.exit_code),
            view.command or view.script_path or "",
        )
    out.print(table)


def _sink(stream: str) -> Any:
    """Where a stream's bytes go: stdout's to stdout, stderr's to stderr, exactly."""
    return (sys.stderr if stream == "stderr" else sys.stdout).buffer  # stdin: what was typed


def _print_log(
    client: Client, execution_id: str, stream: str, offset: int, limit: int | None,
    tail_lines: int | None, tail_bytes: int | None,
) -> None:  # fmt: skip
    """One stream's bytes from ``offset`` (or its last lines or bytes), page by page: at most
    ``limit`` bytes (None: up to the end it had when asked)."""
    page = client.logs(
        execution_id, stream, offset, min(limit or MAX_LOG_PAGE, MAX_LOG_PAGE), tail_bytes,
        tail_lines=tail_lines, raw=True,
    )  # fmt: skip
    end, written = page.size, 0
    while True:
        data = page.raw()
        _sink(stream).write(data)
        written += len(data)
        left = MAX_LOG_PAGE if limit is None else limit - written
        if page.complete or not data or page.next_offset >= end or left <= 0:
            break
        page = client.logs(
            execution_id, stream, page.next_offset, min(left, MAX_LOG_PAGE), raw=True
        )
    _sink(stream).flush()


def _follow_streams(client: Client, execution_id: str, streams: list[str], offset: int) -> None:
    """Print each stream's bytes as they are written until the execution ends and all was
    read; caught up, wait on the execution for a pause that grows to half a second."""
    offsets = dict.fromkeys(streams, offset)
    done: set[str] = set()
    pause = 0.02
    while len(done) < len(streams):
        moved = False
        for stream in streams:
            if stream in done:
                continue
            page = client.logs(execution_id, stream, offsets[stream], MAX_LOG_PAGE, raw=True)
            data = page.raw()
            if data:
                _sink(stream).write(data)
                _sink(stream).flush()
                moved = True
            offsets[stream] = page.next_offset
            if page.complete or (not data and page.state.terminal):
                done.add(stream)
        if moved:
            pause = 0.02
        elif len(done) < len(streams):
            client.wait(execution_id, pause)
            pause = min(0.5, pause * 2)


#: Bytes one page of ``logs`` asks for.
MAX_LOG_PAGE = 1 << 20


def logs(
    execution_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    stream: Annotated[
        str | None,
        typer.Option(
            help="Only this stream: stdout, stderr or stdin (what was typed, E13). Without it, "
            "stdout and stderr are printed."
        ),
    ] = None,
    offset: Annotated[int, typer.Option(help="Start at this byte of each stream.")] = 0,
    limit: Annotated[int, typer.Option(help="At most this many bytes of each stream.")] = 65536,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines.")] = None,
    tail_bytes: Annotated[int | None, typer.Option(help="Only the last N bytes.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the execution ends.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Print an execution's log, its exact bytes: stdout to stdout and stderr to stderr (or
    only --stream's). --follow keeps printing until it ends."""
    if stream not in (None, "stdout", "stderr", "stdin"):
        err.print(f"--stream must be stdout, stderr or stdin, not {stream!r}")
        raise typer.Exit(2)
    streams = [stream] if stream else ["stdout", "stderr"]
    try:
        client = _client(home, agent)
        if as_json:
            # One page of one stream as the REST answer (text; stdout unless --stream).
            chunk = client.logs(
                execution_id, streams[0], offset, limit, tail_bytes, tail_lines=tail
            )
            out.print_json(chunk.model_dump_json())
            return
        if follow:
            _follow_streams(client, execution_id, streams, offset)
            return
        whole = tail is not None or tail_bytes is not None
        for name in streams:
            _print_log(
                client, execution_id, name, offset, None if whole else limit, tail, tail_bytes
            )
    except ShellyardError as exc:
        fail(exc)


def cancel(
    execution_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    wait_s: Annotated[float, typer.Option(help="Wait this long for the final state.")] = 15.0,
    as_json: JsonOption = False,
) -> None:
    """Cancel an execution (SIGTERM, then the whole sandbox after the grace period)."""
    try:
        print_view(_client(home, agent).cancel(execution_id, wait_s), as_json)
    except ShellyardError as exc:
        fail(exc)


def input_verb(
    execution_id: Annotated[str, typer.Argument(help="an execution run interactive or tty")],
    text: Annotated[str | None, typer.Option("--text", help="characters as typed")] = None,
    keys: Annotated[
        list[str] | None,
        typer.Option(
            "--key",
            help="a key by its tmux name (Enter, Tab, Escape, Up, BSpace, C-c, C-d, M-x ...), "
            "sent after the text; repeat for more",
        ),
    ] = None,
    eof: Annotated[
        bool, typer.Option("--eof", help="then end the input (stdin closed; a terminal: C-d)")
    ] = False,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Send input to a running command started with --interactive or --tty (text, then
    keys, then end of input); prints how many bytes it took."""
    result = run_as(home, agent, lambda c: c.input(execution_id, text, keys or [], eof))  # E13
    if as_json:
        print_json(result)
        return
    out.print(f"sent {result.accepted_bytes} bytes to {execution_id}")


# ---------------------------------------------------------------- attach (E13)

#: Ctrl-] then ``d`` detaches (Ctrl-] is telnet's escape; docker's Ctrl-P Ctrl-Q is a key
#: readline and many REPLs use). Ctrl-] twice sends one Ctrl-].
DETACH_PREFIX = 0x1D
DETACH_KEY = ord("d")
#: How long the output follower waits at most between two reads of a quiet terminal (the
#: echo of a typed key comes within it).
ATTACH_POLL_S = 0.05


def terminal_size(fd: int) -> os.terminal_size | None:
    """The size of the terminal on ``fd``; None when it is none or says 0×0 (a pseudo-terminal
    nobody sized), which leaves the execution's as it is."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return size if size.lines > 1 and size.columns > 1 else None


def terminal_options() -> dict[str, Any]:
    """``tty=true`` and this terminal's size (the server's 24×80 when it has none)."""
    size = terminal_size(sys.stdin.fileno())
    sized = {"tty_rows": size.lines, "tty_cols": size.columns} if size else {}
    return {"tty": True, **sized}


def split_detach(data: bytes, armed: bool) -> tuple[bytes, bool, bool]:
    """What of the typed ``data`` to send, whether the detach key was typed, and whether a
    Ctrl-] waits for its second key (``armed``, carried from the previous read)."""
    send = bytearray()
    for byte in data:
        if armed:
            armed = False
            if byte == DETACH_KEY:
                return bytes(send), True, False
            send += (
                bytes([DETACH_PREFIX]) if byte == DETACH_PREFIX else bytes([DETACH_PREFIX, byte])
            )
        elif byte == DETACH_PREFIX:
            armed = True
        else:
            send.append(byte)
    return bytes(send), False, armed


class _Output(threading.Thread):
    """Writes the terminal's output (the stdout log, exact bytes, from ``offset``) to this
    terminal until the execution ends and all of it was written. Its own client: the input
    loop's calls never wait behind a read. Caught up, it reads again after a pause that grows
    from 5 ms to ``ATTACH_POLL_S``; a key sent (``typed``) ends the pause, so its echo comes
    within a round trip or two."""

    def __init__(self, client: Client, execution_id: str, offset: int) -> None:
        super().__init__(name="attach-output", daemon=True)
        self.client, self.execution_id, self.offset = client, execution_id, offset
        self.error: ShellyardError | None = None
        self.typed = threading.Event()

    def run(self) -> None:
        sink, pause = sys.stdout.buffer, 0.0
        try:
            while True:
                page = self.client.logs(
                    self.execution_id, "stdout", self.offset, MAX_LOG_PAGE, raw=True
                )
                data = page.raw()
                if data:
                    sink.write(data)
                    sink.flush()
                self.offset = page.next_offset
                if page.complete or (not data and page.state.terminal):
                    return
                pause = 0.0 if data else min(ATTACH_POLL_S, max(0.005, pause * 2))
                if pause and self.typed.wait(pause):
                    self.typed.clear()
                    pause = 0.0
        except ShellyardError as exc:
            self.error = exc


def _draw_screen(client: Client, execution_id: str) -> int:
    """Attaching to a terminal already running: draw what it shows now (its earlier output
    replayed could be megabytes of redraws) and return where its output goes on from."""
    offset = client.logs(execution_id, "stdout", 0, 1, raw=True).size
    screen = client.screen(execution_id)
    sys.stdout.write("\x1b[H\x1b[2J" + "\r\n".join(screen.text.split("\n")))
    sys.stdout.write(f"\x1b[{screen.cursor.row + 1};{screen.cursor.col + 1}H")
    sys.stdout.flush()
    return offset


def attach_to(client: Client, reader: Client, execution_id: str, *, replay: bool = True) -> int:
    """Join this terminal to the execution's: typed bytes go to it, its output comes here, a
    resize of this terminal resizes it. Returns its exit code once it ends, or 0 when
    detached (it goes on running). ``replay``: from its first byte (``run --tty``), else from
    what its screen shows now."""
    view = client.status(execution_id)
    if not view.tty:
        raise InvalidInput(
            f"{execution_id} has no terminal (it was not run with tty=true): "
            f"'shellyard logs --follow {execution_id}' shows its output"
        )
    stdin = sys.stdin.fileno()
    on_tty = os.isatty(stdin)
    resized = threading.Event()
    saved = termios.tcgetattr(stdin) if on_tty else None
    try:
        if saved is not None:
            previous = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
            resized.set()  # the execution takes this terminal's size from the start
            tty.setraw(stdin)
        offset = 0 if replay or not on_tty else _draw_screen(client, execution_id)
        output = _Output(reader, execution_id, offset)
        output.start()
        detached = _pump_input(client, execution_id, stdin, output, resized)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            signal.signal(signal.SIGWINCH, previous)
    if detached:
        err.print(
            f"\nshellyard: detached; {execution_id} goes on "
            f"('shellyard attach {execution_id}' comes back)",
            highlight=False,
            soft_wrap=True,  # a command to copy: the terminal wraps it, no newline is put in
        )
        return 0
    if output.error is not None:
        raise output.error
    final = client.wait(execution_id, 30)
    if final.error:
        err.print(f"shellyard: {final.state.value}: {final.error}", highlight=False)
    return final.exit_code if final.exit_code is not None else EXIT_BY_STATE.get(final.state, 1)


def _pump_input(
    client: Client, execution_id: str, stdin: int, output: _Output, resized: threading.Event
) -> bool:
    """Send what is typed until the execution ends (False) or the detach key (True)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    armed, reading = False, True
    while output.is_alive():
        if resized.is_set():
            resized.clear()
            size = terminal_size(stdin)
            if size is not None:
                # Refused (still queued, or ended this instant): the attach goes on at the
                # size it has; the next SIGWINCH tries again.
                with contextlib.suppress(ShellyardError):
                    client.resize(execution_id, rows=size.lines, cols=size.columns)
        if not reading:
            output.join(ATTACH_POLL_S)
            continue
        ready, _, _ = select.select([stdin], [], [], ATTACH_POLL_S)
        if not ready:
            continue
        data = os.read(stdin, 4096)
        if not data:  # stdin was a file or pipe, now read: the output goes on to the end
            reading = False
            continue
        send, detach, armed = split_detach(data, armed)
        text = decoder.decode(send)
        if text:
            try:
                client.input(execution_id, text=text)
                output.typed.set()
            except ShellyardError:
                if client.status(execution_id).state.terminal:
                    continue  # it ended as the key was typed: the output says the rest
                raise
        if detach:
            return True
    return False


def attach(
    execution_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
) -> None:
    """Attach this terminal to an execution run with a terminal (run --tty, tty=true): what
    you type goes to it, its output comes here. Ctrl-] d detaches and leaves it running;
    otherwise exits with its exit code when it ends."""
    try:
        code = attach_to(_client(home, agent), _client(home, agent), execution_id, replay=False)
    except ShellyardError as exc:
        fail(exc)
    raise typer.Exit(code)


def screen(
    execution_id: str,
    home: HomeOption = None,
    agent: AgentOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print the terminal of a tty execution as a person would see it now."""
    now = run_as(home, agent, lambda client: client.screen(execution_id))
    if as_json:
        out.print_json(now.model_dump_json())
    else:
        sys.stdout.write(now.text + "\n")
