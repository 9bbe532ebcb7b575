"""mcp/stdio.py, the threads' way (stdin or stdout not a pipe): while ``shellyard mcp``
serves, stray output goes to stderr and only the wire reaches stdout; fd 1 is back
afterwards; an answer is its line, written and flushed in one call. In a child process (its
own descriptors), with real pipes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    from shellyard.mcp.stdio import _claimed_stdout, _Stdout

    async def main():
        with _claimed_stdout() as wire:
            print("stray", flush=True)
            os.write(1, b"stray fd\\n")
            out = _Stdout(wire)
            await out.write('{"jsonrpc":"2.0"}\\n')
            await out.flush()
            os.write(2, b"written\\n")
        print("after", flush=True)

    asyncio.run(main())
    """
)


def test_stray_output_misses_the_wire_and_fd_1_comes_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == '{"jsonrpc":"2.0"}\nafter\n'
    # Both stray writes (Python's and the descriptor's) went to stderr.
    assert done.stderr.splitlines() == ["stray", "stray fd", "written"]
