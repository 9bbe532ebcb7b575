"""``shellyard input``: type into a running interactive execution (E13).

shellyard input ID --text 'yes' --key Enter     text, then keys (tmux names)
shellyard input ID --eof                        end of input (stdin closed; tty: C-d)
"""

from __future__ import annotations

from typing import Annotated

import typer

from shellyard.cli.common import AgentOption, HomeOption, JsonOption, out, print_json, run_as


def register(app: typer.Typer) -> None:
    app.command("input", no_args_is_help=True)(input_verb)


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
    result = run_as(home, agent, lambda c: c.input(execution_id, text, keys or [], eof))
    if as_json:
        print_json(result)
        return
    out.print(f"sent {result.accepted_bytes} bytes to {execution_id}")
