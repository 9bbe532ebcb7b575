"""Every ``SHELLYARD_*`` environment variable, declared once (docs/operations.md "Environment
variables"): what it sets, the values it takes, its default, and a check.

Light on purpose (the standard library and ``errors`` only): the CLI's fast path and the SDK
read the client-side variables through it without importing pydantic or the server. The server
(``Settings.from_env``) and the runner daemon call :func:`check_environment` at start, so a bad
value is refused there, naming the variable and the values it allows, instead of being taken
for a default later. The readers that turn a value into a setting (sizes, the network policy,
the uid range…) stay beside the setting; they use :func:`get` for the raw text.

``tests/unit/test_settings_env.py`` finds every ``SHELLYARD_*`` name under ``src/`` and checks
that it is declared here and listed in docs/operations.md's table (:func:`table` writes it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from shellyard.errors import InvalidInput

Check = Callable[[str], bool]


@dataclass(frozen=True)
class Variable:
    name: str
    #: The values it takes, as a reader would say them (the error message quotes this).
    allowed: str
    default: str
    description: str
    #: Who reads it: ``client`` (CLI, SDK, MCP door), ``server`` (the control plane), ``runner``
    #: (the local runner and ``runner serve``), ``sandbox`` (set by shellyard inside a command);
    #: several, comma-separated, for one that each of them reads.
    side: str
    check: Check | None = None


def _number(low: float | None = None, high: float | None = None) -> Check:
    def check(raw: str) -> bool:
        try:
            value = float(raw)
        except ValueError:
            return False
        return (low is None or value >= low) and (high is None or value <= high)

    return check


def _whole(low: int = 0, high: int | None = None) -> Check:
    def check(raw: str) -> bool:
        try:
            value = int(raw.strip())
        except ValueError:
            return False
        return value >= low and (high is None or value <= high)

    return check


def _one_of(*values: str) -> Check:
    return lambda raw: raw.strip().lower() in values


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_BOOLEAN = ("1", "true", "yes", "on", "0", "false", "no", "off")
#: Boolean values that mean yes.
TRUE = ("1", "true", "yes", "on")


def _size(raw: str) -> bool:
    return _SIZE.match(raw) is not None


def _size_or_percent(raw: str) -> bool:
    text = raw.strip()
    return _number(0, 90)(text[:-1]) if text.endswith("%") else _size(text)


def _uid_range(raw: str) -> bool:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", raw)
    return match is not None and 1000 <= int(match[1]) <= int(match[2]) <= 65533


def _absolute_paths(separator: str) -> Check:
    return lambda raw: all(p.strip().startswith("/") for p in raw.split(separator) if p.strip())


_NOTIFY = "webhook delivery and timers (docs/notifications.md)"
_SECONDS = "a number of seconds"

VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        # -- clients: CLI, SDK, MCP door
        Variable("SHELLYARD_HOME", "a folder", "~/.shellyard (root: /var/lib/shellyard)",
                 "The home: database, server.json, admin.token, the local runner's folder.",
                 "client"),
        Variable("SHELLYARD_TOKEN", "a token (admin or agent)", "the home's admin.token",
                 "The token every CLI verb, the SDK's for_home and the MCP door use.", "client"),
        Variable("SHELLYARD_AGENT", "an agent id or name", "none (the admin acts)",
                 "Act for this agent (--agent).", "client"),
        Variable("SHELLYARD_START_TIMEOUT_S", f"{_SECONDS}, more than 0", "30",
                 "How long a client waits for a server it started.", "client", _number(0.001)),
        Variable("SHELLYARD_MCP_TOOLS", "toolset names, comma-separated (docs/mcp.md)",
                 "default", "The MCP tools offered (`shellyard mcp --tools`).", "client"),
        Variable("SHELLYARD_LOG_LEVEL", "debug, info, warning, error", "warning",
                 "What is logged to stderr.", "client",
                 _one_of("debug", "info", "warning", "error")),
        Variable("SHELLYARD_LOG_FORMAT", "text, json", "text",
                 "`serve`'s log lines: text, or one JSON object a line.", "server",
                 _one_of("text", "json")),
        Variable("SHELLYARD_PORT", "a port, 0 to 65535 (0: any free one)",
                 "the port it had, else 0", "`serve`'s port.", "server", _whole(0, 65535)),
        Variable("SHELLYARD_LOOP", "auto, uvloop, asyncio", "auto",
                 "The event loop of `serve`, `mcp` and `runner serve`: auto is uvloop when it "
                 "can be imported, else asyncio's own; uvloop refuses to start without it "
                 "(docs/decisions.md).", "server, runner, client (mcp)",
                 _one_of("auto", "uvloop", "asyncio")),
        # -- the control plane
        Variable("SHELLYARD_DATABASE_URL", "sqlite:///PATH or postgresql+psycopg://…",
                 "sqlite:///HOME/shellyard.db",
                 "Where the records are (its reader words a bad URL itself).", "server"),
        Variable("SHELLYARD_BODY_IDLE_S", f"{_SECONDS}, more than 0", "30",
                 "A request body with no progress for this long is closed (docs/security.md).",
                 "server", _number(0.001)),
        Variable("SHELLYARD_BODY_TIMEOUT_S", f"{_SECONDS}, more than 0", "60",
                 "A request body not complete this long after its headers, plus a second per "
                 "64 KiB received, is answered 408 and closed (docs/security.md).",
                 "server", _number(0.001)),
        Variable("SHELLYARD_TRANSFER_MAX_ENTRIES", "a whole number, 1 or more", "100000",
                 "Most entries one transfer may name (docs/limits.md).", "server", _whole(1)),
        Variable("SHELLYARD_AGENT_TOKENS_PER_SESSION", "a whole number, 1 or more", "100",
                 "Most live agent tokens one session may hold (docs/security.md).", "server",
                 _whole(1)),
        Variable("SHELLYARD_LEASE_TTL_S", f"{_SECONDS} from 0.3 to 3600", "10",
                 "How long a dead replica's work waits to be taken over.", "server",
                 _number(0.3, 3600)),
        Variable("SHELLYARD_WEBHOOK_EXCEPTIONS", "host:port pairs, comma-separated", "none",
                 "Webhook destinations allowed although the address rules refuse them.",
                 "server"),
        Variable("SHELLYARD_WEBHOOK_MAX_ATTEMPTS", "a whole number, 1 or more", "8",
                 f"Attempts per webhook delivery; {_NOTIFY}.", "server", _whole(1)),
        Variable("SHELLYARD_WEBHOOK_RETRY_BASE_S", _SECONDS, "1",
                 f"First retry delay (doubles each time); {_NOTIFY}.", "server", _number(0)),
        Variable("SHELLYARD_WEBHOOK_RETRY_MAX_S", _SECONDS, "60",
                 f"Longest retry delay; {_NOTIFY}.", "server", _number(0)),
        Variable("SHELLYARD_WEBHOOK_TIMEOUT_S", _SECONDS, "10",
                 f"One delivery's timeout; {_NOTIFY}.", "server", _number(0.001)),
        Variable("SHELLYARD_TIMER_PAST_GRACE_S", _SECONDS, "10",
                 f"How far in the past a timer's `at` may lie; {_NOTIFY}.", "server", _number(0)),
        Variable("SHELLYARD_TIMER_LATE_AFTER_S", _SECONDS, "60",
                 f"A timer fired this late is marked late; {_NOTIFY}.", "server", _number(0)),
        Variable("SHELLYARD_TIMER_POLL_S", _SECONDS, "30",
                 f"How often the scheduler looks at the database; {_NOTIFY}.", "server",
                 _number(0.001)),
        # -- the runner (local and `runner serve`)
        Variable("SHELLYARD_NETWORK", "off, egress, host (on: host)", "off",
                 "Commands' network (docs/security.md).", "runner",
                 _one_of("off", "egress", "host", "on")),
        Variable("SHELLYARD_TOOL_NETWORK", "off, egress, host (on: host)",
                 "docs/environments.md", "Package tools' network.", "runner",
                 _one_of("off", "egress", "host", "on")),
        Variable("SHELLYARD_EGRESS_ALLOW", "host names or addresses, comma-separated", "none",
                 "Where `egress` may go besides package sources.", "runner"),
        Variable("SHELLYARD_EGRESS_EXCEPTIONS", "host:port pairs, comma-separated", "none",
                 "Egress destinations allowed although the address rules refuse them.",
                 "runner"),
        Variable("SHELLYARD_HOST_PATHS", "absolute paths, colon-separated", "none",
                 "Host folders mounted read-only into every sandbox.", "runner",
                 _absolute_paths(":")),
        Variable("SHELLYARD_ALLOWED_SOURCES", "package channels, comma-separated",
                 "PyPI, CRAN, conda-forge (docs/environments.md)",
                 "The package sources environments may use.", "runner"),
        Variable("SHELLYARD_AGENT_LOCAL_SOURCES", "absolute paths, colon-separated", "none",
                 "Host folders agents may name as local package sources.", "runner"),
        Variable("SHELLYARD_PACKAGES_OFFLINE", ", ".join(_BOOLEAN), "0",
                 "Local package sources only (`--packages-offline`).", "runner",
                 _one_of(*_BOOLEAN)),
        Variable("SHELLYARD_SOURCE_STALL_S", f"{_SECONDS} from 0.001 to 3600", "60",
                 "How long a reader of a local package source may send nothing before it "
                 "is killed and the environment change fails (docs/environments.md).",
                 "runner", _number(0.001, 3600)),
        Variable("SHELLYARD_PACKAGE_REGISTRIES", "host or host:port names, comma-separated "
                 "(none: no registry)", "the hosts the allowed sources name",
                 "Package registries the egress proxy may dial in a documentation or "
                 "benchmarking address block (docs/security.md).", "runner"),
        Variable("SHELLYARD_BASES", "a folder",
                 "/var/lib/shellyard/bases (root), ~/.cache/shellyard/bases",
                 "Where base environments are built, shared by every home of the host.",
                 "runner"),
        Variable("SHELLYARD_DEFAULT_ENVIRONMENT", "python-base, r-base, none", "python-base",
                 "The environment of commands without environment_id.", "runner",
                 _one_of("python-base", "r-base", "none")),
        Variable("SHELLYARD_WORKSPACE_QUOTA", "a size (10G, 500M; 0: none)", "none",
                 "Most bytes a workspace may hold (docs/limits.md).", "runner", _size),
        Variable("SHELLYARD_LOG_LIMIT", "a size (0: none)", "docs/limits.md",
                 "Most bytes kept of one execution's log (docs/limits.md).", "runner", _size),
        Variable("SHELLYARD_FREE_SPACE_RESERVE", "a size, or a percentage up to 90%", "5%",
                 "Free space commands may not take (docs/limits.md).", "runner",
                 _size_or_percent),
        Variable("SHELLYARD_CPU_LIMIT", "whole seconds (0: none)", "none",
                 "CPU time per execution (docs/limits.md).", "runner", _whole(0)),
        Variable("SHELLYARD_MEMORY_LIMIT", "a size (0: none)", "half the host's memory",
                 "Memory per execution (docs/limits.md).", "runner", _size),
        Variable("SHELLYARD_PROCESS_LIMIT", "a whole number (0: none)", "docs/limits.md",
                 "Processes per workspace.", "runner", _whole(0)),
        Variable("SHELLYARD_CPU_CEILING", "cores, a number (0: none)", "none",
                 "Cores per workspace.", "runner", _number(0)),
        Variable("SHELLYARD_CGROUPS", "auto, v2, v1, off", "auto",
                 "Which control groups bound executions.", "runner",
                 _one_of("auto", "v2", "v1", "off")),
        Variable("SHELLYARD_CGROUP_FAVORDYNMODS", "on, off", "on",
                 "A root runner with cgroups turns on the kernel's favordynmods (host-wide: "
                 "a move into a group waits only for its own process; docs/limits.md).",
                 "runner", _one_of("on", "off")),
        Variable("SHELLYARD_UID_RANGE", "FIRST-LAST, uids between 1000 and 65533",
                 "docs/security.md", "The workspaces' own uids (root runners).", "runner",
                 _uid_range),
        Variable("SHELLYARD_BASE_SHARING", "auto, copies, links", "auto",
                 "How an environment made --from a base gets its files: copies (no inode "
                 "shared), links (hard links: fast, but their link count tells every session "
                 "how many environments were made from the base); auto: copies when "
                 "workspaces have uids of their own (docs/environments.md).", "runner",
                 _one_of("auto", "copies", "links")),
        Variable("SHELLYARD_NETWORK_LINGER_S", f"{_SECONDS}, 0 or more", "30",
                 "How long a workspace's network outlives its last command.", "runner",
                 _number(0)),
        Variable("SHELLYARD_WARM_SANDBOXES", "a whole number, 0 or more", "16",
                 "Warm sandboxes a runner keeps ready, one per recently used workspace "
                 "(docs/operations.md); 0: none.", "runner", _whole(0, 1024)),
        Variable("SHELLYARD_WARM_IDLE_S", f"{_SECONDS}, more than 0", "60",
                 "How long a warm sandbox waits for its workspace's next command.", "runner",
                 _number(0.001)),
        Variable("SHELLYARD_WARM_AFTER_MS", "a number of milliseconds, 0 or more", "20",
                 "A workspace's next warm sandbox is made once its command has run this long, "
                 "or when it ends if sooner; 0: at the start.", "runner", _number(0.0)),
        Variable("SHELLYARD_OWN_MOUNTS", "off, on", "on",
                 "A root runner's overlay of its own per workspace, home and read view: no "
                 "host path in a sandbox's mountinfo; mounted while in use (docs/security.md).",
                 "runner", _one_of("off", "on")),
        Variable("SHELLYARD_LAUNCHER", "auto, chain", "auto",
                 "The sandbox's launch: auto builds the small C launcher (the chain of "
                 "nsenter, setpriv and prlimit without a compiler); chain always uses the "
                 "chain.", "runner", _one_of("auto", "chain")),
        Variable("SHELLYARD_SANDBOX_SCHED", "batch, other", "batch",
                 "The scheduling policy of non-interactive sandboxes: batch (SCHED_BATCH: a "
                 "woken sandbox does not preempt the service) or other (the kernel's default); "
                 "terminals and stdin executions stay other.", "runner",
                 _one_of("batch", "other")),
        # -- set by shellyard inside each command's sandbox, never read from the host
        Variable("SHELLYARD_EXECUTION_ID", "set by shellyard", "the execution's id",
                 "Inside a command: its execution id.", "sandbox"),
        Variable("SHELLYARD_SANDBOX_ID", "set by shellyard", "warm-…",
                 "In a warm sandbox's own processes (not the command's): its id.", "sandbox"),
        Variable("SHELLYARD_WORKSPACE_ID", "set by shellyard", "the workspace's id",
                 "Inside a command: its workspace id.", "sandbox"),
    )
}  # fmt: skip


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value, stripped (None when unset or empty); ``name`` must be declared."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not declared in shellyard.settings_env")
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    return raw or None


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean variable: true for 1, true, yes, on."""
    return (get(name, environ) or "").lower() in TRUE


def invalid(environ: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per set variable whose value its check refuses."""
    source = os.environ if environ is None else environ
    problems = []
    for variable in VARIABLES.values():
        raw = source.get(variable.name, "").strip()
        if raw and variable.check is not None and not variable.check(raw):
            problems.append(f"{variable.name}={raw!r} is not valid: use {variable.allowed}")
    return problems


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse (InvalidInput) the start of a server or runner whose environment holds a value a
    variable does not take, naming each such variable and what it takes."""
    problems = invalid(environ)
    if problems:
        raise InvalidInput("; ".join(problems) + " (docs/operations.md, Environment variables)")


def table() -> str:
    """The Markdown table docs/operations.md holds (the test compares the names)."""
    rows = ["| Variable | Read by | Values | Default | What it sets |", "|---|---|---|---|---|"]
    for v in VARIABLES.values():
        rows.append(f"| `{v.name}` | {v.side} | {v.allowed} | {v.default} | {v.description} |")
    return "\n".join(rows)
