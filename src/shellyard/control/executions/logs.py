"""E6: one page of an execution's log (``stdout``, ``stderr``, or ``stdin``: what was sent
to an interactive execution, E13), from a byte offset, its last bytes or its last lines."""

from __future__ import annotations

from shellyard.contract.executions import ExecutionLogsQuery, ExecutionState, LogsResult
from shellyard.control.executions.output import encode_page, line_tail_offset
from shellyard.errors import InvalidInput
from shellyard.runner.protocol import MAX_READ_CHUNK, LogStream, Runner
from shellyard.store import Store
from shellyard.store.executions import Execution

STREAMS: tuple[LogStream, ...] = ("stdout", "stderr", "stdin")


def check_stream(stream: str) -> LogStream:
    """The stream asked for, or InvalidInput (before the record is read). The query model
    keeps ``stream`` a plain string (its OpenAPI parameter is one); its other bounds (no
    negative offset, limit or tail; the two encodings) are the model's own."""
    for name in STREAMS:
        if name == stream:
            return name
    raise InvalidInput(f"stream must be 'stdout', 'stderr' or 'stdin', not {stream!r}")


async def read_page(
    store: Store, runner: Runner, row: Execution, request: ExecutionLogsQuery
) -> LogsResult:
    """The page ``request`` asks of an owned record's log."""
    execution_id = row.id
    log_stream = check_stream(request.stream)
    offset, limit = request.offset, request.limit
    tail, tail_lines = request.tail, request.tail_lines
    pruned_at = row.logs_pruned_at
    state = ExecutionState(row.state)
    nothing = LogsResult.model_construct(
        execution_id=execution_id, stream=log_stream, data="", offset=0, next_offset=0,
        size=0, complete=True, state=state, logs_pruned_at=pruned_at,
    )  # fmt: skip
    if pruned_at is not None:
        # Retention deleted them (docs/operations.md): say so instead of failing the read.
        return nothing
    if state == ExecutionState.queued or row.started_at is None:
        return nothing.model_copy(update={"complete": state.terminal})
    if tail is not None:
        size = await runner.log_size(execution_id, log_stream)
        offset = max(0, size - tail)
        limit = min(tail, MAX_READ_CHUNK)
    elif tail_lines is not None:
        size = await runner.log_size(execution_id, log_stream)
        offset = await line_tail_offset(runner, execution_id, log_stream, size, tail_lines)
        limit = min(size - offset, MAX_READ_CHUNK)
    chunk = await runner.read_log(execution_id, log_stream, offset, min(limit, MAX_READ_CHUNK))
    text, used = encode_page(chunk.data, request.encoding)
    if state.terminal:
        await store.mark_notice_read("execution", execution_id)
    return LogsResult(
        execution_id=execution_id,
        stream=log_stream,
        data=text,
        offset=chunk.offset,
        # a whole chunk: the runner's next offset (past a cut log's dropped range, R2,
        # docs/limits.md)
        next_offset=chunk.next_offset if used == len(chunk.data) else chunk.offset + used,
        size=chunk.size,
        complete=chunk.complete and used == len(chunk.data),
        state=state,
        encoding=request.encoding,
    )
