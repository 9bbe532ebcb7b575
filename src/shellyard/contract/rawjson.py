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


def parse(model: type[M], data: Any, *, raw_bytes: bool = False) -> M:
    """A request body (parsed JSON) as ``model``, or one clear InvalidInput: a lone surrogate
    (``refuse_surrogates``) or pydantic's errors in one message. The one place a door's body
    becomes its contract model (REST, MCP, the control plane's own callers)."""
    from shellyard.errors import InvalidInput, validation_message

    refuse_surrogates(data, raw_bytes=raw_bytes)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


__all__ = ["dumps", "dumps_value", "loads", "marked", "parse", "refuse_surrogates"]


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


def _bad_surrogate(text: str, raw_bytes: bool) -> str | None:
    for char in text:
        if "\ud800" <= char <= "\udfff" and not (raw_bytes and "\udc80" <= char <= "\udcff"):
            return char
    return None


def refuse_surrogates(value: Any, *, raw_bytes: bool, where: str = "body") -> None:
    """Raise InvalidInput for a JSON ``\\uD800``-``\\uDFFF`` escape no text can hold (a
    lone surrogate); ``raw_bytes``: U+DC80..U+DCFF are a name's raw bytes (PEP 383, docs/
    files-and-transfers.md "Names that are not UTF-8") and pass. Never a 500 later."""
    from shellyard.errors import InvalidInput

    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, str):
            bad = _bad_surrogate(item, raw_bytes)
            if bad is not None:
                raise InvalidInput(
                    f"{at} holds the escape \\u{ord(bad):04x}, a lone surrogate no text can "
                    f"hold; send valid UTF-8 text (write a raw byte in a command with printf "
                    f"'\\NNN')"
                )
        elif isinstance(item, dict):
            for key, child in item.items():
                stack.append((f"{at}.{key}" if isinstance(key, str) else at, child))
                if isinstance(key, str):
                    stack.append((at, key))
        elif isinstance(item, list):
            stack.extend((f"{at}[{i}]", child) for i, child in enumerate(item))
