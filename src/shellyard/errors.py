"""Errors that cross every boundary (runner HTTP, REST, MCP) with their kind intact.

Each error has a stable ``code`` so a remote side can raise the same class again
(the SWE-ReX pattern). Every door (REST, the SDK's decoding) and the runner wire use ONE
envelope, ``{"error": {"code", "message", "details"}}``, written by ``encode_error`` and read
by ``decode_error``; the code is looked up in ``ERRORS_BY_CODE``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
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


class TooLarge(InvalidInput):
    """A request past a documented bound (body size, entries, page, sessions): the message
    names the bound and what to do (docs/security.md "Limits at each door")."""

    code = "too_large"
    http_status = 413


class TooMany(ShellyardError):
    """More of something at once than one token or session may hold (MCP sessions, login
    codes, agent tokens): close or revoke some, or wait for idle ones to expire
    (docs/security.md "Limits at each door")."""

    code = "too_many"
    http_status = 429


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


class SpawnFailed(ShellyardError):
    """The runner could not start the command's process (the kernel refused the spawn:
    E2BIG, ENOMEM, EAGAIN ...). The execution ends ``failed`` with this message."""

    code = "spawn_failed"
    http_status = 500


class StoreFull(ShellyardError):
    """The control plane's database could not write: its volume is full (SQLITE_FULL,
    PostgreSQL's disk_full). Nothing was recorded; retry once space is freed."""

    code = "store_full"
    http_status = 507


class PathRefused(InvalidInput):
    """W6: a path that is absolute, escapes the root, or crosses a symlink."""

    code = "path_refused"


class RunnerUnavailable(ShellyardError):
    """The runner could not be asked; retryable (E9)."""

    code = "runner_unavailable"
    http_status = 503


class AnswerLost(RunnerUnavailable):
    """A request that may act twice (a POST: ``run_shell``) went whole, and its answer was cut
    by the client's bound on its time (sdk/answer_clock.py): the server may have acted on it.
    Look before sending it again; the CLI exits 124, the outcome unknown, not 75."""

    code = "answer_lost"


class RunnerOutdated(Conflict):
    """The runner speaks an older protocol that would drop an option of the request without a
    word (runner/protocol.py ``PROTOCOL_VERSION``): refused, nothing ran; upgrade the runner
    or leave the option out."""

    code = "runner_outdated"


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


class MethodNotAllowed(ShellyardError):
    """An HTTP method the route does not take (the REST app's own 405 answers)."""

    code = "method_not_allowed"
    http_status = 405


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
        TooLarge,
        TooMany,
        OutOfRoom,
        LowOnSpace,
        SpawnFailed,
        StoreFull,
        RunnerUnavailable,
        RunnerOutdated,
        SandboxUnavailable,
        SourceUnreachable,
        ChangeFailed,
        Unauthorized,
        Forbidden,
        HomeInUse,
        MethodNotAllowed,
    )
}


def error_from_dict(data: dict[str, Any]) -> ShellyardError:
    cls = ERRORS_BY_CODE.get(str(data.get("code")), ShellyardError)
    return cls(str(data.get("message", "unknown error")), **dict(data.get("details") or {}))


def encode_error(error: ShellyardError) -> dict[str, Any]:
    """The one error envelope: ``{"error": {"code", "message", "details"}}``.

    ``details`` is passed as given; a sender whose details may hold non-JSON values (paths,
    models) runs the envelope through its JSON encoder."""
    return {"error": error.to_dict()}


def decode_error(body: bytes | str | Mapping[str, Any]) -> ShellyardError | None:
    """The error an envelope describes, or None when ``body`` is not an envelope (a proxy's
    HTML page, a foreign server): the caller then reports the HTTP status itself."""
    data: object = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except ValueError:
            return None
    inner = data.get("error") if isinstance(data, Mapping) else None
    if not isinstance(inner, Mapping) or "code" not in inner or "message" not in inner:
        return None
    details = inner.get("details")
    return error_from_dict({**inner, "details": details if isinstance(details, Mapping) else {}})


def problems_text(errors: Iterable[Mapping[str, Any]]) -> str:
    """``loc: msg`` for each of pydantic's (or FastAPI's) error dicts, joined with ``; ``,
    without pydantic's ``Value error,`` prefix, so a message written by one of our validators
    reads the same over the runner wire, REST, MCP, the SDK and the CLI."""
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def validation_message(exc: Exception | Iterable[Mapping[str, Any]]) -> str:
    """The one description of a malformed request: a pydantic ``ValidationError``'s or
    FastAPI's ``RequestValidationError``'s errors (or such a list itself) in one line, or the
    exception's own text when it carries no error list."""
    if not isinstance(exc, Exception):
        return problems_text(exc)
    errors = getattr(exc, "errors", None)
    if callable(errors):
        listed = errors()
        if isinstance(listed, list | tuple):
            return problems_text(listed)
    return str(exc)


def invalid_input(exc: Exception) -> InvalidInput:
    """The InvalidInput every door reports for a request that failed validation."""
    return InvalidInput(validation_message(exc))


#: C0 controls but newline and tab, DEL and the C1 controls: what a terminal acts on.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with each control character shown as ``\\xNN`` (a message that names an
    agent's files or a server's answer reaches terminals and logs)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
