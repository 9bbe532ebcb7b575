"""Every row of the REST forwarding tables (api/forward.py) names a method of the control plane
that accepts what the row gives it: the path's ids, its query model or body (whole, as
``request``) and, for a row acting for an agent, ``agent_id``. The rows call by keyword,
so a service parameter renamed without its row fails here, not on the first request."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from shellyard.api.app import EXECUTION_ROUTES
from shellyard.api.environments import ENVIRONMENT_ROUTES
from shellyard.api.files import FILE_ROUTES
from shellyard.api.forward import Forward
from shellyard.api.ports import PORT_ROUTES
from shellyard.api.sessions import SESSION_ROUTES
from shellyard.control.plane import ControlPlane

ROWS: tuple[Forward, ...] = (
    *EXECUTION_ROUTES,
    *SESSION_ROUTES,
    *FILE_ROUTES,
    *ENVIRONMENT_ROUTES,
    *PORT_ROUTES,
)


def _method(dotted: str) -> Callable[..., Any]:
    """The method a dotted path names, read from the type annotations of the plane's fields
    (no plane is built here)."""
    owner: Any = ControlPlane
    *services, name = dotted.split(".")
    for service in services:
        owner = typing.get_type_hints(owner)[service]
    method: Callable[..., Any] = getattr(owner, name)
    return method


def test_every_row_names_a_method_taking_its_inputs() -> None:
    refused = []
    for row in ROWS:
        method = _method(row.service)
        names = re.findall(r"{(\w+)}", row.path)
        if row.query or row.body:
            names.append("request")
        names += ["agent_id"] if row.agent else []
        try:
            inspect.signature(method).bind(None, **dict.fromkeys(names))
        except TypeError as exc:
            refused.append(f"{row.name} -> {row.service}{inspect.signature(method)}: {exc}")
    assert not refused, "\n".join(refused)


def test_every_query_model_is_the_request_its_method_takes() -> None:
    """A row hands its query model or body whole: it must be the method's ``request`` type or the
    door's narrower subclass of it (``ExecutionWaitQuery`` of ``ExecutionWait``,
    docs/architecture.md "The doors"), never another operation's model."""
    refused = []
    for row in ROWS:
        given = row.query or row.body
        if given is None:
            continue
        wanted = typing.get_type_hints(_method(row.service)).get("request")
        # ``transfers.start`` also takes a plain mapping (its callers inside the server)
        accepted = typing.get_args(wanted) or (wanted,)
        if not any(isinstance(w, type) and issubclass(given, w) for w in accepted):
            refused.append(f"{row.name}: {given.__name__} is not a {wanted}")
    assert not refused, "\n".join(refused)


def test_route_names_are_unique() -> None:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names))
