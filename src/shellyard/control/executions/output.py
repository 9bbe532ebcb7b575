"""E12: inline output capped at N characters for stdout+stderr together, keeping head
and tail with a marker; read from the runner in bounded chunks, never a whole log."""

from __future__ import annotations

from shellyard.runner.protocol import LogStream, Runner


def marker(omitted_chars: int) -> str:
    return (
        f"\n[... {omitted_chars} characters omitted; read the full log with execution_logs ...]\n"
    )


def split_budget(sizes: tuple[int, int], cap: int) -> tuple[int, int]:
    """Give each stream what it needs; when both are large, split the cap evenly."""
    out, err = sizes
    if out + err <= cap:
        return out, err
    half = cap // 2
    if out <= half:
        return out, cap - out
    if err <= half:
        return cap - err, err
    return half, cap - half


def safe_decode(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, leaving an incomplete trailing sequence undecoded.
    Returns (text, bytes consumed) so a pager's next offset stays on a character boundary."""
    cut = len(data)
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte, keep looking for the lead
        if byte & 0x80:
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
            if back < need:
                cut = len(data) - back
        break
    return data[:cut].decode("utf-8", "replace"), cut


async def read_span(
    runner: Runner, execution_id: str, stream: LogStream, start: int, length: int
) -> bytes:
    parts: list[bytes] = []
    offset, end = start, start + length
    while offset < end:
        chunk = await runner.read_log(execution_id, stream, offset, end - offset)
        if not chunk.data:
            break
        parts.append(chunk.data)
        offset = chunk.next_offset
    return b"".join(parts)


async def capped_stream(
    runner: Runner, execution_id: str, stream: LogStream, size: int, budget: int
) -> tuple[str, bool]:
    if size <= budget:
        text = (await read_span(runner, execution_id, stream, 0, size)).decode("utf-8", "replace")
        if len(text) <= budget:
            return text, False
    head_len = budget // 2
    tail_len = budget - head_len
    head = (await read_span(runner, execution_id, stream, 0, head_len)).decode("utf-8", "replace")
    tail_start = max(head_len, size - tail_len)
    tail = (await read_span(runner, execution_id, stream, tail_start, size - tail_start)).decode(
        "utf-8", "replace"
    )
    omitted = max(0, size - len(head.encode()) - len(tail.encode()))
    return head[:head_len] + marker(omitted) + (tail[-tail_len:] if tail_len else ""), True


async def capped_output(runner: Runner, execution_id: str, cap: int) -> tuple[str, str, bool]:
    sizes = (
        await runner.log_size(execution_id, "stdout"),
        await runner.log_size(execution_id, "stderr"),
    )
    out_budget, err_budget = split_budget(sizes, cap)
    stdout, cut_out = await capped_stream(runner, execution_id, "stdout", sizes[0], out_budget)
    stderr, cut_err = await capped_stream(runner, execution_id, "stderr", sizes[1], err_budget)
    return stdout, stderr, cut_out or cut_err


#: How much of a log one step of a line tail reads, going back from the end.
TAIL_SCAN_CHUNK = 64 << 10


def encode_page(data: bytes, encoding: str) -> tuple[str, int]:
    """A log page as ``(data, bytes used)``: base64 of every byte, or UTF-8 text that stops
    before an incomplete trailing character (the next page starts there)."""
    if encoding == "base64":
        import base64

        return base64.b64encode(data).decode("ascii"), len(data)
    return safe_decode(data)


async def line_tail_offset(
    runner: Runner, execution_id: str, stream: LogStream, size: int, lines: int
) -> int:
    """Where the last ``lines`` lines of a log of ``size`` bytes begin (a final newline ends
    the last line; it does not start another). Read back from the end ``TAIL_SCAN_CHUNK`` at a
    time: memory stays bounded whatever the log's length."""
    if lines <= 0 or size <= 0:
        return size
    end, seen, last = size, 0, size - 1
    while end > 0:
        start = max(0, end - TAIL_SCAN_CHUNK)
        chunk = await runner.read_log(execution_id, stream, start, end - start)
        base = chunk.offset
        if base >= end or not chunk.data:
            return base if base < size else size  # the rest was dropped (a cut log, R2)
        data = chunk.data[: end - base]
        at = len(data)
        while True:
            at = data.rfind(b"\n", 0, at)
            if at < 0:
                break
            if base + at != last:
                seen += 1
                if seen == lines:
                    return base + at + 1
        end = base
    return 0
