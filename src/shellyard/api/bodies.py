"""A REST route's JSON body, parsed into its contract model before the handler runs.

A body route declares ``request: Annotated[Model, body_of(Model)]`` (and
``openapi_extra=body_doc(Model)``, api/docs.py, which names the model in the document). FastAPI
reads the body as a JSON object (what is not one is its usual validation error); ``parse`` then
validates it into the model, with one clear ``InvalidInput`` instead of pydantic's list, and
refuses a lone surrogate (a name's raw bytes, U+DC80..U+DCFF, pass:
docs/files-and-transfers.md). The handler gets the model whole (docs/architecture.md "The
doors").

The parse is a dependency, so it runs where the parameter stands among the route's other
dependencies: put it after the acting agent (``AgentHeader``) and the principal, so a request
they refuse is refused as before, whatever its body. A route that must check something first
(the E13 input, read after the owner check; the login's CSRF header) keeps its dict."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Depends
from pydantic import BaseModel

from shellyard.contract.rawjson import parse

M = TypeVar("M", bound=BaseModel)


def body_of(model: type[M]) -> Any:
    """The dependency that gives a handler its body as ``model``."""

    def parsed(body: dict[str, Any]) -> M:
        # raw_bytes: a body may name a file whose name is not UTF-8 (PEP 383 U+DC80..U+DCFF)
        return parse(model, body, raw_bytes=True)

    return Depends(parsed)


__all__ = ["body_of"]
