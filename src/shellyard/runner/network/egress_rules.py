"""What the egress proxy lets through: pure functions, no sockets (unit-tested as they are).

A destination passes when (1) it is an operator's exact ``host:port`` exception, or (2) its
name matches the allow-list (or the list is empty) and the address it resolved to, the one
the proxy then connects to, is public: never loopback, link-local (the cloud metadata
address 169.254.169.254 included), private, CGNAT, multicast or one of the runner's own.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Ranges no sandbox reaches through the proxy, beside the runner's own addresses.
BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this network"; 0.0.0.0 reaches the host's loopback services
        "127.0.0.0/8",  # loopback
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",  # private (RFC 1918)
        "100.64.0.0/10",  # carrier-grade NAT; some clouds' metadata lives there
        "169.254.0.0/16",  # link-local: 169.254.169.254 is the cloud metadata service
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255
        "::/128",
        "::1/128",
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
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


def _split_port(text: str, what: str) -> tuple[str, int | None]:
    if text.startswith("["):  # [v6]:port
        close = text.find("]")
        if close < 0:
            raise ValueError(f"{what} {text!r}: an IPv6 address is written [addr]:port")
        host, rest = text[1:close], text[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{what} {text!r}: expected ':port' after ']'")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        return text, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{what} {text!r}: the port must be a number from 1 to 65535")
    return host, int(port_text)


def parse_pattern(text: str) -> Pattern:
    """An allow-list entry, or ValueError saying what a valid one looks like."""
    host, port = _split_port(text.strip(), "egress allow-list entry")
    wildcard = host.startswith("*.")
    suffix = (host[2:] if wildcard else host).lower().rstrip(".")
    if not suffix or "*" in suffix or "/" in suffix or " " in suffix:
        raise ValueError(
            f"egress allow-list entry {text!r} is not a domain: write example.org, "
            f"*.example.org or example.org:8443"
        )
    return Pattern(suffix, wildcard, port)


def parse_exception(text: str) -> tuple[str, int]:
    """An operator's ``host:port`` exception, or ValueError."""
    host, port = _split_port(text.strip(), "egress exception")
    if port is None or not host:
        raise ValueError(f"egress exception {text!r} must be host:port, e.g. 10.0.0.5:3128")
    return host.lower().rstrip("."), port


def normalize(address: IPAddress) -> IPAddress:
    """An IPv4 address written as IPv6 (``::ffff:127.0.0.1``, 6to4…) is judged as IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address.teredo is not None:
            return address.teredo[1]
    return address


def blocked_reason(address: IPAddress, own: frozenset[IPAddress]) -> str | None:
    """Why the proxy refuses to connect to ``address``, or None when it may."""
    plain = normalize(address)
    for network in BLOCKED_NETWORKS:
        if plain.version == network.version and plain in network:
            return f"it is in {network}, which no sandbox may reach"
    if plain in own or address in own:
        return "it is one of the runner's own addresses"
    return None


def own_addresses() -> frozenset[IPAddress]:
    """Every address of this host's interfaces, read from /proc (no netlink helper needed):
    a connection to one of them would reach the host's services bound to 0.0.0.0."""
    found: set[IPAddress] = set()
    try:
        trie = Path("/proc/net/fib_trie").read_text()
    except OSError:
        trie = ""
    previous = ""
    for line in trie.splitlines():
        stripped = line.strip()
        if "/32 host LOCAL" in stripped and previous.startswith("|--"):
            found.add(ipaddress.IPv4Address(previous.split()[1]))
        previous = stripped
    try:
        inet6 = Path("/proc/net/if_inet6").read_text()
    except OSError:
        inet6 = ""
    for line in inet6.splitlines():
        raw = line.split()[0]
        found.add(ipaddress.IPv6Address(int(raw, 16)))
    return frozenset(found)


@dataclass(frozen=True)
class EgressRules:
    """One runner's filter, built once from its policy."""

    allow: tuple[Pattern, ...]
    exceptions: frozenset[tuple[str, int]]

    @classmethod
    def build(cls, allow: list[str], exceptions: list[str]) -> EgressRules:
        return cls(
            tuple(parse_pattern(p) for p in allow),
            frozenset(parse_exception(e) for e in exceptions),
        )

    def is_exception(self, host: str, port: int) -> bool:
        return (host.lower().rstrip(".").strip("[]"), port) in self.exceptions

    def name_refusal(self, host: str, port: int) -> str | None:
        """Why ``host:port`` is not on the allow-list, or None when it is (or there is none)."""
        if not self.allow or any(p.matches(host, port) for p in self.allow):
            return None
        return f"{host}:{port} is not on this runner's egress allow-list"
