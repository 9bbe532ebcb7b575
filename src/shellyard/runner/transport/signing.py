"""Signed runner requests (R4): an HMAC-SHA256 with the runner's key over each request.

The client signs; the daemon checks. The key never crosses the wire: a request carries

- ``X-Shellyard-Timestamp``: the sender's clock, Unix milliseconds;
- ``X-Shellyard-Nonce``: 16 random bytes (hex), so two equal requests in the same
  millisecond are still two requests;
- ``X-Shellyard-Content-SHA256``: the body's SHA-256 (hex), or ``UNSIGNED-STREAM`` for an
  upload, whose body is streamed and cannot be digested before it is sent (docs/security.md:
  its integrity rests on the channel, TLS, SSH or loopback, and its arguments are signed);
- ``Authorization: Shellyard-HMAC-SHA256 <hex>`` over method, path, timestamp, nonce, body
  digest and the upload arguments header.

The daemon refuses a signature older (or newer) than ``WINDOW_S``, one it has seen before
(``ReplayCache``), a body whose digest is not the signed one, and compares in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from shellyard.errors import RunnerUnavailable, Unauthorized
from shellyard.runner.transport.wire import H_ARGS

SCHEME = "Shellyard-HMAC-SHA256"
H_TIMESTAMP = "X-Shellyard-Timestamp"
H_NONCE = "X-Shellyard-Nonce"
H_DIGEST = "X-Shellyard-Content-SHA256"
UNSIGNED_STREAM = "UNSIGNED-STREAM"
#: A signature is accepted this long either side of the daemon's clock.
WINDOW_S = 30.0
#: At most this many signatures are remembered; a signature leaves once its window has
#: passed. A full cache refuses new requests (retryable) rather than forget a live one.
REPLAY_CACHE_SIZE = 200_000


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def string_to_sign(
    method: str, path: str, timestamp: str, nonce: str, digest: str, args: str
) -> bytes:
    return "\n".join((method.upper(), path, timestamp, nonce, digest, args)).encode("utf-8")


def sign(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def signed_headers(
    key: bytes, method: str, path: str, digest: str, args: str = "", *, now: float | None = None
) -> dict[str, str]:
    """The headers that sign one request. ``digest``: ``body_digest(body)`` or
    ``UNSIGNED_STREAM``; ``args``: the upload's ``X-Shellyard-Args`` header (else empty)."""
    timestamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(16)
    signature = sign(key, string_to_sign(method, path, timestamp, nonce, digest, args))
    return {
        H_TIMESTAMP: timestamp,
        H_NONCE: nonce,
        H_DIGEST: digest,
        "Authorization": f"{SCHEME} {signature}",
    }


class ReplayCache:
    """The signatures seen in the last window, bounded in size; thread-safe."""

    def __init__(self, window_s: float = WINDOW_S, size: int = REPLAY_CACHE_SIZE) -> None:
        self._window_s = window_s
        self._size = size
        # signature → when it may be forgotten (its timestamp + the window), oldest first.
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, signature: str, forget_at: float, now: float) -> bool:
        """Remember ``signature``; False if it was seen before."""
        with self._lock:
            # Mostly in arrival order, so expired entries are at the front.
            while self._seen:
                first, until = next(iter(self._seen.items()))
                if until > now:
                    break
                del self._seen[first]
            if signature in self._seen:
                return False
            if len(self._seen) >= self._size:
                raise RunnerUnavailable(
                    f"the runner daemon has seen {self._size} signed requests in the last "
                    f"{self._window_s:.0f} s and cannot remember more; retry shortly"
                )
            self._seen[signature] = forget_at
            return True


class Verifier:
    """Checks the signature of each request to a daemon holding ``key``."""

    def __init__(self, key: bytes, *, window_s: float = WINDOW_S, cache_size: int = 0) -> None:
        if not key:
            raise ValueError("a runner key must not be empty")
        self._key = key
        self.window_s = window_s
        self.replays = ReplayCache(window_s, cache_size or REPLAY_CACHE_SIZE)

    def check(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        now: float | None = None,
    ) -> None:
        """Raise ``Unauthorized`` unless the request is signed with the key, fresh, new, and
        (``body`` given) its body is the signed one. ``body`` None: an upload, signed as
        ``UNSIGNED_STREAM``."""
        self.check_body(self.check_headers(method, path, headers, now=now), body, now=now)

    def check_headers(
        self, method: str, path: str, headers: Mapping[str, str], *, now: float | None = None
    ) -> Signed:
        """The first half of ``check``, before the body is read: signed with the key, fresh."""
        h = {name.lower(): value for name, value in headers.items()}
        scheme, _, signature = h.get("authorization", "").partition(" ")
        timestamp = h.get(H_TIMESTAMP.lower(), "")
        nonce = h.get(H_NONCE.lower(), "")
        digest = h.get(H_DIGEST.lower(), "")
        if scheme != SCHEME or not signature or not timestamp.isdigit() or not nonce:
            raise Unauthorized(
                f"this runner daemon takes only signed requests ('Authorization: {SCHEME} …' "
                f"with {H_TIMESTAMP}, {H_NONCE} and {H_DIGEST}); register it with its key "
                "(the daemon's token file) and let shellyard sign"
            )
        args = h.get(H_ARGS.lower(), "")
        expected = sign(self._key, string_to_sign(method, path, timestamp, nonce, digest, args))
        # Constant-time compare so a signature cannot be guessed byte by byte from timings.
        if not hmac.compare_digest(signature.strip().encode(), expected.encode()):
            raise Unauthorized(
                "bad signature for this runner daemon: the request was signed with another "
                "key, or changed on the way; use the key from the daemon's token file"
            )
        now = time.time() if now is None else now
        sent = int(timestamp) / 1000
        if abs(now - sent) > self.window_s:
            raise Unauthorized(
                f"stale signed request: signed {now - sent:+.1f} s from the runner's clock, "
                f"outside its {self.window_s:.0f} s window; check both hosts' clocks (NTP)"
            )
        return Signed(signature.strip(), digest, sent)

    def check_body(self, signed: Signed, body: bytes | None, *, now: float | None = None) -> None:
        """The second half of ``check``: the body is the signed one, the signature is new."""
        if body is None:
            if signed.digest != UNSIGNED_STREAM:
                raise Unauthorized(f"an upload is signed with {H_DIGEST}: {UNSIGNED_STREAM}")
        elif not hmac.compare_digest(signed.digest.encode(), body_digest(body).encode()):
            raise Unauthorized(
                "the request body is not the one that was signed (changed on the way?); "
                "the request was refused"
            )
        now = time.time() if now is None else now
        if not self.replays.add(signed.signature, signed.sent + self.window_s, now):
            raise Unauthorized("replayed signed request: this signature was already used")


@dataclass(frozen=True)
class Signed:
    """A request whose signature checked out; its body is yet to be checked."""

    signature: str
    digest: str
    sent: float
