"""Names that are not UTF-8 (docs/files-and-transfers.md, "Names that are not UTF-8").

A Linux file name is bytes; shellyard holds it as ``str`` the way Python's ``os`` does
(PEP 383 ``surrogateescape``): each byte that is not part of valid UTF-8 is the code point
U+DC80 + byte. Such a ``str`` round-trips to the same bytes (``os.fsencode``) but cannot be
written as UTF-8, so every place that writes text outside the process goes through here:

- JSON (the runner daemon's wire, REST answers): ``dumps`` writes such a code point as the
  JSON escape ``\\udcNN`` (RFC 8259's grammar; Python's ``json`` and JavaScript's
  ``JSON.parse`` read it back to the same code point), ``loads`` reads it. The fast path
  (pydantic's own JSON) is kept for every answer that has no such name.
- The database (``store.schema.StoredPath``): a path column stores such a name as
  ``/`` + ``escape(name)`` (a leading ``/`` is never part of a normalised relative path,
  so the form is unambiguous).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

M = TypeVar("M", bound=BaseModel)

#: Marks the stored form of a path that holds bytes that are not UTF-8.
STORED_MARK = "/"


def not_utf8(text: str) -> bool:
    """Whether ``text`` holds a byte of a name that is not UTF-8 (a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def escape(text: str) -> str:
    """``text`` as printable UTF-8: ``\\`` doubled, each raw byte as ``\\xNN``."""
    out = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif "\udc80" <= char <= "\udcff":
            out.append(f"\\x{ord(char) - 0xDC00:02x}")
        else:
            out.append(char)
    return "".join(out)


def unescape(text: str) -> str:
    """The inverse of ``escape``."""
    out = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\" and text[i + 1 : i + 2] == "\\":
            out.append("\\")
            i += 2
        elif char == "\\" and text[i + 1 : i + 2] == "x":
            out.append(chr(0xDC00 + int(text[i + 2 : i + 4], 16)))
            i += 4
        else:
            out.append(char)
            i += 1
    return "".join(out)


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


__all__ = ["dumps", "dumps_value", "escape", "loads", "not_utf8", "unescape"]
