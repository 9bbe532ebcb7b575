"""Routes that only hand their inputs to one service method, declared as rows of a table.

Most REST operations take ids from the path, a few query parameters and the acting agent, and
give them to a control-plane method unchanged. Written as a handler each, they repeated every
parameter three times (the handler's signature, the call, the service's signature) and added
nothing. A ``Forward`` row names the method instead, and the request of a GET is one model
(``Annotated[Model, Query()]``: FastAPI reads the query string into it and documents its fields
as the operation's parameters, their bounds included). ``add_routes`` builds one handler per row:

- the path's ``{ids}`` are strings, given by name;
- the query model is given whole as ``request`` (the operation's model from contract/: the
  method's ``request`` parameter, docs/architecture.md "The doors");
- ``agent=True``: the acting agent (``AgentHeader``, api/auth.py) is given as ``agent_id``;
- a POST's JSON body is given whole as ``request``, parsed into the row's ``body`` model
  (api/bodies.py) after the acting agent is known, and named in the document (``body_doc``).

The route keeps its name (the OpenAPI operationId), its success model and its dependencies, so
the document and the answers are those of the handlers it replaces. A route that does anything
else (checks something first, sets a header, streams) stays a handler of its router module.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.params import Depends
from pydantic import BaseModel

from shellyard.api.auth import AgentHeader
from shellyard.api.bodies import body_of
from shellyard.api.docs import body_doc
from shellyard.control.plane import ControlPlane

_PATH_ID = re.compile(r"{(\w+)}")


@dataclass(frozen=True)
class Forward:
    method: str
    path: str
    #: the route's name: its OpenAPI operationId, as the handler it replaces had
    name: str
    #: the method called, as a dotted path from the ``ControlPlane``: "executions.status"
    service: str
    #: the success model (the answer is validated and documented as this)
    result: Any
    #: the request's query parameters, one model (given whole as the method's ``request``)
    query: type[BaseModel] | None = None
    #: whether the acting agent is given (as ``agent_id``)
    agent: bool = False
    dependencies: Sequence[Depends] = ()
    #: the JSON body's model (given whole as the method's ``request``; a row has a query model
    #: or a body, never both)
    body: type[BaseModel] | None = None


def _method(plane: ControlPlane, dotted: str) -> Callable[..., Awaitable[Any]]:
    # the plane is built before any app is made over it (docs/architecture.md "Wiring")
    target: Any = plane
    for part in dotted.split("."):
        target = getattr(target, part)
    method: Callable[..., Awaitable[Any]] = target
    return method


def _handler(plane: ControlPlane, row: Forward) -> Callable[..., Awaitable[Any]]:
    named = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter(n, named, annotation=str) for n in _PATH_ID.findall(row.path)]
    if row.query is not None:
        model: Any = row.query
        parameters.append(inspect.Parameter("request", named, annotation=Annotated[model, Query()]))
    if row.agent:
        parameters.append(
            inspect.Parameter("agent_id", named, annotation=AgentHeader, default=None)
        )
    if row.body is not None:
        assert row.query is None, f"{row.name}: a query model or a body, not both"
        body: Any = row.body
        parameters.append(
            inspect.Parameter("request", named, annotation=Annotated[body, body_of(body)])
        )

    method = _method(plane, row.service)

    async def handler(**given: Any) -> Any:
        return await method(**given)

    handler.__name__ = handler.__qualname__ = row.name
    # FastAPI reads the parameters it fills from the handler's signature
    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        parameters, return_annotation=row.result
    )
    return handler


def add_routes(router: APIRouter, plane: ControlPlane, rows: Sequence[Forward]) -> None:
    """One route per row on ``router`` (its defaults, such as its response class, apply)."""
    for row in rows:
        router.add_api_route(
            row.path,
            _handler(plane, row),
            methods=[row.method],
            name=row.name,
            response_model=row.result,
            dependencies=list(row.dependencies),
            openapi_extra=None if row.body is None else body_doc(row.body),
        )


__all__ = ["Forward", "add_routes"]
