"""Runner limits (R2; docs/limits.md): settings, how an execution ended, what ``info`` shows.

The enforcement lives beside: ``watcher.py`` watches running commands (workspace quota and
retained-log cap), ``logcap.py`` cuts and reads logs, ``quota.py`` measures a tree,
``reserve.py`` keeps the free-space reserve. rlimits (processes, memory, file size, open files,
CPU time) are set on bwrap by ``sandbox/bwrap.py``'s ``sandbox_limits`` (through
``sandbox/launch.py``).
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Mapping
from pathlib import Path

from shellyard.errors import InvalidInput
from shellyard.runner.protocol import RunnerLimits, SandboxPolicy

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)

#: Seconds between CPU-time soft limit (SIGXCPU) and hard limit (SIGKILL): the soft one is
#: what tells the record which limit ended the command; with soft == hard the kernel sends
#: SIGKILL at once and nothing distinguishes it from any other kill.
CPU_HARD_GRACE_S = 1

#: The environment variables read by ``limits_from_env`` (config and the runner daemon).
ENV_QUOTA = "SHELLYARD_WORKSPACE_QUOTA"
ENV_LOG_LIMIT = "SHELLYARD_LOG_LIMIT"
ENV_RESERVE = "SHELLYARD_FREE_SPACE_RESERVE"
ENV_CPU = "SHELLYARD_CPU_LIMIT"


def parse_size(raw: str, what: str) -> int:
    """Bytes from ``1073741824``, ``512K``, ``50M``, ``10G``, ``1T`` (binary units; a
    trailing ``B``/``iB`` is accepted). ``0`` means none where the setting allows it."""
    match = _SIZE.match(raw)
    if match is None:
        raise InvalidInput(
            f"{what} must be a number of bytes, optionally with a K, M, G or T suffix "
            f"(e.g. 10G or 50M), not {raw!r}"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def format_size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def limits_from_env(policy: SandboxPolicy, environ: Mapping[str, str]) -> SandboxPolicy:
    """Apply ``SHELLYARD_WORKSPACE_QUOTA``, ``SHELLYARD_LOG_LIMIT`` (sizes, 0 = none),
    ``SHELLYARD_FREE_SPACE_RESERVE`` (a size, or a percentage such as ``5%``) and
    ``SHELLYARD_CPU_LIMIT`` (seconds, 0 = none) to ``policy``."""
    update: dict[str, object] = {}
    if raw := environ.get(ENV_QUOTA, "").strip():
        update["workspace_quota_bytes"] = parse_size(raw, ENV_QUOTA)
    if raw := environ.get(ENV_LOG_LIMIT, "").strip():
        update["log_limit_bytes"] = parse_size(raw, ENV_LOG_LIMIT)
    if raw := environ.get(ENV_RESERVE, "").strip():
        update.update(parse_reserve(raw, ENV_RESERVE))
    if raw := environ.get(ENV_CPU, "").strip():
        update["max_cpu_seconds"] = parse_cpu(raw, ENV_CPU)
    return policy.model_copy(update=update) if update else policy


def parse_reserve(raw: str, what: str) -> dict[str, object]:
    """``5%`` → a percentage (with the 2 GiB floor); a size → exactly that many bytes."""
    text = raw.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            percent = -1.0
        if not 0 <= percent <= 90:
            raise InvalidInput(f"{what} as a percentage must be between 0% and 90%, not {raw!r}")
        return {"free_space_reserve_percent": percent, "free_space_reserve_bytes": None}
    return {"free_space_reserve_bytes": parse_size(text, what)}


def parse_cpu(raw: str, what: str) -> int | None:
    try:
        seconds = int(raw)
    except ValueError:
        raise InvalidInput(
            f"{what} must be whole seconds of CPU time (0: none), not {raw!r}"
        ) from None
    if seconds < 0:
        raise InvalidInput(f"{what} must be zero or more seconds, not {raw!r}")
    return seconds or None


def cpu_limit(policy: SandboxPolicy) -> tuple[int, int] | None:
    """The CPU-time rlimit (soft, hard): soft at the limit (SIGXCPU), hard one second later."""
    if policy.max_cpu_seconds is None:
        return None
    soft = policy.max_cpu_seconds
    return soft, soft + CPU_HARD_GRACE_S


def ended_by(exit_code: int | None, policy: SandboxPolicy) -> tuple[str, str] | None:
    """(limit, sentence) when the exit status says an rlimit's signal ended the command.

    bwrap reports a command killed by signal N as exit code 128 + N (measured: SIGXCPU 152,
    SIGXFSZ 153); a shell in between reports the same number. A command that itself exits
    with 152 or 153 is indistinguishable; these numbers are rare enough to name the limit."""
    if exit_code == 128 + signal.SIGXCPU and policy.max_cpu_seconds is not None:
        return "cpu", (
            f"ended by SIGXCPU: the CPU-time limit of {policy.max_cpu_seconds} s per process "
            f"was reached (SHELLYARD_CPU_LIMIT)"
        )
    if exit_code == 128 + signal.SIGXFSZ:
        return "file_size", (
            f"ended by SIGXFSZ: a file grew past the file-size limit of "
            f"{format_size(policy.max_file_size_bytes)} (max_file_size_bytes)"
        )
    return None


def probe_cgroup_v2() -> str | None:
    """The delegated cgroup v2 folder this process may create children in, or None.

    Delegation means: the unified hierarchy is mounted, this process's cgroup (``0::/path``)
    is writable by us, and its ``cgroup.subtree_control`` can enable memory and pids. A host
    with only cgroup v1 controllers (or v2 without delegation) gets None: rlimits apply."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = next((line[3:] for line in lines if line.startswith("0::")), None)
    if unified is None:
        return None
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        base = Path(mount + unified.rstrip("/"))
        controllers = base / "cgroup.controllers"
        try:
            available = controllers.read_text().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(available) and os.access(base, os.W_OK):
            return str(base)
    return None


def runner_limits(
    policy: SandboxPolicy, reserve: int, free: int, margin: int, cgroup: str | None
) -> RunnerLimits:
    return RunnerLimits(
        workspace_quota_bytes=policy.workspace_quota_bytes,
        quota_mechanism=(
            "none"
            if policy.workspace_quota_bytes == 0
            else f"tree watch every {policy.limit_check_interval_s:g} s, stop on excess"
        ),
        quota_margin_bytes=margin,
        log_limit_bytes=policy.log_limit_bytes,
        free_space_reserve_bytes=reserve,
        free_space_bytes=free,
        max_cpu_seconds=policy.max_cpu_seconds,
        max_memory_bytes=policy.max_memory_bytes,
        max_file_size_bytes=policy.max_file_size_bytes,
        max_processes=policy.max_processes,
        max_open_files=policy.max_open_files,
        enforcement="rlimits",
        cgroup=cgroup,
    )
