"""``shellyard mcp`` over stdio, read and written on the event loop.

The mcp package reads each message with a ``readline`` in a worker thread and writes each
answer with ``write`` then ``flush`` in worker threads: every message is a round trip to a
thread and back through the loop's self-pipe (docs/benchmarks.md §29, §57). When stdin and
stdout are pipes or sockets (how an MCP host starts a server), both are served here by the loop's
own pipe transports instead: a message read is parsed where it arrives, an answer is one
``write`` to the pipe (the kernel takes it at once unless the pipe is full; then it waits
in the transport's buffer while the loop goes on reading).

The descriptors are handled as the package does: the wire is a private duplicate of fd 0
and of fd 1, fd 0 points at the null device and fd 1 at stderr while serving (a child reads
EOF, a stray print never lands in the protocol), and both are put back at the end, blocking
again. Anything else (a terminal, a file, stderr's pipe, one socket for both, another async
library: ``_on_pipes``) is served the package's way, with each answer's write and flush in one
thread hop (``_Stdout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import select
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from typing import IO, Any, cast

import anyio
import anyio.to_thread
import mcp_types as types
import sniffio
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import (
    ContextReceiveStream,
    ContextSendStream,
    create_context_streams,
)
from mcp.shared.message import SessionMessage
from opentelemetry import trace

from shellyard import loops
from shellyard.contract.executions import MAX_WAIT_MS

#: What one read from stdin asks for, and the reader's buffer before it stops reading.
_BLOCK = 64 * 1024

#: Most bytes of one message (a line): the bound of a message to /mcp over HTTP
#: (api/bounds.py ``MAX_JSON_BODY``). A longer line was kept whole, and a host writing one
#: without its newline grew the server without end (300 MiB: 850 MiB resident).
MAX_LINE = 8 << 20

#: Requests read and not yet answered past which stdin is not read while stdout is backed up
#: (the host is not reading it). The server runs each request read as a task of its own that
#: holds its answer until stdout takes it: a host that sent requests and stopped reading grew
#: it without end (20,000 ``tools/list``: ~1 GiB, as with the package's reader on main).
MAX_OWED = 64
#: Requests owed past which stdin is not read at all until some are answered: the answers
#: of requests just read are not written yet, so the host reads nothing back at first.
MAX_OWED_EVER = 1024

#: How long the last answers may take to leave once the server is done.
_FLUSH_S = 5.0

#: After stdin's end (or the last answer since), the longest wait for the answers of the
#: requests read before it. The package's dispatcher cancels every call still running when
#: its input ends, so a host that wrote its requests and closed stdin
#: (``printf '…' | shellyard mcp``) lost the answers still in flight; the end is now handed
#: on once each is answered (or was cancelled by the host). Every tool answers within
#: ``wait_ms`` of its start (at most MAX_WAIT_MS: a run still going answers ``running``
#: then), but a call may start late: past the client's connections to the control plane
#: (httpx's pool held 100; the lean client of sdk/lean.py holds ``MAX_BUSY``, 224) calls
#: wait for one, so 130 calls in flight lost 30 answers when this was counted from stdin's
#: end alone. Counted from the last answer too, it is met only by a call that waits on the
#: host (an elicitation it will never answer) or a wedged one; docs/decisions.md.
EOF_WAIT_S = MAX_WAIT_MS / 1000 + 5.0


class _Stdout:
    """What the package's stdout writer calls (``write``, ``flush``), for one binary pipe."""

    def __init__(self, wire: IO[bytes]) -> None:
        self._wire = wire

    async def write(self, text: str) -> None:
        await anyio.to_thread.run_sync(self._write, text.encode())

    def _write(self, data: bytes) -> None:
        self._wire.write(data)
        self._wire.flush()

    async def flush(self) -> None:
        return None  # flushed with each write, in the same hop


def _stdout_diversion() -> int:
    try:
        return os.dup(2)
    except OSError:  # no stderr: stray output goes nowhere, as with the package's own
        return os.open(os.devnull, os.O_WRONLY)


def _stdin_diversion() -> int:
    return os.open(os.devnull, os.O_RDONLY)


@contextlib.contextmanager
def _claimed(fd: int, diversion: Callable[[], int]) -> Iterator[int]:
    """A private duplicate of ``fd`` (the wire), with ``fd`` pointed at ``diversion()``
    meanwhile and put back at the end."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        other = diversion()
        try:
            os.dup2(other, fd)
        finally:
            os.close(other)
    except OSError:
        os.close(private)
        raise
    try:
        yield private
    finally:
        os.dup2(private, fd)
        os.close(private)


@contextlib.contextmanager
def _claimed_stdout() -> Iterator[IO[bytes]]:
    """The wire (a private duplicate of fd 1) as a buffered file, with fd 1 pointed at
    stderr meanwhile."""
    with _claimed(1, _stdout_diversion) as private:
        wire = os.fdopen(private, "wb", buffering=64 * 1024, closefd=False)
        try:
            yield wire
        finally:
            with contextlib.suppress(OSError, ValueError):
                wire.flush()
            wire.close()


def _identity(fd: int) -> tuple[int, int, int] | None:
    try:
        found = os.fstat(fd)
    except OSError:
        return None
    return found.st_mode, found.st_dev, found.st_ino


def _on_pipes() -> bool:
    """stdin and stdout are what the loop's pipe transports serve: each a pipe or a socket,
    not stderr's (``2>&1``: the transport makes its wire non-blocking, and a stray write to
    stderr must never fail for that), nor one socket for both (the write transport takes
    its socket turning readable for the peer's end, and a request would close it). A
    terminal or a regular file is left to the package's threads: epoll refuses a file, and
    a terminal is the shell's too, which must not be left non-blocking."""
    stdin, stdout, stderr = _identity(0), _identity(1), _identity(2)
    if stdin is None or stdout is None:
        return False
    for found in (stdin, stdout):
        if not (stat.S_ISFIFO(found[0]) or stat.S_ISSOCK(found[0])):
            return False
        if stderr is not None and found[1:] == stderr[1:]:
            return False
    return stdin[1:] != stdout[1:]


def _parsed(line: bytes) -> SessionMessage | Exception:
    """One line of stdin as the package's reader makes it: decoded as UTF-8 with errors
    replaced, then validated; a line that is not a message is handed on as its error."""
    text = (line[:-1] if line.endswith(b"\r") else line).decode("utf-8", "replace") + "\n"
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except Exception as exc:
        return exc


def _too_long() -> Exception:
    return ValueError(
        f"a line of more than {MAX_LINE} bytes on stdin was dropped: the most one message may "
        "have (as for /mcp over HTTP)"
    )


class _Wire(asyncio.Protocol):
    """The stdout transport's protocol: ``drain`` waits while the transport holds more than
    its high-water mark (the host is slow to read) and raises once the pipe is gone."""

    def __init__(self) -> None:
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        #: Set whenever writing resumes or the pipe goes: the reader may go on (``drain``'s
        #: waiter is the writer's own).
        self.changed = asyncio.Event()
        self._lost: BaseException | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.changed.set()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or BrokenPipeError("stdout closed")
        self.changed.set()
        self._wake()
        if not self.closed.done():
            self.closed.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    async def room(self, owed: _Owed, hangup: _HangUp | None = None) -> bool:
        """Return once the host may send more: it owes fewer than :data:`MAX_OWED` answers or
        reads them (the transport takes writes), and fewer than :data:`MAX_OWED_EVER`; or the
        pipe is gone. False once the host closed stdin :data:`EOF_WAIT_S` ago (``hangup``),
        no answer left since as long, and it still does not read: the reader held back never
        reaches stdin's end, and such a host kept the server for ever."""
        while self._lost is None and (
            len(owed.ids) >= MAX_OWED_EVER or (self._paused and len(owed.ids) >= MAX_OWED)
        ):
            if hangup is not None and hangup.seen() and hangup.passed(owed):
                return False
            self.changed.clear()
            # with a hang-up to watch for, looked at each second (the host reads nothing)
            with anyio.move_on_after(1.0 if hangup is not None else math.inf):
                await self.changed.wait()
        return True

    async def settled(self, owed: _Owed, deadline: float) -> None:
        """Return once every request read is answered (or cancelled), the pipe is gone, or
        ``owed.until(deadline)`` passed (it moves with each answer)."""
        with anyio.CancelScope() as scope:
            while self._lost is None and owed.ids:
                scope.deadline = owed.until(deadline)
                self.changed.clear()
                await self.changed.wait()

    async def drain(self) -> None:
        while True:
            if self._lost is not None:
                raise self._lost
            if not self._paused:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter


class _HangUp:
    """Whether the host closed its end of stdin, seen without reading it (POLLHUP on a pipe,
    POLLRDHUP on a socket), and :data:`EOF_WAIT_S` from when it was first seen."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.deadline: float | None = None

    def seen(self) -> bool:
        if self.deadline is None:
            poller = select.poll()
            poller.register(self._fd, select.POLLRDHUP)
            if any(events & (select.POLLHUP | select.POLLRDHUP) for _, events in poller.poll(0)):
                self.mark()
        return self.deadline is not None

    def mark(self) -> None:
        if self.deadline is None:
            self.deadline = anyio.current_time() + EOF_WAIT_S

    def passed(self, owed: _Owed) -> bool:
        """:data:`EOF_WAIT_S` passed since the hang-up and since the last answer."""
        return self.deadline is not None and anyio.current_time() >= owed.until(self.deadline)


class _GaveUp(Exception):
    """The host closed stdin :data:`EOF_WAIT_S` ago and reads nothing: stop reading."""


class _Owed:
    """The ids of the host's requests read and not yet answered, nor cancelled by the host
    (a cancelled request is never answered)."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        #: When the last request owed was answered (loop time).
        self.answered_at = -math.inf

    def until(self, deadline: float) -> float:
        """``deadline`` (:data:`EOF_WAIT_S` after stdin's end), or EOF_WAIT_S after the last
        answer if later: calls still answering are waited for (they may have started late)."""
        return max(deadline, self.answered_at + EOF_WAIT_S)

    @staticmethod
    def is_request(message: SessionMessage | Exception) -> bool:
        return isinstance(message, SessionMessage) and isinstance(
            message.message, types.JSONRPCRequest
        )

    def read(self, message: SessionMessage | Exception) -> None:
        if isinstance(message, Exception):
            return
        inner = message.message
        if isinstance(inner, types.JSONRPCRequest):
            self.ids.add(inner.id)
        elif isinstance(inner, types.JSONRPCNotification) and isinstance(inner.params, dict):
            cancelled = inner.params.get("requestId")
            # a request id is a number or a string; anything else (unhashable) names none
            if inner.method == "notifications/cancelled" and isinstance(cancelled, int | str):
                self.ids.discard(cancelled)

    def answered(self, message: SessionMessage) -> bool:
        """Whether ``message`` answered a request owed."""
        inner = message.message
        if isinstance(inner, types.JSONRPCResponse | types.JSONRPCError) and inner.id in self.ids:
            self.ids.discard(inner.id)
            self.answered_at = anyio.current_time()
            return True
        return False


async def _read_lines(
    reader: asyncio.StreamReader,
    out: ContextSendStream[SessionMessage | Exception],
    wire: _Wire | None = None,
    owed: _Owed | None = None,
    hangup: _HangUp | None = None,
) -> None:
    """Every line of ``reader`` to ``out`` until EOF (the last one even without its newline),
    then ``out`` closed: the server's end of input. A line past :data:`MAX_LINE` is not kept:
    its bytes are dropped as they come and it is handed on as an error. With ``wire`` and
    ``owed``: a request waits (and what follows it on stdin) while the host owes
    :data:`MAX_OWED` answers and does not read them, or owes :data:`MAX_OWED_EVER` (the
    pipe then holds the host back); and at EOF ``out`` is closed once every request read is
    answered or cancelled, the pipe is gone, or :data:`EOF_WAIT_S` passed (from the host's
    hang-up, ``hangup``, and from the last answer: then a reader held back stops, what the
    host left unread dropped)."""
    owed = owed if owed is not None else _Owed()

    async def send(message: SessionMessage | Exception) -> None:
        # Only a request waits: a cancellation or the host's answer to the server's own
        # request (which a call being answered may wait for) goes on at once.
        if wire is not None and owed.is_request(message) and not await wire.room(owed, hangup):
            raise _GaveUp()
        owed.read(message)
        await out.send(message)

    async with out:
        pending = bytearray()
        over = False  # the line being read is past MAX_LINE
        try:
            while chunk := await reader.read(_BLOCK):
                if b"\n" not in chunk:
                    if not over:
                        pending += chunk
                        if len(pending) > MAX_LINE:
                            over, pending = True, bytearray()
                    continue
                lines = chunk.split(b"\n")
                tail = lines.pop()
                lines[0] = bytes(pending) + lines[0]
                if over:
                    await send(_too_long())
                    lines.pop(0)
                for line in lines:
                    await send(_too_long() if len(line) > MAX_LINE else _parsed(line))
                over, pending = False, bytearray(tail)
            if over:
                await send(_too_long())
            elif pending:
                await send(_parsed(bytes(pending)))
        except _GaveUp:
            return
        if wire is not None:
            # stdin's end, handed on (``out`` closed) once the calls read are answered: the
            # dispatcher cancels the calls still running when its input ends
            deadline = anyio.current_time() + EOF_WAIT_S
            if hangup is not None:
                hangup.mark()
                deadline = hangup.deadline or deadline
            await wire.settled(owed, deadline)


async def _write_lines(
    transport: asyncio.WriteTransport,
    wire: _Wire,
    messages: ContextReceiveStream[SessionMessage],
    owed: _Owed | None = None,
) -> None:
    """Each answer as one line, in the order the server sent them: one writer, one
    ``write`` of the whole line each."""
    async with messages:
        async for message in messages:
            line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            transport.write(line.encode())
            if owed is not None and owed.answered(message):
                wire.changed.set()
            await wire.drain()


@contextlib.asynccontextmanager
async def loop_stdio(
    rfd: int, wfd: int
) -> AsyncIterator[
    tuple[ContextReceiveStream[SessionMessage | Exception], ContextSendStream[SessionMessage]]
]:
    """The server's two streams over ``rfd`` (read) and ``wfd`` (write), pipes or sockets
    served by the loop's transports. At the end every answer written is on its way (the
    transport's buffer emptied) and both descriptors are blocking again, as found."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_BLOCK, loop=loop)
    # ``rfd`` and ``wfd`` are the caller's (it puts fd 0 and fd 1 back from them): each
    # transport gets a duplicate of its own to close.
    with _blocking_kept(rfd, wfd):
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), _lent(loop, rfd, "rb")
        )
        try:
            write_transport, wire = await loop.connect_write_pipe(_Wire, _lent(loop, wfd, "wb"))
        except BaseException:
            read_transport.close()
            raise
        read_in, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, write_out = create_context_streams[SessionMessage](0)
        try:
            async with anyio.create_task_group() as group:
                owed = _Owed()
                group.start_soon(_read_lines, reader, read_in, wire, owed, _HangUp(rfd))
                group.start_soon(_write_lines, write_transport, wire, write_out, owed)
                yield read_stream, write_stream
                # The server is done and every answer is in the transport (or its writer is
                # waiting for the host to read): the last ones get _FLUSH_S here (a host that
                # never reads kept the writer waiting for ever), then _FLUSH_S to leave.
                group.cancel_scope.deadline = anyio.current_time() + _FLUSH_S
        finally:
            read_transport.close()
            write_transport.close()  # after what it holds is written (or the pipe is gone)
            # Bounded: a host that neither reads nor goes away must not hold the exit forever.
            with anyio.CancelScope(shield=True), anyio.move_on_after(_FLUSH_S):
                await wire.closed
            if not wire.closed.done():
                write_transport.abort()


@contextlib.asynccontextmanager
async def _answered_before_end(
    read_stream: ContextReceiveStream[SessionMessage | Exception],
    write_stream: ContextSendStream[SessionMessage],
) -> AsyncIterator[
    tuple[ContextReceiveStream[SessionMessage | Exception], ContextSendStream[SessionMessage]]
]:
    """The package's stdio streams (the threads' way) relayed, with the end of input handed on
    as :func:`_read_lines` does it: once every request read is answered or cancelled, stdout
    is gone, or :data:`EOF_WAIT_S` passed (since stdin's end and since the last answer)."""
    owed = _Owed()
    changed = anyio.Event()
    gone = False
    read_in, held_read = create_context_streams[SessionMessage | Exception](0)
    held_write, write_out = create_context_streams[SessionMessage](0)

    async def relay_in() -> None:
        nonlocal changed
        async with read_in:
            async with read_stream:
                try:
                    async for message in read_stream:
                        owed.read(message)
                        await read_in.send(message)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the server stopped reading before the end: nothing to hold
            deadline = anyio.current_time() + EOF_WAIT_S
            with anyio.CancelScope() as scope:
                while owed.ids and not gone:
                    scope.deadline = owed.until(deadline)  # moves with each answer
                    await changed.wait()
                    changed = anyio.Event()

    async def relay_out() -> None:
        nonlocal gone
        try:
            async with write_stream, write_out:
                async for message in write_out:
                    await write_stream.send(message)
                    if owed.answered(message):
                        changed.set()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the package's writer is gone (stdout closed): nothing more leaves
        finally:
            gone = True
            changed.set()

    reading = anyio.CancelScope()

    async def relay_in_until_done() -> None:
        with reading:
            await relay_in()

    async with anyio.create_task_group() as group:
        group.start_soon(relay_in_until_done)
        group.start_soon(relay_out)
        yield held_read, held_write
        # The server is done: stdin is not waited for (it may not have ended); the answers
        # go on leaving until the server's write stream is closed (it always closes it).
        reading.cancel()


def _lent(loop: asyncio.AbstractEventLoop, fd: int, mode: str) -> IO[bytes]:
    """A file over a duplicate of ``fd`` for a pipe transport, which closes that duplicate
    when it closes. asyncio's transport closes the file it was given (so the file owns the
    duplicate); uvloop's hands the descriptor to libuv, which closes the descriptor number
    itself whatever the file says, and then closes the file too (a second close of the same
    number, which another thread may have been given in between: the file must not own it
    there). Lent ``fd`` itself, uvloop closed the caller's descriptor (EBADF putting fd 1
    back: docs/decisions.md "uvloop")."""
    duplicate = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    return os.fdopen(duplicate, mode, buffering=0, closefd=loops.name(loop) != "uvloop")


@contextlib.contextmanager
def _blocking_kept(*fds: int) -> Iterator[None]:
    """``fds`` blocking at the end as they were found: the transports make them
    non-blocking, and their open files are the host's pipes (or a wrapper's) after us."""
    found = [(fd, os.get_blocking(fd)) for fd in fds]
    try:
        yield
    finally:
        for fd, blocking in found:
            with contextlib.suppress(OSError):
                os.set_blocking(fd, blocking)


def untraced(lowlevel: Any) -> None:
    """Without the package's OpenTelemetry middleware when nothing would record its spans
    (no tracer provider set, nor named by ``OTEL_PYTHON_TRACER_PROVIDER``): it opens a
    no-op span around every message, 2 % of the instructions of a tool call in
    ``shellyard mcp`` (docs/benchmarks.md §57). With a provider it stays, as the package
    has it."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        kept = [m for m in lowlevel.middleware if not isinstance(m, OpenTelemetryMiddleware)]
        lowlevel.middleware = kept


def _on_the_loop() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


async def run_stdio(server: MCPServer) -> None:
    """``server.run_stdio_async()``, with stdin and stdout on the event loop when they are
    pipes or sockets, else with one thread hop per answer written."""
    lowlevel: Any = server._lowlevel_server
    options = lowlevel.create_initialization_options()
    untraced(lowlevel)
    if _on_the_loop() and _on_pipes():
        with contextlib.ExitStack() as stack:
            try:
                rfd = stack.enter_context(_claimed(0, _stdin_diversion))
                wfd = stack.enter_context(_claimed(1, _stdout_diversion))
            except OSError:  # a descriptor that cannot be duplicated: the threads' way
                stack.close()
            else:
                async with loop_stdio(rfd, wfd) as (read_stream, write_stream):
                    await lowlevel.run(read_stream, write_stream, options)
                return
    with contextlib.ExitStack() as stack:
        try:
            wire = stack.enter_context(_claimed_stdout())
        except OSError:  # no usable fd 1 to duplicate: the package's own way
            await server.run_stdio_async()
            return
        stdout = cast(anyio.AsyncFile[str], _Stdout(wire))
        async with (
            stdio_server(stdout=stdout) as (read_stream, write_stream),
            _answered_before_end(read_stream, write_stream) as (held_read, held_write),
        ):
            await lowlevel.run(held_read, held_write, options)


__all__ = ["loop_stdio", "run_stdio", "untraced"]
