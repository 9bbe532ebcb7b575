"""Attack pass on the panel's PDF frame (web/__init__.py PDF_FRAME_HEADERS, FRAME_MODULES;
docs/security.md "Attack pass on the batch's new doors"): ``Access-Control-Allow-Origin: *``
is sent for the frame's public module files alone (never the panel's page, its other
scripts, the frame's own page or anything under ``/v1``), and the frame's page may be framed
by the panel's origin only. Against a real ``shellyard serve``."""

from __future__ import annotations

import httpx
from web_helpers import Served, new_session

pytest_plugins = ["web_fixtures"]

PUBLIC = ["/ui/static/pdfview.js", "/ui/static/vendor/pdfjs/pdf.min.mjs",
          "/ui/static/vendor/pdfjs/pdf.worker.min.mjs"]  # fmt: skip
PRIVATE = ["/ui/", "/ui/static/app.js", "/ui/static/api.js", "/ui/static/files.js",
           "/ui/static/index.html", "/ui/static/pdfview.html", "/ui/static/style.css",
           "/ui/static/vendor/pdfjs/../../app.js"]  # fmt: skip


def test_any_origin_is_allowed_only_the_frames_public_modules(served: Served) -> None:
    session = new_session(served)
    with httpx.Client(base_url=served.url, timeout=30) as client:
        for path in PUBLIC:
            answer = client.get(path, headers={"Origin": "null"})
            assert answer.status_code == 200, path
            assert answer.headers.get("access-control-allow-origin") == "*", path
        for path in PRIVATE:
            answer = client.get(path, headers={"Origin": "null"})
            assert "access-control-allow-origin" not in answer.headers, path
        api = client.get(
            f"/v1/sessions/{session['session_id']}",
            headers={"Origin": "null", "Authorization": f"Bearer {served.token}"},
        )
        assert api.status_code == 200 and "access-control-allow-origin" not in api.headers
        frame = client.get("/ui/static/pdfview.html")
        policy = frame.headers["content-security-policy"]
        assert "frame-ancestors 'self'" in policy and "connect-src" not in policy
        assert "default-src 'none'" in policy and frame.headers["x-frame-options"] == "SAMEORIGIN"
