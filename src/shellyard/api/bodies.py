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
from pydantic import BaseModel, ValidationError

from shellyard.contract import rawjson
from shellyard.errors import InvalidInput, validation_message

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any]) -> M:
    """Validate a request body into one clear InvalidInput (a lone surrogate too)."""
    rawjson.refuse_surrogates(body, raw_bytes=True)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(validation_message(exc)) from None


def body_of(model: type[M]) -> Any:
    """The dependency that gives a handler its body as ``model``."""

    def parsed(body: dict[str, Any]) -> M:
        return parse(model, body)

    return Depends(parsed)


__all__ = ["body_of", "parse"]
