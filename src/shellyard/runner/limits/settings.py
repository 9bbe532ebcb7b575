"""Runner limits (R2; docs/limits.md): settings, how an execution ended, what ``info`` shows.

The enforcement lives beside: ``watcher.py`` watches running commands (workspace quota and
retained-log cap), ``logcap.py`` cuts and reads logs, ``quota.py`` measures a tree,
``reserve.py`` keeps the free-space reserve. rlimits (processes, memory, file size, open files,
CPU time) are set on bwrap by ``sandbox/bwrap.py``'s ``sandbox_limits`` (through
``sandbox/launch.py``).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping

from shellyard.errors import InvalidInput
from shellyard.runner.limits.cgroups import CgroupTree
from shellyard.runner.limits.group_usage import Usage
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
#: R2 tenants (cgroups.py): memory per execution, processes and CPU ceiling per workspace,
#: the backend (auto, v2, v1, off), the uid range of workspaces (tenants.py).
ENV_MEMORY = "SHELLYARD_MEMORY_LIMIT"
ENV_PROCESSES = "SHELLYARD_PROCESS_LIMIT"
ENV_CPU_CEILING = "SHELLYARD_CPU_CEILING"
ENV_CGROUPS = "SHELLYARD_CGROUPS"
ENV_UID_RANGE = "SHELLYARD_UID_RANGE"
#: Copies or hard links of a base's files in an environment made ``--from`` it (derive.py).
ENV_BASE_SHARING = "SHELLYARD_BASE_SHARING"


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
    update.update(tenant_settings(environ))
    return policy.model_copy(update=update) if update else policy


def tenant_settings(environ: Mapping[str, str]) -> dict[str, object]:
    """``SHELLYARD_MEMORY_LIMIT`` (a size per execution), ``SHELLYARD_PROCESS_LIMIT``
    (processes per workspace), ``SHELLYARD_CPU_CEILING`` (cores per workspace, 0: none),
    ``SHELLYARD_CGROUPS`` (auto, v2, v1, off), ``SHELLYARD_UID_RANGE`` (``FIRST-LAST``) and
    ``SHELLYARD_BASE_SHARING`` (auto, copies, links)."""
    update: dict[str, object] = {}
    if raw := environ.get(ENV_MEMORY, "").strip():
        size = parse_size(raw, ENV_MEMORY)
        if size < 16 << 20:
            raise InvalidInput(f"{ENV_MEMORY} must be at least 16M, not {raw!r}")
        update["memory_limit_bytes"] = size
    if raw := environ.get(ENV_PROCESSES, "").strip():
        if not raw.isdigit() or int(raw) < 16:
            raise InvalidInput(
                f"{ENV_PROCESSES} must be a whole number of at least 16, not {raw!r}"
            )
        update["process_limit"] = int(raw)
    if raw := environ.get(ENV_CPU_CEILING, "").strip():
        try:
            cores = float(raw)
        except ValueError:
            cores = -1.0
        if cores < 0:
            raise InvalidInput(
                f"{ENV_CPU_CEILING} must be a number of cores (e.g. 1.5; 0: none), not {raw!r}"
            )
        update["cpu_ceiling"] = cores or None
    if raw := environ.get(ENV_CGROUPS, "").strip():
        if raw not in ("auto", "v2", "v1", "off"):
            raise InvalidInput(f"{ENV_CGROUPS} must be auto, v2, v1 or off, not {raw!r}")
        update["cgroups"] = raw
    if raw := environ.get(ENV_UID_RANGE, "").strip():
        update["uid_range"] = raw
    if raw := environ.get(ENV_BASE_SHARING, "").strip():
        if raw.lower() not in ("auto", "copies", "links"):
            raise InvalidInput(
                f"{ENV_BASE_SHARING} must be auto, copies or links (docs/environments.md), "
                f"not {raw!r}"
            )
        update["base_sharing"] = raw.lower()
    return update


def memory_note(limit: int, usage: Usage) -> str:
    peak = f" (peak {format_size(usage.peak_memory_bytes)})" if usage.peak_memory_bytes else ""
    return (
        f"ended by the memory limit of {format_size(limit)} per execution{peak}: the "
        f"kernel's OOM killer stopped a process of it ({ENV_MEMORY}; docs/limits.md)"
    )


def processes_note(policy: SandboxPolicy) -> str:
    return (
        f"the workspace reached its process limit of {policy.process_limit} "
        f"({ENV_PROCESSES}): a fork failed with 'Resource temporarily unavailable'"
    )


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


def runner_limits(
    policy: SandboxPolicy,
    reserve: int,
    free: int,
    margin: int,
    cgroups: CgroupTree | None,
    uids: str = "one uid",
    base_sharing: str | None = None,
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
        max_memory_bytes=(
            cgroups.limits.memory_bytes if cgroups is not None else policy.max_memory_bytes
        ),
        max_file_size_bytes=policy.max_file_size_bytes,
        max_processes=cgroups.limits.processes if cgroups is not None else policy.max_processes,
        max_open_files=policy.max_open_files,
        enforcement=f"cgroup {cgroups.mechanism}" if cgroups is not None else "rlimits",
        cgroup=cgroups.describe() if cgroups is not None else None,
        memory_scope="per execution (cgroup)"
        if cgroups is not None
        else ("per process (RLIMIT_AS)" if policy.max_memory_bytes else "none (no cgroup)"),
        process_scope="per workspace (pids cgroup)"
        if cgroups is not None
        else ("per uid (RLIMIT_NPROC)"),
        cpu_share=(
            "equal weight per workspace" if cgroups is not None else "per process (no cgroup)"
        ),
        cpu_ceiling=cgroups.limits.cpu_ceiling if cgroups is not None else None,
        uids=uids,
        group_moves=cgroups.group_moves if cgroups is not None else None,
        base_sharing=base_sharing,
    )
