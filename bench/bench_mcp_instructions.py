"""Instructions per ``run_shell(true)`` of ``shellyard mcp`` (stdio), this tree's ``src``
against another's, and of the REST SDK's ``AsyncClient.run`` alone: a CPU figure the load
of a shared machine does not move.

Each process runs under ``valgrind --tool=callgrind --instr-atstart=no`` (so its start is
not counted and runs at near native speed); after a warm-up, ``callgrind_control -i on``
counts the instructions of CALLS calls, then ``-i off``. The ``shellyard serve`` each
``shellyard mcp`` starts runs natively (valgrind does not follow children). The SDK side is
this tree's ``AsyncClient.run("true", ...)`` with the options the MCP door sends, against
this tree's server: what of ``shellyard mcp``'s count is the REST client's.

    PYTHONPATH=src:bench .venv/bin/python bench/bench_mcp_instructions.py --against SRC \
        [--calls N] [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from common import PYTHON, make_home, remove_home, stop_server

WARMUP = 20

#: The SDK side: WARMUP calls, then one line "ready" and waits for a line, then the
#: counted calls, then "done".
SDK_SCRIPT = """
import asyncio, sys
from shellyard.contract.executions import RunShellRequest
from shellyard.sdk.client import AsyncClient

async def main(url, token, calls):
    client = AsyncClient(url, token)
    options = RunShellRequest(command="true").model_dump(exclude={"command"})
    for _ in range(WARMUP):
        await client.run("true", **options)
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(calls):
        assert (await client.run("true", **options)).state == "completed"
    print("done", flush=True)
    await client.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def callgrind(out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def instructions(out: Path) -> int:
    for line in out.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def counting(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True,
                   capture_output=True)  # fmt: skip


async def mcp_side(src: Path, out: Path, calls: int) -> str:
    """``shellyard mcp`` of ``src`` under callgrind; the url and token of its server."""
    home = make_home()
    env = {**os.environ, "SHELLYARD_HOME": str(home), "PYTHONPATH": str(src)}
    argv = [*callgrind(out), PYTHON, "-m", "shellyard", "mcp", "--home", str(home)]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    try:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for _ in range(WARMUP):
                await session.call_tool("run_shell", {"command": "true"})
            found = subprocess.run(["pgrep", "-f", f"shellyard mcp --home {home}"],
                                   capture_output=True, text=True, check=True)  # fmt: skip
            pid = int(found.stdout.split()[0])
            counting(pid, True)
            for _ in range(calls):
                result = await session.call_tool("run_shell", {"command": "true"})
                if (result.structured_content or {}).get("state") != "completed":
                    raise RuntimeError(f"MCP run of true: {result.content}")
            counting(pid, False)
    finally:
        stop_server(home)
        remove_home(home)
    return str(src)


def sdk_side(out: Path, calls: int) -> None:
    from shellyard.home import ensure_server

    home = make_home()
    try:
        info = ensure_server(home)
        script = SDK_SCRIPT.replace("WARMUP", str(WARMUP))
        argv = [*callgrind(out), PYTHON, "-c", script, info.url, info.token, str(calls)]
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) as child:  # fmt: skip
            assert child.stdin is not None and child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("the SDK side did not start")
            counting(child.pid, True)
            child.stdin.write("go\n")
            child.stdin.flush()
            if child.stdout.readline().strip() != "done":
                raise RuntimeError("the SDK side did not finish")
            counting(child.pid, False)
            child.stdin.close()
            child.wait(timeout=120)
    finally:
        stop_server(home)
        remove_home(home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other tree's src")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    this = Path(__file__).resolve().parent.parent / "src"
    result: dict[str, Any] = {"calls": args.calls}
    with tempfile.TemporaryDirectory(prefix="shellyard-callgrind-") as folder:
        for name, src in (("this", this), ("against", args.against)):
            out = Path(folder) / f"{name}.out"
            asyncio.run(mcp_side(src, out, args.calls))
            result[f"mcp_{name}_instructions_per_call"] = instructions(out) // args.calls
        out = Path(folder) / "sdk.out"
        sdk_side(out, args.calls)
        result["sdk_run_instructions_per_call"] = instructions(out) // args.calls
    result["mcp_this_over_against"] = round(
        result["mcp_this_instructions_per_call"] / result["mcp_against_instructions_per_call"], 3
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
