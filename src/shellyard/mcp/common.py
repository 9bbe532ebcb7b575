"""What every MCP tool module shares: the ToolError of a ShellyardError, the tool hints, and
``add_model_tool``, which makes a tool's signature (so its input
schema) from a request model of ``shellyard.contract``: a field's description, bounds and
default are written once, in the model, for REST, the SDK and MCP alike."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

import pydantic_core
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

from shellyard.contract.rawjson import marked
from shellyard.errors import InvalidInput, ShellyardError, validation_message
from shellyard.mcp.compact import StrictTool, compact_schema, result_text

M = TypeVar("M", bound=BaseModel)


def hints(
    *,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
) -> ToolAnnotations:
    """Every hint spelled out: MCP's defaults (destructive, open world) are the opposite of
    most of shellyard's tools."""
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


#: Status, logs, lists, reads, discover: nothing changes, asking twice is asking once.
READ = hints(read_only=True, idempotent=True)


def tool_error(exc: ShellyardError) -> ToolError:
    # A plain exception reaches the client only as "Error executing tool X" (mcp 2.x).
    return ToolError(f"{exc.code}: {exc.message}")


def parse_request(model: type[M], arguments: dict[str, Any]) -> M:
    """The request model of a tool call, with the model's own checks (exactly-one rules,
    ranges with a message of their own) and its errors worded as over REST."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise tool_error(InvalidInput(validation_message(exc))) from None


def _parameter(name: str, field: FieldInfo, default: Any) -> inspect.Parameter:
    # The field's constraints and description, without its default (the signature's default
    # carries it: pydantic refuses a default inside Annotated next to one outside).
    info = Field(
        description=field.description,
        title=field.title,
        validation_alias=field.validation_alias,
        examples=field.examples,
        json_schema_extra=field.json_schema_extra,
    )
    # Annotated[(T, *metadata)] is Annotated[T, m1, m2, ...], built from values at run time.
    metadata: tuple[Any, ...] = (field.annotation, *field.metadata, info)
    annotation: Any = Annotated[metadata]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default
    )


def model_signature(
    model: type[BaseModel],
    *,
    exclude: Sequence[str] = (),
    defaults: dict[str, Any] | None = None,
) -> list[inspect.Parameter]:
    """One keyword parameter per field of ``model`` (but ``exclude``), with its default unless
    ``defaults`` names one the door chooses deliberately (a named constant of the contract)."""
    params = []
    for name, field in model.model_fields.items():
        if name in exclude:
            continue
        if defaults and name in defaults:
            default = defaults[name]
        elif field.is_required():
            default = inspect.Parameter.empty
        else:
            default = field.get_default(call_default_factory=True)
        params.append(_parameter(name, field, default))
    return params


Handler = Callable[[Any, Context], Awaitable[dict[str, Any] | CallToolResult]]


def model_tool(
    name: str,
    model: type[BaseModel] | None,
    handler: Handler,
    *,
    title: str,
    description: str,
    annotations: ToolAnnotations,
    output: type[BaseModel] | None = None,
    exclude: Sequence[str] = (),
    defaults: dict[str, Any] | None = None,
) -> Tool:
    """Tool ``name``: its arguments are ``model``'s fields, validated by ``model`` and handed
    to ``handler`` as one request (``None`` when the tool takes no arguments) with the call's
    context. ``output`` is the model of what ``handler`` returns: its JSON schema is the
    tool's outputSchema, while the result itself stays the handler's dict."""
    params = model_signature(model, exclude=exclude, defaults=defaults) if model else []
    ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)

    async def tool(ctx: Context, **arguments: Any) -> dict[str, Any] | CallToolResult:
        request = parse_request(model, arguments) if model is not None else None
        try:
            return for_model(name, await handler(request, ctx))
        except ShellyardError as exc:
            raise tool_error(exc) from None

    tool.__name__ = name
    tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*params, ctx_param], return_annotation=dict[str, Any]
    )
    # The SDK finds the Context parameter through the annotations.
    tool.__annotations__ = {"ctx": Context, "return": dict[str, Any]}
    made = StrictTool.from_function(
        tool, name=name, title=title, description=description, annotations=annotations
    )
    # What a model reads of the tool: the arguments' schema without pydantic's boilerplate,
    # closed (StrictTool refuses any other argument). Validation is still the model's.
    made.parameters = compact_schema(made.parameters)
    if output is not None:
        # Advertised as the result model's schema; the SDK still fills structuredContent
        # from the dict exactly as before (its dict[str, Any] output model validates it).
        made.fn_metadata.output_schema = output_schema(output)
    return made


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    return compact_schema(model.model_json_schema(mode="serialization"), arguments=False)


def utf8_only(value: Any) -> Any:
    """``value`` with every string that is not UTF-8 (a file name's raw bytes, PEP 383) in
    its marked form ``/`` + escape (docs/files-and-transfers.md "Names that are not UTF-8"):
    MCP's wire is strict UTF-8 JSON and would refuse it; the marked form names it back.

    ``value`` itself when pydantic's JSON encoder takes it whole, which it does unless a
    string (or something else) is not UTF-8: one pass in C instead of a Python call per
    string and container of every result (docs/benchmarks.md §54)."""
    try:
        pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return _marked_strings(value)
    return value


def _marked_strings(value: Any) -> Any:
    if isinstance(value, str):
        return marked(value)
    if isinstance(value, dict):
        return {_marked_strings(k): _marked_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_marked_strings(v) for v in value]
    return value


def for_model(tool: str, result: dict[str, Any] | CallToolResult) -> CallToolResult:
    """``result`` with its text block written for a model (``compact.result_text``): short,
    the outcome first; the structured content is the result, names that are not UTF-8 in
    their marked form (``utf8_only``)."""
    if isinstance(result, dict):
        result = utf8_only(result)
    if isinstance(result, CallToolResult):
        data = result.structured_content
        if not isinstance(data, dict) or result.is_error:
            return result
        rest = [block for block in result.content if not isinstance(block, TextContent)]
        text = TextContent(type="text", text=result_text(tool, data))
        return result.model_copy(update={"content": [text, *rest]})
    return CallToolResult(
        content=[TextContent(type="text", text=result_text(tool, result))],
        structured_content=result,
    )


__all__ = [
    "READ",
    "for_model",
    "hints",
    "model_signature",
    "model_tool",
    "output_schema",
    "parse_request",
    "tool_error",
]
