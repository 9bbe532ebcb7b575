"""The manual part of ``shellyard --help``: the product in a few lines, the verbs in groups,
an example per common task, and the exit codes. ``cli/app.py`` applies it once every module has
registered its verbs (``arrange``), so verbs added by other modules land in their group too."""

from __future__ import annotations

import typer

# The exit codes every verb uses live in ``exits`` (the typer-free fast path needs them).
from shellyard.cli.exits import EXIT_FAILED as EXIT_FAILED
from shellyard.cli.exits import EXIT_OK as EXIT_OK
from shellyard.cli.exits import EXIT_REFUSED as EXIT_REFUSED
from shellyard.cli.exits import EXIT_RETRY as EXIT_RETRY

SUMMARY = (
    "shellyard: a durable, sandboxed shell for AI agents.\n\n"
    "Every command runs as a fresh process in a bubblewrap sandbox inside a workspace, becomes "
    "a durable execution record (state, exit code, logs) and ends with a snapshot of the "
    "workspace's files. One control plane serves a home ($SHELLYARD_HOME); every verb but "
    "'serve' and 'runner serve' is its client and starts it in the background when needed. "
    "Every verb that prints a result takes --json."
)

_EXAMPLES = (
    ("Run a command, print its output, exit with its code", "shellyard run -- make test"),
    ("Start in the background, follow, check", "shellyard run -b -- ./train.sh"),
    ("", "shellyard logs --follow EXECUTION_ID"),
    ("", "shellyard status EXECUTION_ID --json"),
    ("Stream output live from the first byte", "shellyard run --follow -- pytest -x"),
    ("Stop a command", "shellyard cancel EXECUTION_ID"),
    ("A command on a terminal (Ctrl-] d detaches)", "shellyard run --tty -- python3"),
    ("", "shellyard attach EXECUTION_ID"),
    ("Files of the latest snapshot", "shellyard files ls src"),
    ("", "shellyard files get results/out.csv"),
    ("Copy between workspaces", "shellyard transfer start WS_A data --to WS_B"),
    ("A reminder in ten minutes", "shellyard timer create 'check the run' --after-ms 600000"),
    ("A managed environment", "shellyard env create py"),
    ("", "shellyard env install py pip numpy"),
    ("", "shellyard run --env py -- python -c 'import numpy'"),
    ("Tools for an agent host (MCP over stdio)", "shellyard mcp"),
    ("Another machine's runner", "shellyard runner add gpu1 http://gpu1:8765 --token T"),
)

EXIT_CODES = (
    (EXIT_OK, "done"),
    (EXIT_FAILED, "the operation ran and failed (a transfer or environment change that failed)"),
    (EXIT_REFUSED, "refused: bad input or usage, not found, not allowed in this state"),
    (EXIT_RETRY, "try again later: the workspace is busy or a runner is unreachable"),
    ("run", "the command's own exit code; 124 outcome unknown, 125 could not start, 130 cancelled"),
)


def epilog() -> str:
    lines = ["[b]Examples[/b]"]
    for what, command in _EXAMPLES:
        if what:
            lines.append(f"  {what}:")
        lines.append(f"    [cyan]{command}[/cyan]")
    lines += ["", "[b]Exit codes[/b] (an error also prints its code, e.g. not_found, on stderr)"]
    lines += [f"  {code!s:<5} {meaning}" for code, meaning in EXIT_CODES]
    lines += ["", "More in docs/cli.md, and 'shellyard VERB --help' for each verb."]
    return "\n".join(lines)


#: Help panels: the verbs grouped by task.
PANELS = {
    "run": "Commands",
    "status": "Commands",
    "logs": "Commands",
    "cancel": "Commands",
    "attach": "Commands",
    "input": "Commands",
    "screen": "Commands",
    "shell-call": "Commands",
    "port": "Commands",
    "files": "Files and transfers",
    "transfer": "Files and transfers",
    "artifact": "Files and transfers",
    "env": "Environments",
    "session": "Sessions, agents and reminders",
    "agent": "Sessions, agents and reminders",
    "inbox": "Sessions, agents and reminders",
    "timer": "Sessions, agents and reminders",
    "webhook": "Sessions, agents and reminders",
    "serve": "Serving",
    "mcp": "Serving",
    "runner": "Serving",
    "token": "Serving",
    "gc": "Serving",
    "backup": "Serving",
    "restore": "Serving",
    "ui": "Serving",
    "server": "Serving",
}


def arrange(app: typer.Typer) -> None:
    """Put every registered verb in its help panel."""
    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        command.rich_help_panel = PANELS.get(name.replace("_", "-"), "Other")
    for group in app.registered_groups:
        group.rich_help_panel = PANELS.get(group.name or "", "Other")
