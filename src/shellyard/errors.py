"""Errors that cross every boundary (runner HTTP, REST, MCP) with their kind intact.

Each error has a stable ``code`` so a remote side can raise the same class again
(the SWE-ReX pattern): the runner daemon serialises ``{code, message}``, the client
looks the code up in ``ERRORS_BY_CODE``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ShellyardError(Exception):
    """Base class. ``message`` says what was wrong and what to do about it."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidInput(ShellyardError):
    code = "invalid_input"
    http_status = 400


class NotFound(ShellyardError):
    code = "not_found"
    http_status = 404


class WorkspaceBusy(ShellyardError):
    """W1: a second writer is refused at once and told who holds the workspace."""

    code = "workspace_busy"
    http_status = 409


class Conflict(ShellyardError):
    """The object is in a state that does not allow the operation (a stopped session, ...)."""

    code = "conflict"
    http_status = 409


class OutOfRoom(ShellyardError):
    """The runner's filesystem (or the workspace's quota) has no room for the data."""

    code = "out_of_room"
    http_status = 507


class LowOnSpace(ShellyardError):
    """The runner's volume is below its free-space reserve: new executions and writer
    operations are refused until space is freed, so the store never hits ENOSPC. Retryable."""

    code = "low_on_space"
    http_status = 503


class PathRefused(InvalidInput):
    """W6: a path that is absolute, escapes the root, or crosses a symlink."""

    code = "path_refused"


class RunnerUnavailable(ShellyardError):
    """The runner could not be asked; retryable (E9)."""

    code = "runner_unavailable"
    http_status = 503


class SandboxUnavailable(ShellyardError):
    """The sandbox cannot be started on this host (bubblewrap missing, no user namespaces)."""

    code = "sandbox_unavailable"
    http_status = 503


class SourceUnreachable(ShellyardError):
    """V8: an environment change could not reach its channel, index or repository."""

    code = "source_unreachable"
    http_status = 502


class ChangeFailed(ShellyardError):
    """V8: an environment change failed for another reason (a package that does not build,
    conflicting requirements, an interruption); the environment is unchanged."""

    code = "change_failed"
    http_status = 422


class Unauthorized(ShellyardError):
    code = "unauthorized"
    http_status = 401


class Forbidden(ShellyardError):
    """The token is valid but its scope does not allow the operation (admin-only, or another
    agent than the token's)."""

    code = "forbidden"
    http_status = 403


class HomeInUse(ShellyardError):
    code = "home_in_use"
    http_status = 409


ERRORS_BY_CODE: dict[str, type[ShellyardError]] = {
    cls.code: cls
    for cls in (
        ShellyardError,
        InvalidInput,
        NotFound,
        WorkspaceBusy,
        Conflict,
        PathRefused,
        OutOfRoom,
        LowOnSpace,
        RunnerUnavailable,
        SandboxUnavailable,
        SourceUnreachable,
        ChangeFailed,
        Unauthorized,
        Forbidden,
        HomeInUse,
    )
}


def error_from_dict(data: dict[str, Any]) -> ShellyardError:
    cls = ERRORS_BY_CODE.get(str(data.get("code")), ShellyardError)
    return cls(str(data.get("message", "unknown error")), **dict(data.get("details") or {}))
