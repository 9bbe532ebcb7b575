"""Where state lives and how the local runner is set up.

``SHELLYARD_HOME`` holds the SQLite database, the server lock and the local runner's folder.
Its default is ``~/.shellyard``, except for root: bubblewrap starts as the unprivileged sandbox
uid, which must be able to reach the workspace folders, and root's home (/root) is mode 0700 —
so root's default is ``/var/lib/shellyard`` (see docs/decisions.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from shellyard.runner.protocol import SandboxPolicy


def default_home() -> Path:
    env = os.environ.get("SHELLYARD_HOME")
    if env:
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/shellyard")
    return Path.home() / ".shellyard"


@dataclass
class Settings:
    home: Path = field(default_factory=default_home)
    database_url: str | None = None
    #: PostgreSQL only: a schema of its own (tests use a fresh one per run).
    database_schema: str | None = None
    local_policy: SandboxPolicy = field(default_factory=SandboxPolicy)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        settings = cls()
        url = os.environ.get("SHELLYARD_DATABASE_URL")
        if url:
            settings.database_url = url
        network = os.environ.get("SHELLYARD_NETWORK")
        if network in ("on", "off"):
            settings.local_policy = settings.local_policy.model_copy(update={"network": network})
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
