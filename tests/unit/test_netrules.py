"""The address rules shared by the egress proxy and webhook delivery (R2, R6;
``shellyard.netrules``, docs/security.md "Network"): every IANA special-purpose block, in every
IPv6 spelling that carries an IPv4 address, and the host's own addresses are refused; public
unicast passes. The proxy and delivery themselves are tested with real processes in
tests/integration/test_network.py and test_webhook_policy.py."""

from __future__ import annotations

import ipaddress

import pytest

from shellyard import netrules
from shellyard.netrules import (
    SPECIAL_V4,
    SPECIAL_V6,
    Own,
    blocked_reason,
    normal_host,
    own_addresses,
    own_links,
    parse_exception,
    special_reason,
)
from shellyard.runner.network.egress_rules import EgressRules

#: Each of these was reachable before (the proxy dialled 192.0.2.1 and 198.18.0.1, and took
#: the IPv4-compatible and NAT64 spellings of 127.0.0.1 for public addresses).
REFUSED = [
    "0.1.2.3",
    "100.64.0.1",
    "192.0.0.9",  # IETF protocol assignments (PCP anycast)
    "192.0.2.1",  # TEST-NET-1
    "192.31.196.1",
    "192.52.193.1",
    "192.88.99.1",
    "192.175.48.1",
    "198.18.0.1",  # benchmarking
    "198.19.255.254",
    "198.51.100.7",  # TEST-NET-2
    "203.0.113.9",  # TEST-NET-3
    "240.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "::0.0.0.2",
    "::ffff:7f00:1",  # IPv4-mapped 127.0.0.1
    "::ffff:192.0.2.1",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::c0a8:101",  # NAT64 of 192.168.1.1
    "64:ff9b:1::1",  # local-use NAT64
    "100::1",
    "2001::1",  # Teredo
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo carrying a public address
    "2001:2::1",  # benchmarking
    "2001:10::1",
    "2001:db8::1",
    "2002:c000:201::1",  # 6to4 of 192.0.2.1
    "2002:a00:1::1",  # 6to4 of 10.0.0.1
    "2620:4f:8000::1",
    "3fff::1",
    "5f00::1",
    "fec0::1",
    "ff02::1",
    "4000::1",  # outside global unicast
]


@pytest.mark.parametrize("address", REFUSED)
def test_every_special_purpose_form_is_refused(address: str) -> None:
    """R2/R6: what nothing done for an agent may connect to, with a reason naming the block."""
    reason = blocked_reason(ipaddress.ip_address(address), frozenset())
    assert reason is not None and "it is" in reason


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "1.1.1.1",
        "198.20.0.2",
        "2606:4700::1111",
        "2a00:1450::1",
        "::ffff:93.184.216.34",
        "64:ff9b::5db8:d822",
        "2002:5db8:d822::1",
    ],
)
def test_public_unicast_passes_in_every_spelling(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address), frozenset()) is None


def test_the_table_covers_each_block_at_both_ends() -> None:
    """Each block's first and last address is refused (no off-by-one in a prefix)."""
    for network, _name in (*SPECIAL_V4, *SPECIAL_V6):
        for address in (network.network_address, network.broadcast_address):
            assert special_reason(address) is not None, address


def test_own_addresses_are_refused_in_their_spellings() -> None:
    own = frozenset({ipaddress.ip_address("93.184.216.34")})
    for spelled in ("93.184.216.34", "::ffff:93.184.216.34", "64:ff9b::5db8:d822"):
        assert "own" in (blocked_reason(ipaddress.ip_address(spelled), own) or "")
    assert ipaddress.ip_address("127.0.0.1") in own_addresses()


def test_the_hosts_own_links_are_refused() -> None:
    """The runner's own links (its LAN and gateway), whatever their addresses; not others."""
    own = Own(frozenset(), (ipaddress.ip_network("93.184.216.0/24"),))
    assert "own links" in (blocked_reason(ipaddress.ip_address("93.184.216.1"), own) or "")
    assert blocked_reason(ipaddress.ip_address("93.184.217.1"), own) is None
    assert ipaddress.ip_network("127.0.0.0/8") in own_links()


def test_exceptions_compare_canonical_hosts() -> None:
    assert parse_exception("[FD00:0::1]:80") == ("fd00::1", 80)
    assert normal_host("[2001:DB8:0::1]") == "2001:db8::1"
    assert normal_host("Hooks.Example.org.") == "hooks.example.org"
    with pytest.raises(ValueError, match="webhook exception"):
        parse_exception("127.0.0.1", "webhook exception")


def test_a_listed_registry_may_sit_in_a_documentation_block_and_nothing_else_may() -> None:
    """This project's machines serve pypi.org from 203.0.113.80 (TEST-NET-3): a package
    registry of the operator's list (SHELLYARD_PACKAGE_REGISTRIES, default the configured
    sources' hosts) may be dialled in a documentation or benchmarking block, on its port
    only; any other name or port there, and loopback, private or link-local addresses stay
    refused for registries too (docs/security.md)."""
    doc = ipaddress.ip_address("203.0.113.80")
    assert netrules.registry_tolerates(doc)
    assert netrules.registry_tolerates(ipaddress.ip_address("198.18.0.7"))
    for address in ("127.0.0.1", "10.0.0.1", "169.254.169.254", "::1", "100.64.0.1"):
        assert not netrules.registry_tolerates(ipaddress.ip_address(address))
    rules = EgressRules.build([], [], [netrules.parse_registry("Mirror.Example.org:8443")])
    assert rules.is_registry("mirror.example.org.", 8443)
    assert not rules.is_registry("mirror.example.org", 443)
    assert not rules.is_registry("evil.example", 8443)
    assert netrules.parse_registry("pypi.org") == ("pypi.org", 443)
    assert netrules.parse_registry("[2001:DB8::5]:8443") == ("2001:db8::5", 8443)
    for bad in ("", "*.example.org", "pypi.org/simple", "pypi.org:0", "a b"):
        with pytest.raises(ValueError, match="package registry"):
            netrules.parse_registry(bad)
    hint = netrules.registry_hint([f"203.0.113.80: {special_reason(doc)}"])
    assert "SHELLYARD_PACKAGE_REGISTRIES" in hint
    assert netrules.registry_hint(["127.0.0.1: loopback"]) == ""
