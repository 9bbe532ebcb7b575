"""What the OpenAPI document declares beyond the routes' own models: the error body every
route can answer with (``{"error": {code, message, details}}``, one schema for all statuses),
the byte bodies of download routes, and the health answer. ``create_app`` applies
``ERROR_RESPONSES`` to every route, so the document lists each status a client may see."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    code: str = Field(
        description="stable machine-readable kind: invalid_input, path_refused, not_found, "
        "conflict, workspace_busy, unauthorized, forbidden, runner_unavailable, ..."
    )
    message: str = Field(description="what was wrong and what to do about it")
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorBody(BaseModel):
    """Every error answer of the API."""

    error: ErrorDetail


class HealthView(BaseModel):
    status: str
    version: str


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


#: Every status a route may answer with besides its success (E9: 503 is retryable).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("Bad input: a parameter or body field is missing, malformed or out of range."),
    401: _error("Missing, unknown or revoked bearer token."),
    403: _error("The token's scope does not allow this operation."),
    404: _error("No such object (or not visible to this token)."),
    409: _error(
        "The object's state refuses the operation, the workspace is busy (W1), or the runner "
        "is too old for an option of the request (runner_outdated: upgrade it)."
    ),
    413: _error(
        "too_large: the request body, or an upload's size or member count, is past its "
        'documented bound (docs/security.md "Limits at each door"); the message names the '
        "bound. Send less."
    ),
    422: _error("The request is well-formed but cannot be carried out (an environment change)."),
    502: _error("An upstream source (package channel or index) could not be reached."),
    503: _error(
        "A runner or the sandbox is unavailable right now, or the runner's volume is below "
        "its free-space reserve (low_on_space); retry later."
    ),
    507: _error(
        "No room: the workspace's quota or the runner's volume cannot hold the data "
        "(out_of_room), or the database's volume is full (store_full: nothing was recorded; "
        "retry once space is freed)."
    ),
}

#: The same for a route whose success is not JSON (server-sent events): FastAPI would declare
#: a ``model`` response in the route's media type, so these name the JSON content directly.
JSON_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": spec["description"],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for status, spec in ERROR_RESPONSES.items()
}

#: The 200 answer of a route that streams raw bytes.
BINARY_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The bytes, streamed.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}

#: The 200 answer of a folder download (a tar stream).
TAR_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The folder as a tar stream.",
        "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
    }
}

_BODY_MARK = "x-shellyard-body"
_BODY_MODELS: dict[str, type[BaseModel]] = {}


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose body is ``model``: the document names it. FastAPI
    sees only a JSON object (``body_of``, api/bodies.py, parses it into the model after the
    acting agent, with one clear message; a few routes read the ``dict`` themselves)."""
    _BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": True, _BODY_MARK: model.__name__}}


def _with_body_schemas(document: dict[str, Any]) -> dict[str, Any]:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for item in document.get("paths", {}).values():
        for operation in item.values():
            body = operation.get("requestBody") if isinstance(operation, dict) else None
            if not isinstance(body, dict) or _BODY_MARK not in body:
                continue
            name = body.pop(_BODY_MARK)
            ref = {"$ref": f"#/components/schemas/{name}"}
            body["content"] = {"application/json": {"schema": ref}}
            schema = _BODY_MODELS[name].model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            for def_name, definition in schema.pop("$defs", {}).items():
                schemas.setdefault(def_name, definition)
            schemas[name] = schema
    return document


def document_bodies(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI document name the models of ``body_doc`` routes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _with_body_schemas(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = [
    "BINARY_RESPONSE",
    "ERROR_RESPONSES",
    "JSON_ERROR_RESPONSES",
    "TAR_RESPONSE",
    "ErrorBody",
    "ErrorDetail",
    "HealthView",
    "body_doc",
    "document_bodies",
]
