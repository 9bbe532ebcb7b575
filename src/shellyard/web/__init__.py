"""The web page (docs/web.md): the session file panel and its "Executions and reminders" region,
a single page of plain ES modules in ``static/`` that calls the REST API (``/v1/...``) with
the login cookie and follows ``/v1/sessions/{id}/panel/stream`` for live updates. The assets
ship inside the package; nothing is built at install time or loaded from another site
(docs/web.md)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC = Path(str(files("shellyard.web") / "static"))

#: Only this origin's scripts, styles and connections; no framing (the page has buttons that
#: cancel work: nobody may overlay it), no referrer.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


#: The PDF frame (pdfview.html): framed by the panel only, which sandboxes it (an opaque
#: origin); PDF.js's worker starts from a blob, fonts come as data; nothing reaches the network.
PDF_FRAME_HEADERS = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; worker-src 'self' blob:; style-src 'self'; "
        "font-src data: blob:; img-src data: blob:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'self'"
    ),
    "X-Frame-Options": "SAMEORIGIN",
}
#: What the sandboxed frame loads as module scripts: its origin is opaque ("null"), so these
#: public files are answered for any origin (they hold no data).
FRAME_MODULES = ("pdfview.js", "vendor/pdfjs/")


class _Static(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PDF_FRAME_HEADERS if path == "pdfview.html" else SECURITY_HEADERS)
        if path.startswith(FRAME_MODULES):
            response.headers["Access-Control-Allow-Origin"] = "*"
        return response


def mount_web(app: FastAPI) -> None:
    """Serve the page at /ui/ (and send / there)."""

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ui", include_in_schema=False)
    async def ui_bare() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ui/", include_in_schema=False)
    async def ui() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=SECURITY_HEADERS)

    app.mount("/ui/static", _Static(directory=STATIC), name="web-static")


__all__ = ["STATIC", "mount_web"]
