"""What a model reads of the MCP door, kept small (docs/mcp.md, "What a tool costs a model").

Two things are derived here, never written by hand:

- ``compact_schema``: a request model's JSON schema without what costs a model tokens and tells
  it nothing: no ``title`` on every property, an optional field shown as its own type rather
  than ``anyOf: [{type: X}, {type: "null"}]`` with ``default: null``, and
  ``additionalProperties: false`` at the top, since unknown arguments are refused
  (``StrictTool``).
- a result's schema keeps its nulls, but an optional field is ``type: [X, "null"]`` rather
  than ``anyOf: [{type: X}, {type: "null"}]``: the same values, fewer characters, and a
  client validating each result against it (the mcp package's does, with jsonschema) spends
  ~40 % less on it (docs/benchmarks.md §55).
- ``result_text``: the text block of a tool result, short and in the order a model needs it
  (state and exit code, then the output); ``structuredContent`` stays the whole result.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import BaseModel

_NULL = {"type": "null"}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    # `X | None = None` is pydantic's anyOf [X, null] with default null: the model only needs
    # X (leaving the field out means null).
    options = schema.get("anyOf")
    if not isinstance(options, list) or _NULL not in options:
        return schema
    if schema.get("default", 0) is not None:
        return schema
    rest = [option for option in options if option != _NULL]
    merged = {key: value for key, value in schema.items() if key not in ("anyOf", "default")}
    if len(rest) == 1:
        return {**rest[0], **merged}
    return {**merged, "anyOf": rest}


#: Keywords that constrain only values of one JSON type (and annotations, which constrain
#: nothing): a branch made of these and ``type`` accepts ``null`` exactly when its type list
#: says so, so ``anyOf [branch, null]`` is ``branch`` with "null" added to its type.
_ONE_TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "patternProperties",
               "propertyNames", "minProperties", "maxProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "boolean": set(),
}  # fmt: skip
_ANNOTATIONS = {"title", "description", "default", "examples", "deprecated"}


def _null_as_type(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, {type: "null"}]`` as X with "null" in its ``type``, where that accepts
    the same values (X has one type and only keywords of that type); else ``schema``."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or _NULL not in options:
        return schema
    branch = options[0] if options[1] == _NULL else options[1]
    kind = branch.get("type") if isinstance(branch, dict) else None
    if not isinstance(kind, str) or kind not in _ONE_TYPE_KEYWORDS:
        return schema
    allowed = _ONE_TYPE_KEYWORDS[kind] | _ANNOTATIONS | {"type"}
    if not set(branch) <= allowed or set(branch) & set(schema) - {"anyOf"}:
        return schema
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**rest, **branch, "type": [kind, "null"]}


def compact(node: Any, *, arguments: bool) -> Any:
    """``node`` (a JSON schema or part of one) without titles; for ``arguments`` (what a
    caller sends) also without the null-union noise of optional fields. A result's schema
    keeps its nulls: the result does hold null where nothing is known."""
    if isinstance(node, list):
        return [compact(item, arguments=arguments) for item in node]
    if not isinstance(node, dict):
        return node
    shaped = _without_null(node) if arguments else _null_as_type(node)
    out: dict[str, Any] = {}
    for key, value in shaped.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            # Names of fields, not schema keywords: a field may well be called "title".
            out[key] = {name: compact(sub, arguments=arguments) for name, sub in value.items()}
        else:
            out[key] = compact(value, arguments=arguments)
    return out


def compact_schema(schema: dict[str, Any], *, arguments: bool = True) -> dict[str, Any]:
    """A tool's input schema (``arguments``: compacted and closed, no other argument
    accepted) or output schema (titles dropped), from the model's own."""
    made: dict[str, Any] = compact(schema, arguments=arguments)
    if arguments and made.get("type") == "object":
        made["additionalProperties"] = False
    return made


def accepted_arguments(tool: Tool) -> list[str]:
    """The argument names ``tool`` takes, as a caller spells them (aliases too)."""
    return list(_accepted(tool.fn_metadata.arg_model))


@functools.cache
def _accepted(arg_model: type[BaseModel]) -> tuple[str, ...]:
    # Once per tool's argument model, not on every call (StrictTool.run asks each time).
    names: list[str] = []
    for name, field in arg_model.model_fields.items():
        names.append(field.alias or name)
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        if isinstance(alias, str):
            names.append(alias)
        elif choices:
            names.extend(choice for choice in choices if isinstance(choice, str))
    return tuple(dict.fromkeys(names))


class StrictTool(Tool):
    """A tool that refuses an argument it does not take, as REST refuses an unknown body
    field: a model that misspells ``wait_ms`` must hear about it, not run without it."""

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> Any:
        accepted = _accepted(self.fn_metadata.arg_model)
        unknown = sorted(set(arguments).difference(accepted))
        if unknown:
            listed = ", ".join(accepted) if accepted else "none"
            raise ToolError(
                f"invalid_input: {self.name} does not take {', '.join(map(repr, unknown))}; "
                f"the arguments it takes: {listed}"
            )
        return await super().run(arguments, context, convert_result=convert_result)


def _clock(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _execution_line(data: dict[str, Any]) -> str:
    """``completed, exit 0 (ex_…, 12 ms)``: the outcome first, then the id."""
    state = data.get("state")
    parts = [str(state)]
    if data.get("exit_code") is not None:
        parts.append(f"exit {data['exit_code']}")
    head = ", ".join(parts)
    facts = [str(data.get("execution_id"))]
    started, finished = data.get("started_at"), data.get("finished_at")
    if isinstance(started, (int, float)) and isinstance(finished, (int, float)):
        facts.append(_clock(max(0.0, finished - started)))
    if data.get("environment_id"):
        facts.append(f"env {data['environment_id']} r{data.get('environment_revision')}")
    if data.get("read_only"):
        facts.append("read-only")
    line = f"{head} ({', '.join(facts)})"
    if data.get("error"):
        line += f"\nerror: {data['error']}"
    if state in ("queued", "running"):
        line += (
            "\nstill going: follow it with execution_status / execution_logs, stop it with "
            "execution_cancel"
        )
        if data.get("waiting_for"):
            line += f" (queued behind {data['waiting_for']})"
    return line


def _run_text(data: dict[str, Any]) -> str:
    lines = [_execution_line(data)]
    if data.get("note"):
        lines.append(f"note: {data['note']}")
    for stream in ("stdout", "stderr"):
        text = data.get(stream) or ""
        if text:
            lines.append(f"--- {stream} ---\n{text.rstrip(chr(10))}")
    if data.get("output_truncated"):
        lines.append("(output cut: the whole logs are in execution_logs)")
    return "\n".join(lines)


def _logs_text(data: dict[str, Any]) -> str:
    start, end = data.get("offset"), data.get("next_offset")
    where = f"{data.get('stream')} bytes {start}..{end} of {data.get('size')}"
    more = "complete" if data.get("complete") else f"more from next_offset {end}"
    head = f"{data.get('execution_id')} {data.get('state')}: {where}, {more}"
    return f"{head}\n{data.get('data', '')}"


def result_text(tool: str, data: dict[str, Any]) -> str:
    """The text block of ``tool``'s result ``data``: the executions' in words, the others as
    compact JSON (every field, no indentation)."""
    if tool == "run_shell" and "execution_id" in data:
        return _run_text(data)
    if tool in ("execution_status", "execution_cancel") and "execution_id" in data:
        return _execution_line(data)
    if tool == "execution_logs" and "data" in data:
        return _logs_text(data)
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


__all__ = ["StrictTool", "accepted_arguments", "compact_schema", "result_text"]
