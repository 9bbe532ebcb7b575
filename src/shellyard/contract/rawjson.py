"""JSON that carries names that are not UTF-8 (docs/files-and-transfers.md, "Names that
are not UTF-8"): such a name is a ``str`` with lone surrogates (PEP 383), which pydantic's
JSON refuses both ways. ``dumps`` writes each as the JSON escape ``\\udcNN`` (RFC 8259's
grammar; Python's ``json`` and JavaScript's ``JSON.parse`` read it back to the same code
point) and ``loads`` reads it; the fast path (pydantic's own JSON) is kept for everything
else. Used by the runner daemon's wire and the file and transfer REST answers."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

M = TypeVar("M", bound=BaseModel)


def dumps(model: BaseModel) -> bytes:
    """``model`` as JSON; a name that is not UTF-8 as ``\\udcNN`` escapes."""
    try:
        return model.model_dump_json().encode()
    except PydanticSerializationError:
        return json.dumps(model.model_dump(mode="json"), separators=(",", ":")).encode()


def dumps_value(value: Any) -> bytes:
    """A JSON-able value (already ``model_dump(mode="json")``-ed) as JSON, ASCII-escaped
    only when it holds a name that is not UTF-8."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def loads(model: type[M], raw: bytes | str) -> M:
    """``model`` from JSON that may hold ``\\udcNN`` escapes (pydantic's parser refuses
    them: Python's reads them, then the model is validated)."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise
        try:
            value = json.loads(raw)
        except ValueError:
            raise exc from None
        return model.model_validate(value)


__all__ = ["dumps", "dumps_value", "loads", "marked"]


def marked(text: str) -> str:
    """``text`` as a strict UTF-8 wire (MCP) carries it: unchanged when it is UTF-8, else
    its marked form, ``/`` + each raw byte (PEP 383 U+DC80..U+DCFF) as ``\\xNN`` and each
    ``\\`` doubled — ``paths.escape``'s form, decoded by ``paths.from_marked`` wherever a
    path comes in (docs/files-and-transfers.md "Names that are not UTF-8")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return text
    out = ["/"]
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(char)
    return "".join(out)
