"""``shellyard shell-call``: one ``shell_call`` item as JSON on stdin, its
``shell_call_output`` item as JSON on stdout (S1). Errors are JSON on stderr, exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from shellyard.cli.common import HomeOption
from shellyard.errors import InvalidInput, ShellyardError
from shellyard.home import default_home

#: One item is small; anything longer is not a shell_call item.
MAX_ITEM_CHARS = 16 * 1024 * 1024


def _refuse(exc: ShellyardError) -> NoReturn:
    error = {"code": exc.code, "message": exc.message}
    sys.stderr.write(json.dumps({"error": error}) + "\n")
    raise typer.Exit(2)


async def _run(item: Any, home: Path, agent: str | None) -> dict[str, Any]:
    from shellyard.home import ensure_server
    from shellyard.sdk.client import AsyncClient
    from shellyard.shell_call.adapter import run_shell_call

    info = ensure_server(home)
    client = AsyncClient(info.url, info.token, agent_id=agent)
    try:
        return await run_shell_call(item, client)
    finally:
        await client.aclose()


def shell_call(
    home: HomeOption = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            envvar="SHELLYARD_AGENT",
            help="Run in this agent's workspace (default: the default session's main agent).",
        ),
    ] = None,
) -> None:
    """Run a shell_call item (JSON on stdin) and print its shell_call_output item (JSON).

    Example: echo '{"type":"shell_call","call_id":"c1","action":{"commands":["ls"]}}' |
    shellyard shell-call
    """
    from shellyard.shell_call.adapter import parse_shell_call

    text = sys.stdin.read(MAX_ITEM_CHARS + 1)
    try:
        if len(text) > MAX_ITEM_CHARS:
            raise InvalidInput(
                f"the shell_call item on stdin is longer than {MAX_ITEM_CHARS} characters"
            )
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(
                f"stdin is not JSON ({exc}); give one shell_call item as a JSON object"
            ) from None
        item = parse_shell_call(data)
        import asyncio

        result = asyncio.run(_run(item, home or default_home(), agent))
    except ShellyardError as exc:
        _refuse(exc)
    sys.stdout.write(json.dumps(result) + "\n")


def register(app: typer.Typer) -> None:
    app.command("shell-call")(shell_call)
