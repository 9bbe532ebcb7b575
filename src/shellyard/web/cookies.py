"""The web page's login cookie (docs/web.md, docs/security.md).

``shellyard ui`` asks the server for a one-time login code with its token; the page trades the
code for a cookie. The cookie carries the secret of a new token of the same kind and reach as
the one the code came from (recorded with ``created_by`` naming it), so every check that
applies to bearer tokens applies to the cookie too, and revoking the token it came from (or the
cookie's own, e.g. by logging out) ends it on the next request.

The cookie is HttpOnly (no script reads it) and SameSite=Strict (no other site's page sends
it). Requests that change something (any method but GET and HEAD) must also carry the
``X-Shellyard-CSRF`` header with a value derived from the cookie's secret, which the page gets
at login and a cross-site form cannot know or set. Only ``/v1/`` routes take the cookie: /mcp
clients send bearer tokens."""

from __future__ import annotations

import hashlib
import hmac

from starlette.requests import Request

from shellyard.control.plane import ControlPlane
from shellyard.control.tokens import Principal, hash_secret
from shellyard.errors import Forbidden, Unauthorized

#: The cookie's name is this plus the server's port: browsers keep cookies per host, not per
#: port, so two servers on one host would otherwise overwrite each other's login.
COOKIE_NAME = "shellyard_login"
CSRF_HEADER = "X-Shellyard-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_of(secret: str) -> str:
    """The value the page must send in ``X-Shellyard-CSRF`` with its cookie."""
    return hashlib.sha256(b"shellyard-csrf\0" + secret.encode()).hexdigest()[:40]


def cookie_secret(request: Request) -> str | None:
    """The login cookie's secret, if the request carries one on a route that takes it."""
    if not request.url.path.startswith("/v1/"):
        return None
    return request.cookies.get(cookie_name(request)) or None


def cookie_name(request: Request) -> str:
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    return f"{COOKIE_NAME}_{port}"


async def cookie_principal(request: Request, plane: ControlPlane, secret: str) -> Principal:
    """The principal of a login cookie: its token must be valid and so must the token it was
    made from; a request that changes something must carry the CSRF header."""
    try:
        who = await plane.tokens.authenticate(secret)
    except Unauthorized:
        raise Unauthorized(
            "your web login has ended (logged out, or its token was revoked): run "
            "'shellyard ui' for a new login link, or send 'Authorization: Bearer TOKEN'"
        ) from None
    row = await plane.tokens.records.by_hash(hash_secret(secret))
    parent_id = None if row is None else row["created_by"]
    if parent_id is not None:
        parent = await plane.tokens.records.get(str(parent_id))
        if parent is None or parent["revoked_at"] is not None:
            raise Unauthorized(
                "the token this web login came from was revoked: run 'shellyard ui' with a "
                "valid token for a new login link"
            )
    if request.method not in SAFE_METHODS:
        sent = request.headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent, csrf_of(secret)):
            raise Forbidden(
                f"a request that changes something with the login cookie must carry the "
                f"{CSRF_HEADER} header the page got at login (reload the page to get it again)"
            )
    return who


__all__ = [
    "COOKIE_NAME",
    "CSRF_HEADER",
    "cookie_name",
    "cookie_principal",
    "cookie_secret",
    "csrf_of",
]
