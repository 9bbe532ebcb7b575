"""What the egress proxy lets through: pure functions, no sockets (unit-tested as they are).

A destination passes when (1) it is an operator's exact ``host:port`` exception, or (2) its
name matches the allow-list (or the list is empty) and the address it resolved to, the one
the proxy then connects to, is public: never in an IANA special-purpose block (loopback,
link-local with the cloud metadata address, private, CGNAT, documentation, benchmarking,
multicast…, in any IPv6 spelling) nor one of the runner's own (``shellyard.netrules``, shared
with webhook delivery).
"""

from __future__ import annotations

from dataclasses import dataclass

# The address rules are shared with the control plane's webhook delivery: one module for both.
from shellyard.netrules import (
    IPAddress,
    blocked_reason,
    normal_host,
    own_addresses,
    parse_exception,
    split_host_port,
)

#: Without a port, an allow-list entry means the web's two ports.
DEFAULT_PORTS = (80, 443)


@dataclass(frozen=True)
class Pattern:
    """``example.org`` (that name), ``*.example.org`` (names below it, not itself); ``port``
    None means 80 and 443."""

    suffix: str
    wildcard: bool
    port: int | None

    def matches(self, host: str, port: int) -> bool:
        if port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        host = host.lower().rstrip(".")
        if self.wildcard:
            return host.endswith("." + self.suffix)
        return host == self.suffix


def parse_pattern(text: str) -> Pattern:
    """An allow-list entry, or ValueError saying what a valid one looks like."""
    host, port = split_host_port(text.strip(), "egress allow-list entry")
    wildcard = host.startswith("*.")
    suffix = (host[2:] if wildcard else host).lower().rstrip(".")
    if not suffix or "*" in suffix or "/" in suffix or " " in suffix:
        raise ValueError(
            f"egress allow-list entry {text!r} is not a domain: write example.org, "
            f"*.example.org or example.org:8443"
        )
    return Pattern(suffix, wildcard, port)


@dataclass(frozen=True)
class EgressRules:
    """One runner's filter, built once from its policy."""

    allow: tuple[Pattern, ...]
    exceptions: frozenset[tuple[str, int]]
    #: Package registries (host, port): their address may sit in a documentation or
    #: benchmarking block (``netrules.registry_tolerates``); nothing else is relaxed for them.
    registries: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def build(
        cls,
        allow: list[str],
        exceptions: list[str],
        registries: list[tuple[str, int]] | None = None,
    ) -> EgressRules:
        return cls(
            tuple(parse_pattern(p) for p in allow),
            frozenset(parse_exception(e) for e in exceptions),
            frozenset((normal_host(h), p) for h, p in registries or ()),
        )

    def is_exception(self, host: str, port: int) -> bool:
        return (normal_host(host), port) in self.exceptions

    def is_registry(self, host: str, port: int) -> bool:
        return (normal_host(host), port) in self.registries

    def name_refusal(self, host: str, port: int) -> str | None:
        """Why ``host:port`` is not on the allow-list, or None when it is (or there is none)."""
        if not self.allow or any(p.matches(host, port) for p in self.allow):
            return None
        return f"{host}:{port} is not on this runner's egress allow-list"


__all__ = [
    "DEFAULT_PORTS",
    "EgressRules",
    "IPAddress",
    "Pattern",
    "blocked_reason",
    "own_addresses",
    "parse_exception",
    "parse_pattern",
]
