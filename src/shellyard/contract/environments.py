"""Request and result models of managed environments (V1–V8), shared by every interface
(REST, MCP, SDK, CLI) like ``contract.executions``. Package records are the
Runner protocol's own ``PackageRecord``: they cross from the runner to the caller unchanged."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shellyard.contract.executions import DEFAULT_WAIT_MS, MAX_WAIT_MS
from shellyard.contract.packages import PackageRecord
from shellyard.contract.sources import SourceError, check_channel, check_spec, check_url

MANAGERS = ("conda", "pip", "cran", "bioconductor")
LANGUAGES = ("python", "r")
#: The bases ``environment_create`` can start from (``base``).
BASES = ("python-base",)
#: Which request options each manager reads; any other one given is refused, not ignored.
MANAGER_OPTIONS: dict[str, tuple[str, ...]] = {
    "conda": ("channels",),
    "pip": ("index_url", "extra_index_urls", "find_links"),
    "cran": ("repos",),
    "bioconductor": ("repos",),
}
#: ``index_url`` values meaning "no index at all" (pip's ``--no-index``).
NO_INDEX = frozenset({"none", "no-index"})
OPTION_NAMES = ("channels", "index_url", "extra_index_urls", "find_links", "repos")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

EnvironmentState = Literal["creating", "ready", "failed"]
ChangeState = Literal["waiting", "running", "succeeded", "failed"]


def _check_wait(value: int) -> int:
    if not 0 <= value <= MAX_WAIT_MS:
        # Like run_shell (E1): out of range is an error, never a clamp.
        raise ValueError(
            f"wait_ms must be between 0 and {MAX_WAIT_MS} (how long to wait for the change "
            f"before returning its status; got {value}). Poll environment_change_status for "
            "longer changes"
        )
    return value


class EnvironmentCreateRequest(BaseModel):
    """V1: a managed prefix named ``name`` on a runner, for ``language``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    language: str = Field(default="python", json_schema_extra={"enum": list(LANGUAGES)})
    runner_id: str | None = None
    wait_ms: int = DEFAULT_WAIT_MS
    #: Start from this base environment's packages (``python-base``; docs/environments.md): hard
    #: links of the runner's prepared base, so creating is quick; changes never touch the base.
    base: str | None = Field(default=None, json_schema_extra={"enum": list(BASES)})

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"environment name {value!r} must be 1-64 characters: letters, digits, '.', "
                "'_' or '-', starting with a letter or digit"
            )
        return value

    @field_validator("language")
    @classmethod
    def _language(cls, value: str) -> str:
        if value not in LANGUAGES:
            raise ValueError(f"language must be 'python' or 'r', not {value!r}")
        return value

    @field_validator("wait_ms")
    @classmethod
    def _wait(cls, value: int) -> int:
        return _check_wait(value)

    @model_validator(mode="after")
    def _check_base(self) -> EnvironmentCreateRequest:
        if self.base is not None:
            if self.base not in BASES:
                raise ValueError(
                    f"base {self.base!r} is not a base environment one can start from; use "
                    f"{', '.join(BASES)}"
                )
            if self.language != "python":
                raise ValueError(f"{self.base} is a python base: leave language 'python'")
        return self


class EnvironmentChangeBody(BaseModel):
    """V2: an install or uninstall with one manager. Options apply to their manager only:
    ``channels`` (conda), ``index_url`` / ``extra_index_urls`` / ``find_links`` (pip),
    ``repos`` (cran, bioconductor)."""

    model_config = ConfigDict(extra="forbid")

    # The enum is advertised (a model picks from it); the check stays the validator's own,
    # whose message names the managers.
    manager: str = Field(json_schema_extra={"enum": list(MANAGERS)})
    specs: list[str]
    channels: list[str] = Field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = Field(default_factory=list)
    find_links: list[str] = Field(default_factory=list)
    repos: list[str] = Field(default_factory=list)
    wait_ms: int = DEFAULT_WAIT_MS

    @field_validator("wait_ms")
    @classmethod
    def _wait(cls, value: int) -> int:
        return _check_wait(value)

    @model_validator(mode="after")
    def _check(self) -> EnvironmentChangeBody:
        if self.manager not in MANAGERS:
            raise ValueError(f"unknown manager {self.manager!r}: use one of {', '.join(MANAGERS)}")
        specs = [s.strip() for s in self.specs]
        if not specs or any(not s for s in specs):
            raise ValueError(
                "specs must list at least one package spec, none empty (e.g. ['numpy>=1.26'] "
                "for pip, ['python=3.11'] for conda, ['jsonlite'] for cran)"
            )
        for spec in specs:
            if any(c in spec for c in "\x00\n\r"):
                raise ValueError(f"package spec {spec!r} contains a control character")
        self.specs = specs
        try:
            self._check_sources()
        except SourceError as exc:
            raise ValueError(str(exc)) from None
        allowed = MANAGER_OPTIONS[self.manager]
        given = [name for name in OPTION_NAMES if getattr(self, name)]
        wrong = [name for name in given if name not in allowed]
        if wrong:
            raise ValueError(
                f"{', '.join(wrong)} does not apply to manager {self.manager!r} (it reads "
                f"{', '.join(allowed)}); drop it or use the manager it belongs to"
            )
        return self

    def _check_sources(self) -> None:
        """The syntax of every source and spec (the runner applies its allow-list
        on top). ``http://`` passes here: only the runner knows whether its operator allowed
        that mirror."""
        for spec in self.specs:
            check_spec(self.manager, spec)
        self.channels = [check_channel(c) for c in self.channels]
        if self.index_url is not None and self.index_url.strip().lower() not in NO_INDEX:
            self.index_url = check_url(self.index_url, "index_url", allow_http=True)
        self.extra_index_urls = [
            check_url(u, "extra_index_urls", allow_http=True) for u in self.extra_index_urls
        ]
        self.find_links = [check_url(u, "find_links", allow_http=True) for u in self.find_links]
        self.repos = [check_url(u, "repos", allow_http=True) for u in self.repos]

    def options(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in MANAGER_OPTIONS[self.manager]}


#: The longest environment_change_status wait (seconds).
MAX_CHANGE_WAIT_S = 30.0
_ENVIRONMENT_ID = Field(description="an environment id (env_...) from environment_create")


class EnvironmentChangeRequest(EnvironmentChangeBody):
    """V2/V3 as one call: the environment (a path parameter over REST) and the change."""

    environment_id: str = _ENVIRONMENT_ID


class EnvironmentListRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    runner_id: str | None = Field(default=None, description="only environments on this runner")


class EnvironmentShowRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    environment_id: str = _ENVIRONMENT_ID


class EnvironmentRevisionsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    environment_id: str = _ENVIRONMENT_ID
    revision: int | None = Field(default=None, ge=0, description="only this revision")


class ChangeStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    change_id: str = Field(description="a change id (ch_...) from an environment change")
    wait_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_CHANGE_WAIT_S,
        description=f"wait up to this long (0..{MAX_CHANGE_WAIT_S:g} s) for the change to end",
    )


class ChangeView(BaseModel):
    """One change of an environment (create, install, uninstall) and where it stands (V5)."""

    change_id: str
    environment_id: str
    action: Literal["create", "install", "uninstall"]
    manager: str | None = None
    specs: list[str] = Field(default_factory=list)
    options: dict[str, Any] = Field(default_factory=dict)
    state: ChangeState
    #: V5: what a waiting change waits for: executions using the environment, or earlier
    #: changes of it.
    waiting_for: list[str] = Field(default_factory=list)
    #: The runner's latest progress line while it runs ("solving", "linking 3/10", …).
    progress: str | None = None
    error: str | None = None
    error_kind: str | None = None
    #: The revision this change recorded (succeeded only).
    revision: int | None = None
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed")


class RevisionSummary(BaseModel):
    revision: int
    change_id: str
    action: str
    manager: str | None = None
    specs: list[str] = Field(default_factory=list)
    packages: int
    created_at: float


class RevisionView(BaseModel):
    """V2: the package state after a change, per manager, and the request that made it."""

    environment_id: str
    revision: int
    packages: list[PackageRecord]
    request: dict[str, Any]
    change_id: str
    created_at: float


class EnvironmentView(BaseModel):
    environment_id: str
    name: str
    language: str
    runner_id: str
    session_id: str
    created_by: str
    state: EnvironmentState
    #: The latest revision (0 while it is being created).
    revision: int
    error: str | None = None
    created_at: float
    #: Changes not ended yet, oldest first (``show`` and ``create``).
    pending_changes: list[ChangeView] = Field(default_factory=list)
    #: ``show`` only.
    revisions: list[RevisionSummary] | None = None
    #: ``create`` only: its change, to follow with environment_change_status.
    change_id: str | None = None
    #: Where the prefix is mounted inside commands (``show`` only, when the runner answers).
    prefix: str | None = None


# ------------------------ the GETs' query models: environments (V1-V8)
# (``Annotated[Model, Query()]`` in api/; docs/architecture.md "The doors")


class EnvironmentListQuery(BaseModel):
    runner_id: str | None = None


class EnvironmentRevisionsQuery(BaseModel):
    revision: int | None = Field(None, ge=0)


__all__ = [
    "MANAGERS",
    "ChangeStatusRequest",
    "ChangeView",
    "EnvironmentChangeBody",
    "EnvironmentChangeRequest",
    "EnvironmentCreateRequest",
    "EnvironmentListQuery",
    "EnvironmentListRequest",
    "EnvironmentRevisionsQuery",
    "EnvironmentRevisionsRequest",
    "EnvironmentShowRequest",
    "EnvironmentView",
    "RevisionSummary",
    "RevisionView",
]
