"""The runner protocol's request signatures (R4): runner/transport/signing.py on its own."""

from __future__ import annotations

import pytest

from shellyard.errors import RunnerUnavailable, Unauthorized
from shellyard.runner.transport.signing import (
    UNSIGNED_STREAM,
    ReplayCache,
    Verifier,
    body_digest,
    signed_headers,
)

KEY = b"k" * 32
NOW = 1_800_000_000.0


def test_signed_request_verifies_once() -> None:
    verifier = Verifier(KEY)
    body = b'{"execution_id": "e1"}'
    headers = signed_headers(KEY, "POST", "/v1/status", body_digest(body), now=NOW)
    assert "k" * 32 not in "".join(headers.values())  # the key never crosses the wire
    verifier.check("POST", "/v1/status", headers, body, now=NOW + 1)
    with pytest.raises(Unauthorized, match="replayed"):
        verifier.check("POST", "/v1/status", headers, body, now=NOW + 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"method": "GET"}, "bad signature"),
        ({"path": "/v1/start"}, "bad signature"),
        ({"body": b'{"execution_id": "e2"}'}, "not the one that was signed"),
        ({"key": b"other"}, "bad signature"),
        ({"now": NOW + 30.5}, "stale"),
        ({"now": NOW - 30.5}, "stale"),
    ],
)
def test_each_changed_part_is_refused(change: dict[str, object], message: str) -> None:
    body = b'{"execution_id": "e1"}'
    headers = signed_headers(KEY, "POST", "/v1/status", body_digest(body), now=NOW)
    verifier = Verifier(change.get("key", KEY))  # type: ignore[arg-type]
    with pytest.raises(Unauthorized, match=message):
        verifier.check(
            str(change.get("method", "POST")),
            str(change.get("path", "/v1/status")),
            headers,
            change.get("body", body),  # type: ignore[arg-type]
            now=float(change.get("now", NOW)),  # type: ignore[arg-type]
        )


def test_upload_signs_its_arguments_not_its_stream() -> None:
    verifier = Verifier(KEY)
    args = '{"workspace_id": "ws", "path": "a.txt", "mode": null}'
    headers = signed_headers(KEY, "POST", "/v1/write_file", UNSIGNED_STREAM, args, now=NOW)
    verifier.check("POST", "/v1/write_file", {**headers, "X-Shellyard-Args": args}, None, now=NOW)
    # Other arguments under the same signature: refused.
    other = {**signed_headers(KEY, "POST", "/v1/write_file", UNSIGNED_STREAM, args, now=NOW)}
    other["X-Shellyard-Args"] = args.replace("a.txt", "b.txt")
    with pytest.raises(Unauthorized, match="bad signature"):
        verifier.check("POST", "/v1/write_file", other, None, now=NOW)
    # A JSON operation signed as a stream: refused (its body must be digested).
    with pytest.raises(Unauthorized, match="not the one that was signed"):
        h = signed_headers(KEY, "POST", "/v1/status", UNSIGNED_STREAM, now=NOW)
        verifier.check("POST", "/v1/status", h, b"{}", now=NOW)


def test_replay_cache_is_bounded_and_forgets_after_the_window() -> None:
    cache = ReplayCache(window_s=30, size=3)
    for i in range(3):
        assert cache.add(f"s{i}", NOW + 30, NOW)
    assert not cache.add("s0", NOW + 30, NOW + 1)
    # Full of live signatures: refuses (retryable) rather than forget one that may come back.
    with pytest.raises(RunnerUnavailable, match="cannot remember more"):
        cache.add("s3", NOW + 31, NOW + 1)
    # Once the window has passed, old entries go and new ones fit.
    assert cache.add("s3", NOW + 61, NOW + 31)
    assert len(cache) == 1
