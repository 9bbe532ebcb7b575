"""The one way a malformed request is described to its caller, whichever door it came through.

pydantic's errors (a model's ``ValidationError``, FastAPI's ``RequestValidationError``, both a
list of ``{loc, msg, …}``) become one line: ``field.path: what is wrong; other: …``, without
pydantic's ``Value error,`` prefix, so a message written by one of our validators reads the
same over REST, MCP, the SDK and the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shellyard.errors import InvalidInput


def problems_text(errors: Iterable[Mapping[str, Any]]) -> str:
    """``loc: msg`` for each of pydantic's error dicts, joined with ``; ``."""
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def validation_message(exc: Exception) -> str:
    """The message of a validation failure: pydantic's or FastAPI's errors in one line, or the
    exception's own text when it carries no error list."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        listed = errors()
        if isinstance(listed, list | tuple):
            return problems_text(listed)
    return str(exc)


def invalid_input(exc: Exception) -> InvalidInput:
    """The InvalidInput every door reports for a request that failed validation."""
    return InvalidInput(validation_message(exc))
