"""The web page's login cookie (docs/web.md "The login cookie and forwarded ports",
docs/security.md).

``shellyard ui`` asks the server for a one-time login code with its token; the page trades the
code for a cookie. The cookie holds an opaque **web session id**, not a token: the server keeps
a record of the same kind and reach as the token the code came from (recorded with
``created_by`` naming it), found by ``web_session_hash`` — the sha256 of the id together with
the page's origin (scheme, host and port) under a label of its own. So the id

- is useless as a bearer token: a bearer secret is looked up by its plain sha256, which no
  web session's hash equals (and /mcp never takes the cookie);
- is bound to the origin that set it: sent to any other host or port it names no session;
- expires (``WEB_SESSION_TTL_S`` after login, whatever the browser keeps), ends at logout and
  when the token it came from is revoked, all checked on every request.

The cookie is HttpOnly (no script reads it) and SameSite=Strict (no other site's page sends
it). Requests that change something (any method but GET and HEAD) must also carry the
``X-Shellyard-CSRF`` header with a value derived from the cookie, which the page gets at login
and a cross-site form cannot know or set. Only ``/v1/`` routes take the cookie."""

from __future__ import annotations

import hashlib
import hmac
import time

from starlette.requests import Request

from shellyard.control.plane import ControlPlane
from shellyard.control.tokens import WEB_SESSION_TTL_S, Principal
from shellyard.errors import Forbidden, Unauthorized

#: The cookie's name is this plus the server's port: browsers keep cookies per host, not per
#: port, so two servers on one host would otherwise overwrite each other's login.
COOKIE_NAME = "shellyard_login"
CSRF_HEADER = "X-Shellyard-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: Web session ids start with this (bearer secrets with ``sy_``), so a leaked one is told apart.
WEB_SESSION_PREFIX = "syw_"


def page_origin(request: Request) -> str:
    """The origin the page was served from, as the browser addressed it."""
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    return f"{request.url.scheme}://{(request.url.hostname or '').lower()}:{port}"


def web_session_hash(origin: str, session_id: str) -> str:
    """How a web session's record is found: never the plain sha256 a bearer secret has."""
    material = b"shellyard-web-session\0" + origin.encode() + b"\0" + session_id.encode()
    return hashlib.sha256(material).hexdigest()


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
    """The principal of a login cookie: its web session must be live at this origin and not
    expired, the token it came from valid; a request that changes something must carry the
    CSRF header."""
    row = await plane.store.token_by_hash(web_session_hash(page_origin(request), secret))
    ended = (
        row is None
        or row.revoked_at is not None
        or row.created_at + WEB_SESSION_TTL_S < time.time()
    )
    if ended or row is None:
        raise Unauthorized(
            "your web login has ended (logged out, expired, or its token was revoked): run "
            "'shellyard ui' for a new login link, or send 'Authorization: Bearer TOKEN'"
        )
    parent_id = row.created_by
    if parent_id is not None:
        parent = await plane.store.get_token(parent_id)
        if parent is None or parent.revoked_at is not None:
            raise Unauthorized(
                "the token this web login came from was revoked: run 'shellyard ui' with a "
                "valid token for a new login link"
            )
    who = await plane.tokens.principal_of(row)
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
    "WEB_SESSION_PREFIX",
    "WEB_SESSION_TTL_S",
    "cookie_name",
    "cookie_principal",
    "cookie_secret",
    "csrf_of",
    "page_origin",
    "web_session_hash",
]
