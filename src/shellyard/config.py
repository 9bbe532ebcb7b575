"""Where state lives and how the local runner is set up.

``SHELLYARD_HOME`` holds the SQLite database, the server lock and the local runner's folder.
Its default is ``~/.shellyard``, except for root: bubblewrap starts as the unprivileged sandbox
uid, which must be able to reach the workspace folders, and root's home (/root) is mode 0700 —
so root's default is ``/var/lib/shellyard`` (see docs/decisions.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from shellyard.errors import InvalidInput

# Every client (CLI verb, SDK, MCP) asks for the default home: it lives in the light home.py.
from shellyard.home import default_home as default_home

if TYPE_CHECKING:
    from shellyard.runner.policy import SandboxPolicy


def _default_policy() -> SandboxPolicy:
    # Imported when settings are made (the server), not when a client imports this module.
    from shellyard.runner.policy import SandboxPolicy

    return SandboxPolicy()


@dataclass
class NotificationSettings:
    """Wakes and timers (N2–N7). Each field can be set with ``SHELLYARD_<FIELD>`` (upper case)."""

    #: Webhook delivery: attempts in all, first retry delay (doubles each time, capped), timeout.
    webhook_max_attempts: int = 8
    webhook_retry_base_s: float = 1.0
    webhook_retry_max_s: float = 60.0
    webhook_timeout_s: float = 10.0
    #: Exact ``host:port`` destinations a webhook may reach although the address rules refuse
    #: them (a receiver on this host's loopback or the LAN; docs/operations.md), comma-separated
    #: in ``SHELLYARD_WEBHOOK_EXCEPTIONS``. Nothing wider: no ranges, no wildcards.
    webhook_exceptions: list[str] = field(default_factory=list)
    #: ``at`` may lie this far in the past (request latency, clock skew); earlier is refused.
    timer_past_grace_s: float = 10.0
    #: A timer fired this long after its time by the running scheduler is marked late too.
    timer_late_after_s: float = 60.0
    #: The scheduler looks at the database at least this often: a safety net, since its own
    #: timers are scheduled at once and those another replica (sharing PostgreSQL) created are
    #: announced by the fan-out.
    timer_poll_s: float = 30.0


@dataclass
class RetentionSettings:
    """Snapshot retention and garbage collection (W5; docs/files-and-transfers.md).

    Each workspace keeps its last ``keep_last`` snapshots and every snapshot a record names
    (an execution's commit, a transfer's source or target, an artifact); the rest are pruned
    every ``interval_s`` (0: only when asked), then objects no retained snapshot names and
    older than ``grace_s`` are deleted."""

    keep_last: int = 100
    interval_s: float = 3600.0
    grace_s: float = 600.0
    #: Execution logs and status files (docs/operations.md), every ``interval_s`` too: kept
    #: this many days after the end and within this many bytes per runner (oldest go first);
    #: None: no such limit. Never those an artifact, an unread notice or a reminder needs.
    log_days: float | None = 30.0
    log_budget_bytes: int | None = 10 << 30
    #: Finished execution records (with their notice and runner folder).
    record_days: float | None = 90.0
    #: Session events, settled wakes with their deliveries, read notices, past timers.
    event_days: float | None = 30.0
    #: All of that of an archived session goes after this many days (archived sessions first).
    archived_days: float | None = 7.0


@dataclass
class Settings:
    home: Path = field(default_factory=default_home)
    database_url: str | None = None
    #: PostgreSQL only: a schema of its own (tests use a fresh one per run).
    database_schema: str | None = None
    local_policy: SandboxPolicy = field(default_factory=_default_policy)
    notifications: NotificationSettings = field(default_factory=NotificationSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    #: Most entries (files, folders, links) one transfer may name; beyond it the transfer is
    #: refused with the count (``SHELLYARD_TRANSFER_MAX_ENTRIES``; docs/limits.md).
    transfer_max_entries: int = 100_000
    #: Most live (not revoked) agent tokens one session may hold; the next is refused until
    #: some are revoked (``SHELLYARD_AGENT_TOKENS_PER_SESSION``; docs/security.md "Limits at
    #: each door"). Each may hold web sessions of its own, so none is unbounded.
    agent_tokens_per_session: int = 100

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        from shellyard.runner.limits.settings import limits_from_env
        from shellyard.runner.policy import policy_from_env
        from shellyard.settings_env import check_environment

        # Every SHELLYARD_* value first, all of them named in one message (docs/operations.md):
        # the readers below stopped at the first bad one, each in its own words.
        check_environment()
        settings = cls()
        url = os.environ.get("SHELLYARD_DATABASE_URL")
        if url:
            settings.database_url = url
        settings.local_policy = policy_from_env(settings.local_policy)
        # limits (R2, docs/limits.md): SHELLYARD_WORKSPACE_QUOTA, _LOG_LIMIT, _FREE_SPACE_RESERVE,
        # _CPU_LIMIT
        settings.local_policy = limits_from_env(settings.local_policy, os.environ)
        for item in fields(NotificationSettings):
            variable = f"SHELLYARD_{item.name.upper()}"
            raw = os.environ.get(variable)
            if raw:
                kind = type(getattr(settings.notifications, item.name))
                if kind is list:
                    parts = [p.strip() for p in raw.split(",") if p.strip()]
                    setattr(settings.notifications, item.name, parts)
                    continue
                try:
                    setattr(settings.notifications, item.name, kind(raw))
                except ValueError:
                    raise InvalidInput(
                        f"{variable} must be a {kind.__name__}, not {raw!r}"
                    ) from None
        for name, variable in (
            ("transfer_max_entries", "SHELLYARD_TRANSFER_MAX_ENTRIES"),
            ("agent_tokens_per_session", "SHELLYARD_AGENT_TOKENS_PER_SESSION"),
        ):
            raw = os.environ.get(variable)
            if raw:
                setattr(settings, name, _at_least_one(variable, raw))
        for key, value in overrides.items():
            if value is not None:
                setattr(settings, key, value)
        return settings

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'shellyard.db'}"

    @property
    def local_runner_root(self) -> Path:
        return self.home / "runners" / "local"


def _at_least_one(variable: str, raw: str) -> int:
    """A count setting's value: a whole number of 1 or more, else refused naming ``variable``."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidInput(f"{variable} must be a whole number of 1 or more, not {raw!r}")
    return value
