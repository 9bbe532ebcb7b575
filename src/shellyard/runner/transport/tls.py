"""TLS for ``direct`` runners off loopback (R4): the daemon's certificate is pinned at
``runner add`` and is the only one trusted afterwards, whoever signed it.

``fetch_certificate`` takes the certificate the daemon presents (checked against the
fingerprint the operator gave, if any); ``pinned_transport`` trusts exactly that certificate
(partial-chain verification on the leaf itself; the host name is not checked, the pin is the
identity), so a self-signed daemon certificate needs no CA.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from urllib.parse import urlsplit

import httpx

from shellyard.errors import InvalidInput, RunnerUnavailable, Unauthorized

FETCH_TIMEOUT_S = 10.0


def fingerprint_of(pem: str) -> str:
    """``SHA256:<hex>`` of a PEM certificate's DER bytes."""
    return "SHA256:" + hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def _normal(fingerprint: str) -> str:
    text = fingerprint.removeprefix("SHA256:").removeprefix("sha256:").replace(":", "")
    return text.lower()


async def fetch_certificate(address: str, expected: str | None) -> tuple[str, str]:
    """The PEM certificate the daemon at ``address`` presents, and its fingerprint."""
    parts = urlsplit(address)
    host, port = parts.hostname or "", parts.port or 443
    try:
        pem = await asyncio.wait_for(
            asyncio.to_thread(ssl.get_server_certificate, (host, port)), FETCH_TIMEOUT_S
        )
    except (OSError, TimeoutError, ssl.SSLError) as e:
        raise RunnerUnavailable(
            f"cannot fetch the TLS certificate of {address} ({e!r}); is the daemon serving "
            "TLS there (runner serve --tls-cert/--tls-key)?"
        ) from e
    fingerprint = fingerprint_of(pem)
    if expected is not None and _normal(expected) != _normal(fingerprint):
        raise Unauthorized(
            f"the TLS certificate of {address} is {fingerprint}, not the expected {expected}; "
            "someone may be in the middle, or the daemon has a new certificate",
            fingerprint=fingerprint,
        )
    return pem, fingerprint


def pinned_context(pem: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cadata=pem)
    except ssl.SSLError as e:
        raise InvalidInput(f"the pinned runner certificate is not a PEM certificate: {e}") from e
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def pinned_transport(pem: str) -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(verify=pinned_context(pem))
