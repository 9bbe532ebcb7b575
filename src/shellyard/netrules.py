"""Which network addresses something done on an agent's behalf may connect to (R2, R6;
docs/security.md "Network"): the one rule the runner's egress proxy and the control plane's
webhook delivery share.

An address is refused when it is in any IANA special-purpose block (the IPv4 and IPv6
special-purpose address registries, RFC 6890 and its updates, plus multicast), whatever
IPv6 spelling carries it (IPv4-mapped ``::ffff:a.b.c.d``, the deprecated IPv4-compatible
``::a.b.c.d``, NAT64 ``64:ff9b::a.b.c.d``, 6to4 ``2002:ab:cd::``, Teredo: the embedded IPv4
address is judged again), or when it is one of this host's own interface addresses (a
connection to one reaches the host's services bound to 0.0.0.0) or on one of the links those
addresses are on (the host's LAN and gateway, whatever their addresses). Only an operator's exact
``host:port`` exception gets past (the caller checks that, before resolving).

Resolution happens once (``resolve_checked``): the caller connects to exactly the address
that was checked, so DNS cannot answer differently between the check and the connection.
Pure rules but for that one resolver and the read of the host's addresses; no connection is
made here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _table(*rows: tuple[str, str]) -> tuple[tuple[Network, str], ...]:
    return tuple((ipaddress.ip_network(net), name) for net, name in rows)


#: The IANA IPv4 special-purpose registry (every entry, "globally reachable" or not: none is
#: a destination a sandbox or a webhook needs), multicast and the limited broadcast.
SPECIAL_V4 = _table(
    ("0.0.0.0/8", "'this network' (0.0.0.0 reaches the host's own services)"),
    ("10.0.0.0/8", "private-use (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT; some clouds' metadata)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (169.254.169.254 is the cloud metadata service)"),
    ("172.16.0.0/12", "private-use (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.31.196.0/24", "AS112 (DNS sink)"),
    ("192.52.193.0/24", "AMT"),
    ("192.88.99.0/24", "deprecated 6to4 relay anycast"),
    ("192.168.0.0/16", "private-use (RFC 1918)"),
    ("192.175.48.0/24", "AS112 direct delegation"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "limited broadcast"),
)

#: The IANA IPv6 special-purpose registry and the non-unicast blocks. The forms that carry an
#: IPv4 address are in ``_embedded`` (checked first); ``::/96`` (IPv4-compatible, deprecated),
#: ``::/128`` and ``::1`` are refused outright.
SPECIAL_V6 = _table(
    ("::/128", "the unspecified address"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated; ::7f00:1 is 127.0.0.1)"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("100:0:0:1::/64", "dummy prefix"),
    ("2001::/23", "IETF protocol assignments (Teredo, benchmarking, ORCHID, anycast services)"),
    ("2001:db8::/32", "documentation"),
    ("2620:4f:8000::/48", "AS112 direct delegation"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing (SRv6) SIDs"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated)"),
    ("ff00::/8", "multicast"),
)

#: Global unicast: any IPv6 address outside it is unallocated or special (IANA's IPv6 address
#: space registry), so nothing a connection should reach.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")

_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 spelling carries, and the name of that spelling."""
    if address in _MAPPED:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "IPv4-mapped"
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), "NAT64"
    if address.sixtofour is not None:
        return address.sixtofour, "6to4"
    if address.teredo is not None:
        return address.teredo[1], "Teredo"
    return None


def special_reason(address: IPAddress) -> str | None:
    """Why ``address`` is special-purpose (so refused), or None when it is public unicast."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded(address)
        if inner is not None:
            v4, form = inner
            reason = special_reason(v4)
            if reason is not None:
                return f"it is the {form} form of {v4}, {reason}"
            if form in ("IPv4-mapped", "NAT64"):
                return None  # a public IPv4 address, spelled in IPv6
            # 6to4 with a public IPv4 inside is judged as the 6to4 block (2002::/16, allowed);
            # Teredo lies in 2001::/23, refused below whatever it carries.
        for network, name in SPECIAL_V6:
            if address in network:
                return f"it is in {network} ({name})"
        if address not in GLOBAL_UNICAST_V6:
            return f"it is outside global unicast {GLOBAL_UNICAST_V6} (unallocated)"
        return None
    for network, name in SPECIAL_V4:
        if address in network:
            return f"it is in {network} ({name})"
    return None


def blocked_reason(address: IPAddress, own: frozenset[IPAddress] | Own) -> str | None:
    """Why nothing done for an agent may connect to ``address``, or None when it may."""
    reason = special_reason(address)
    if reason is not None:
        return reason + ", which nothing done for an agent may reach"
    plain = address
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded(address)
        if inner is not None:
            plain = inner[0]
    if address in own or plain in own:
        if isinstance(own, Own) and plain not in own.addresses and address not in own.addresses:
            return "it is on one of this host's own links (its LAN, not the internet)"
        return "it is one of this host's own addresses"
    return None


def own_addresses() -> frozenset[IPAddress]:
    """Every address of this host's interfaces (in this network namespace), read from /proc:
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


def own_links() -> tuple[Network, ...]:
    """The networks this host's interface addresses are on (address/prefix length, as ``ip
    addr`` shows them): the runner's own links, whose neighbours and gateway are the host's
    LAN, not the internet. Routes added to a device without an address on it are not links.
    Empty when ``ip`` (iproute2) is not there; the own addresses still apply."""
    try:
        done = subprocess.run(
            ["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=10, check=True
        )
        interfaces = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    found: set[Network] = set()
    for interface in interfaces if isinstance(interfaces, list) else ():
        for info in interface.get("addr_info", ()):
            try:
                found.add(
                    ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
                )
            except (KeyError, ValueError):
                continue
    return tuple(sorted(found, key=lambda n: (n.version, n)))


@dataclass(frozen=True)
class Own:
    """What is the host's own: its addresses and the links they are on."""

    addresses: frozenset[IPAddress]
    links: tuple[Network, ...] = ()

    def __contains__(self, address: object) -> bool:
        if address in self.addresses:
            return True
        return any(
            isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address)
            and address.version == link.version
            and address in link
            for link in self.links
        )


class OwnAddresses:
    """The host's addresses and links, read again at most every ``refresh_s`` (interfaces
    change)."""

    def __init__(self, refresh_s: float = 30.0) -> None:
        self.refresh_s = refresh_s
        self._own = Own(frozenset())
        self._read = -refresh_s - 1.0

    def get(self) -> Own:
        now = time.monotonic()
        if now - self._read > self.refresh_s:
            self._own = Own(own_addresses(), own_links())
            self._read = now
        return self._own


def split_host_port(text: str, what: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port``; ValueError naming ``what`` when malformed."""
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


def parse_exception(text: str, what: str = "egress exception") -> tuple[str, int]:
    """An operator's exact ``host:port`` exception, or ValueError."""
    host, port = split_host_port(text.strip(), what)
    if port is None or not host:
        raise ValueError(f"{what} {text!r} must be host:port, e.g. 10.0.0.5:3128")
    host = normal_host(host)
    if not _is_address(host) and not _HOST_NAME.fullmatch(host):
        raise ValueError(
            f"{what} {text!r} names one host (a name or an address) and one port, no ranges "
            f"or wildcards, e.g. 10.0.0.5:3128"
        )
    return host, port


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def normal_host(host: str) -> str:
    """A host as exceptions compare it: lower case, no trailing dot, no IPv6 brackets, an
    address in its canonical spelling."""
    host = host.lower().rstrip(".").strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


#: An AF_INET or AF_INET6 socket address, as getaddrinfo gives it.
SockAddr = tuple[str, int] | tuple[str, int, int, int]


@dataclass(frozen=True)
class Resolved:
    """What ``resolve_checked`` found: the addresses that may be dialled (in the resolver's
    order, with the socket family and address to connect to) and why the others may not."""

    allowed: tuple[tuple[socket.AddressFamily, SockAddr], ...]
    refused: tuple[str, ...]


#: The kinds of special block a package registry (``SHELLYARD_PACKAGE_REGISTRIES``) may be
#: served from: some networks put a registry behind an address of a documentation or
#: benchmarking block (this project's own machines map pypi.org to 203.0.113.80). Loopback,
#: private, link-local, the host's own addresses and links and every other special block stay
#: refused for a registry too; a private mirror is an exact egress exception instead
#: (docs/security.md "Network, per mode").
_REGISTRY_TOLERATED = ("(documentation", "(benchmarking)")
#: A registry entry without a port means HTTPS.
REGISTRY_PORT = 443


def parse_registry(text: str) -> tuple[str, int]:
    """A package registry entry (``pypi.org``, ``mirror.example.org:8443``, an address): one
    host, its port 443 unless given; ValueError saying what a valid one looks like."""
    host, port = split_host_port(text.strip(), "package registry")
    host = normal_host(host)
    if not host or not (_is_address(host) or _HOST_NAME.fullmatch(host)):
        raise ValueError(
            f"package registry {text!r} must be one host (a name or an address) with an "
            f"optional port, no wildcard or path, e.g. pypi.org or mirror.example.org:8443"
        )
    return host, REGISTRY_PORT if port is None else port


def registry_tolerates(address: IPAddress) -> bool:
    """Whether ``address`` of a listed package registry may be dialled although special."""
    reason = special_reason(address) or ""
    return any(kind in reason for kind in _REGISTRY_TOLERATED)


def registry_hint(refused: Sequence[str]) -> str:
    """What to tell about a destination refused for sitting in a block a registry may use."""
    if not any(kind in reason for reason in refused for kind in _REGISTRY_TOLERATED):
        return ""
    return (
        "; if this host is a package registry served from there, name it (host or host:port) "
        "in the runner's SHELLYARD_PACKAGE_REGISTRIES"
    )


async def resolve_checked(
    host: str,
    port: int,
    own: frozenset[IPAddress] | Own,
    *,
    exception: bool = False,
    registry: bool = False,
) -> Resolved:
    """Resolve ``host`` once and sort its addresses into those that may be dialled and those
    refused (``exception``: an operator's exact host:port, every address may; ``registry``:
    a listed package registry's host:port, which may sit in a documentation or benchmarking
    block, ``registry_tolerates``). OSError when the name does not resolve."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot resolve {host}: {exc.strerror}") from None
    allowed: list[tuple[socket.AddressFamily, SockAddr]] = []
    refused = []
    for family, _type, _proto, _name, sockaddr in infos:
        if not isinstance(sockaddr[0], str):
            continue  # not an IP address (AF_INET and AF_INET6 only are asked for by SOCK_STREAM)
        address = ipaddress.ip_address(sockaddr[0])
        reason = None if exception else blocked_reason(address, own)
        if reason is not None and registry and address not in own:
            reason = None if registry_tolerates(address) else reason
        if reason is None:
            allowed.append((socket.AddressFamily(family), sockaddr))
        else:
            refused.append(f"{address}: {reason}")
    return Resolved(tuple(allowed), tuple(refused))


__all__ = [
    "GLOBAL_UNICAST_V6",
    "REGISTRY_PORT",
    "SPECIAL_V4",
    "SPECIAL_V6",
    "IPAddress",
    "Own",
    "OwnAddresses",
    "Resolved",
    "blocked_reason",
    "normal_host",
    "own_addresses",
    "own_links",
    "parse_exception",
    "parse_registry",
    "registry_hint",
    "registry_tolerates",
    "resolve_checked",
    "special_reason",
    "split_host_port",
]
