"""Where a webhook may be delivered (R6; docs/notifications.md "Where webhooks may point"):
the same address rules as a sandbox's ``egress`` (``shellyard.netrules``), since the control
plane POSTs on the host's network, outside every sandbox, for whoever registered the URL.

- At registration a URL whose host is a refused address, or a name that resolves only to
  refused ones, is refused with an error saying why and what to do.
- At every delivery attempt the name is resolved again (DNS changes), once: the attempt
  connects to exactly the address that was checked (the URL is rewritten to it; ``Host`` and
  the TLS server name stay the registered name, so certificates are checked as usual).
  Redirects are never followed. A refused destination is recorded as "refused by policy"
  without any connection, so the record says nothing about the port behind it.
- The only way past: an operator's exact ``host:port`` exception
  (``SHELLYARD_WEBHOOK_EXCEPTIONS``, docs/operations.md), compared before any resolution.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from shellyard.errors import InvalidInput
from shellyard.netrules import (
    OwnAddresses,
    blocked_reason,
    normal_host,
    parse_exception,
    resolve_checked,
)

#: The words every refused delivery's record starts with.
REFUSED_BY_POLICY = "refused by policy"


class PolicyRefusal(Exception):
    """The destination is not one a webhook may reach; the message says why."""


@dataclass(frozen=True)
class Pinned:
    """One attempt's target: POST to ``url`` (the checked address), sending ``host`` as the
    Host header and ``server_name`` as the TLS server name (None for plain http)."""

    url: str
    host: str
    server_name: str | None


def parse_exceptions(pairs: list[str]) -> frozenset[tuple[str, int]]:
    """The operator's webhook exceptions, or InvalidInput naming the bad one."""
    found = set()
    for pair in pairs:
        try:
            found.add(parse_exception(pair, "webhook exception"))
        except ValueError as exc:
            raise InvalidInput(f"SHELLYARD_WEBHOOK_EXCEPTIONS: {exc}") from None
    return frozenset(found)


class WebhookPolicy:
    """The rules of one control plane: its exceptions and its host's own addresses."""

    def __init__(self, exceptions: list[str]) -> None:
        self.exceptions = parse_exceptions(exceptions)
        self._own = OwnAddresses()

    @staticmethod
    def _target(url: str) -> tuple[str, int]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput(f"webhook url {url!r} must be http:// or https:// with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise InvalidInput(f"webhook url {url!r} has a bad port") from None
        if parts.username is not None or parts.password is not None:
            raise InvalidInput(
                f"webhook url {url!r} holds a user name or password: webhooks are "
                "authenticated by their signature (X-Shellyard-Signature), drop them"
            )
        return normal_host(parts.hostname), port

    def _excepted(self, host: str, port: int) -> bool:
        return (host, port) in self.exceptions

    async def check_registration(self, url: str) -> None:
        """InvalidInput when ``url`` points where no webhook may go. A name that does not
        resolve now is accepted (every delivery resolves it again)."""
        host, port = self._target(url)
        if self._excepted(host, port):
            return
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            reasons = [reason] if (reason := blocked_reason(literal, self._own.get())) else []
        else:
            try:
                resolved = await resolve_checked(host, port, self._own.get())
            except OSError:
                return
            reasons = [] if resolved.allowed else list(resolved.refused)
        if reasons:
            raise InvalidInput(
                f"webhook url {url!r} is refused: {host} -> {'; '.join(reasons)}. Webhooks go "
                f"only to public addresses; an operator can allow this exact destination with "
                f"SHELLYARD_WEBHOOK_EXCEPTIONS={host}:{port} (docs/operations.md)"
            )

    async def pin(self, url: str) -> Pinned:
        """The address one delivery attempt connects to. PolicyRefusal when every address of
        the name is refused (no connection made); OSError when it does not resolve."""
        host, port = self._target(url)
        resolved = await resolve_checked(
            host, port, self._own.get(), exception=self._excepted(host, port)
        )
        if not resolved.allowed:
            raise PolicyRefusal(
                f"{REFUSED_BY_POLICY}: {host}:{port} -> "
                f"{'; '.join(resolved.refused) or 'no address'}"
                " (webhooks go only to public addresses, or to an operator's exact host:port "
                "exception, SHELLYARD_WEBHOOK_EXCEPTIONS)"
            )
        _family, sockaddr = resolved.allowed[0]
        address = ipaddress.ip_address(sockaddr[0])
        literal = f"[{address}]" if address.version == 6 else str(address)
        parts = urlsplit(url)
        netloc = f"{literal}:{port}"
        pinned = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        default = 443 if parts.scheme == "https" else 80
        shown = parts.hostname or host
        if ":" in shown:
            shown = f"[{shown}]"
        host_header = shown if port == default else f"{shown}:{port}"
        server_name = parts.hostname if parts.scheme == "https" else None
        return Pinned(pinned, host_header, server_name)


__all__ = ["REFUSED_BY_POLICY", "Pinned", "PolicyRefusal", "WebhookPolicy", "parse_exceptions"]
