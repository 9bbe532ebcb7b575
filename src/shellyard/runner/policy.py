"""The sandbox policy of one runner (R2): what its commands may reach.

A module of its own, importing nothing of the runner wire, so ``config.py`` (the settings
every door reads) can name it without depending on the runner's protocol. The threat model
and the reason for each setting are in docs/security.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from shellyard import settings_env
from shellyard.errors import InvalidInput
from shellyard.netrules import parse_registry
from shellyard.runner.network.egress_rules import EgressRules, parse_exception, parse_pattern

#: ``off``: own network namespace, loopback only. ``egress``: outbound TCP through the runner's
#: filtering proxy only. ``host``: the host's network, shared (explicit choice only).
NetworkMode = Literal["off", "egress", "host"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("off", "egress", "host")

#: Bumped whenever the seccomp rules change, so every execution record names the rules it ran
#: under (``runner/sandbox/seccomp.py``).
SECCOMP_PROFILE = "shellyard-seccomp-1"


def parse_network(value: str, where: str) -> NetworkMode:
    """``value`` as a network mode, or a clear error naming ``where`` it came from. ``on`` (the
    setting's old spelling) means ``host``."""
    if value == "on":
        return "host"
    for mode in NETWORK_MODES:
        if value == mode:
            return mode
    raise ValueError(
        f"{where} must be one of off, egress or host, not {value!r} "
        f"(off: no network; egress: filtered outbound TCP; host: the host's network, unfiltered)"
    )


class SandboxPolicy(BaseModel):
    """Per-runner sandbox settings (R2)."""

    network: NetworkMode = "off"
    #: ``egress`` only: the domains a command may reach (``example.org``, ``*.example.org``,
    #: ``example.org:8443``; without a port 80 and 443). Empty: every public address.
    egress_allow: list[str] = Field(default_factory=list)
    #: ``host:port`` pairs reachable through the proxy even when private or loopback (an
    #: operator's package mirror, say). Exact matches only.
    egress_exceptions: list[str] = Field(default_factory=list)
    #: The package tools' network (V1/V2). None: ``host`` on a ``host`` runner, otherwise
    #: ``egress`` with the same filter (a tool must download, an execution need not).
    tool_network: NetworkMode | None = None
    #: Host folders or files shown read-only in every sandbox beside the built-in view.
    host_paths: list[str] = Field(default_factory=list)
    max_processes: int = Field(default=4096, ge=16)
    max_open_files: int = Field(default=4096, ge=64)
    max_file_size_bytes: int = Field(default=64 << 30, ge=1 << 20)
    max_memory_bytes: int | None = Field(default=None, ge=64 << 20)
    #: uid/gid the sandbox runs as when the runner is root; None picks the default. Never 0
    #: nor past uid_t (the launcher cut a wider one down to 0, attack pass session 57).
    sandbox_uid: int | None = Field(default=None, ge=1, le=4294967294)
    sandbox_gid: int | None = Field(default=None, ge=1, le=4294967294)
    cancel_grace_s: float = Field(default=5.0, ge=0.0, le=300.0)
    # --- limits that keep one workspace from hurting the host (docs/limits.md) ---
    #: Bytes the live tree of one workspace may hold while a command runs; 0: no quota.
    workspace_quota_bytes: int = Field(default=10 << 30, ge=0)
    #: Bytes retained per log stream (head and a rolling tail); 0: keep everything.
    log_limit_bytes: int = Field(default=1 << 30, ge=0)
    #: Free space the runner's volume keeps; None: the larger of 2 GiB and
    #: ``free_space_reserve_percent`` of the volume. 0: no reserve.
    free_space_reserve_bytes: int | None = Field(default=None, ge=0)
    free_space_reserve_percent: float = Field(default=5.0, ge=0.0, le=90.0)
    #: RLIMIT_CPU of each sandbox process, in seconds of CPU time; None: unlimited.
    max_cpu_seconds: int | None = Field(default=None, ge=1)
    # --- tenants (R2; docs/limits.md "Tenants"; runner/limits/cgroups.py, sandbox/tenants.py)
    #: Memory of one execution's cgroup; None: half the host's RAM (cgroups.py).
    memory_limit_bytes: int | None = Field(default=None, ge=16 << 20)
    #: Processes of one workspace (its pids cgroup; the lower of this and max_processes).
    process_limit: int = Field(default=4096, ge=16)
    #: CPU ceiling of one workspace in cores; None: none (equal weight still applies).
    cpu_ceiling: float | None = Field(default=None, gt=0.0)
    #: Which cgroup backend: ``auto`` (v2, else v1, else rlimits), ``v2``, ``v1``, ``off``.
    cgroups: Literal["auto", "v2", "v1", "off"] = "auto"
    #: ``FIRST-LAST``: the host uids workspaces get one each (a root runner; tenants.py).
    #: None: the default range, unless ``sandbox_uid`` is set (then that one uid for all);
    #: ``off``: every workspace runs as ``sandbox_uid``.
    uid_range: str | None = None
    #: How an environment made ``--from`` a base gets the base's files: ``copies`` (an inode
    #: of its own each: no link count shared), ``links`` (hard links: fast, no bytes, but the
    #: link count tells every session how many environments were made from the base), ``auto``
    #: (copies with a uid per workspace, links otherwise; derive.py, docs/environments.md).
    base_sharing: Literal["auto", "copies", "links"] = "auto"
    #: How often running commands' disk use and logs are looked at.
    limit_check_interval_s: float = Field(default=0.1, gt=0.0, le=10.0)
    # --- package sources (docs/environments.md "Package sources") ---
    #: The channels, indexes and repositories environment changes may use (``pypi``, ``cran``,
    #: ``bioconductor``, conda channel names, https:// URL prefixes, local folders). None: any
    #: https:// source and any local folder outside the runner's own.
    allowed_sources: list[str] | None = None
    #: Local package sources only (pip ``--no-index``, no CRAN or Bioconductor).
    packages_offline: bool = False
    #: The package registries (``host`` or ``host:port``, port 443 unless given) the proxy may
    #: dial although their address is in a documentation or benchmarking block
    #: (``netrules.registry_tolerates``). None: the hosts the configured sources name
    #: (``contract.sources.registry_hosts``); every other destination gets the full check.
    package_registries: list[str] | None = None
    #: Seconds a reader of a local package source (run as the workspace's uid) may send
    #: nothing before it is killed and its change fails (``managers/readers.py``).
    source_stall_s: float = Field(default=60.0, gt=0.0, le=3600.0)

    @model_validator(mode="before")
    @classmethod
    def _old_spelling(cls, data: Any) -> Any:
        # A daemon started with the old ``--policy-json '{"network": "on"}'`` keeps working.
        if isinstance(data, dict):
            for key in ("network", "tool_network"):
                if data.get(key) == "on":
                    data = {**data, key: "host"}
        return data

    @field_validator("egress_allow")
    @classmethod
    def _check_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            parse_pattern(pattern)
        return patterns

    @field_validator("egress_exceptions")
    @classmethod
    def _check_exceptions(cls, pairs: list[str]) -> list[str]:
        for pair in pairs:
            parse_exception(pair)
        return pairs

    @field_validator("package_registries")
    @classmethod
    def _check_registries(cls, entries: list[str] | None) -> list[str] | None:
        for entry in entries or []:
            parse_registry(entry)
        return entries

    @field_validator("host_paths")
    @classmethod
    def _check_host_paths(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or ".." in path.split("/"):
                raise ValueError(
                    f"host path {path!r} must be absolute and without '..' (for example /opt/tools)"
                )
        return paths

    @field_validator("allowed_sources")
    @classmethod
    def _check_sources(cls, entries: list[str] | None) -> list[str] | None:
        from shellyard.contract.sources import SourceError, check_channel

        for entry in entries or []:
            try:
                check_channel(entry, "allowed source")
            except SourceError as exc:
                raise ValueError(str(exc)) from None
        return entries

    @property
    def tools_network(self) -> NetworkMode:
        if self.tool_network is not None:
            return self.tool_network
        return "host" if self.network == "host" else "egress"

    def registries(self) -> list[tuple[str, int]]:
        """The package registries as (host, port): the setting, or its default."""
        if self.package_registries is not None:
            entries = self.package_registries
        else:
            from shellyard.contract.sources import registry_hosts

            entries = registry_hosts(self.allowed_sources)
        return [parse_registry(entry) for entry in entries]

    def egress_rules(self) -> EgressRules:
        """What the egress proxy of this policy lets through."""
        return EgressRules.build(self.egress_allow, self.egress_exceptions, self.registries())

    def egress_digest(self) -> str:
        """A short digest of what the network filter lets through (the allow-list and the
        exceptions), recorded with every execution so a record names the rules it ran under."""
        doc = json.dumps(
            {
                "allow": sorted(self.egress_allow),
                "exceptions": sorted(self.egress_exceptions),
                "registries": sorted(f"{h}:{p}" for h, p in self.registries()),
            },
            sort_keys=True,
        )
        return hashlib.sha256(doc.encode()).hexdigest()[:16]


class ExecutionPolicy(BaseModel):
    """The policy one execution ran under, recorded with it (meta.json, result.json, the
    control plane's record) and shown by ``execution_status``."""

    network: NetworkMode
    #: ``egress_digest()`` of the runner's allow-list and exceptions (None unless egress).
    egress_digest: str | None = None
    seccomp_profile: str = SECCOMP_PROFILE


def _env_list(variable: str, separator: str) -> list[str] | None:
    raw = os.environ.get(variable)
    if raw is None or not raw.strip():
        return None
    return [part.strip() for part in raw.split(separator) if part.strip()]


def policy_from_env(policy: SandboxPolicy) -> SandboxPolicy:
    """The local runner's sandbox settings from the environment (docs/security.md):
    ``SHELLYARD_NETWORK`` (off, egress, host), ``SHELLYARD_TOOL_NETWORK``,
    ``SHELLYARD_EGRESS_ALLOW`` and ``SHELLYARD_EGRESS_EXCEPTIONS`` (comma-separated),
    ``SHELLYARD_HOST_PATHS`` (colon-separated absolute paths)."""
    update: dict[str, object] = {}
    try:
        for variable, key in (
            ("SHELLYARD_NETWORK", "network"),
            ("SHELLYARD_TOOL_NETWORK", "tool_network"),
        ):
            raw = os.environ.get(variable)
            if raw:
                update[key] = parse_network(raw.strip(), variable)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    for variable, key, separator in (
        ("SHELLYARD_EGRESS_ALLOW", "egress_allow", ","),
        ("SHELLYARD_EGRESS_EXCEPTIONS", "egress_exceptions", ","),
        ("SHELLYARD_HOST_PATHS", "host_paths", ":"),
    ):
        values = _env_list(variable, separator)
        if values is not None:
            update[key] = values
    # docs/environments.md: the package sources environment changes may use (comma- or
    # space-separated)
    sources = os.environ.get("SHELLYARD_ALLOWED_SOURCES")
    if sources is not None:
        from shellyard.contract.sources import SourceError, check_channel

        entries = sources.replace(",", " ").split()
        update["allowed_sources"] = entries
        for entry in entries:
            try:  # here, not in the model: its error would echo the value (credentials)
                check_channel(entry, "SHELLYARD_ALLOWED_SOURCES entry")
            except SourceError as exc:
                raise InvalidInput(str(exc)) from None
    registries = settings_env.get("SHELLYARD_PACKAGE_REGISTRIES")
    if registries is not None and registries.strip():
        entries = registries.replace(",", " ").split()
        entries = [] if entries == ["none"] else entries
        update["package_registries"] = entries
        for entry in entries:
            try:
                parse_registry(entry)
            except ValueError as exc:
                raise InvalidInput(f"SHELLYARD_PACKAGE_REGISTRIES: {exc}") from None
    offline = (settings_env.get("SHELLYARD_PACKAGES_OFFLINE") or "").lower()
    if offline:
        update["packages_offline"] = offline in ("1", "true", "yes", "on")
    stall = settings_env.get("SHELLYARD_SOURCE_STALL_S")
    if stall is not None:
        update["source_stall_s"] = stall
    if not update:
        return policy
    try:
        return SandboxPolicy.model_validate({**policy.model_dump(), **update})
    except ValueError as exc:
        raise InvalidInput(f"the sandbox settings in the environment are invalid: {exc}") from None
