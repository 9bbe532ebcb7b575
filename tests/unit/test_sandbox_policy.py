"""The sandbox policy's pure parts (R2): the egress filter's rules, the settings, the seccomp
program. The sandboxes themselves are tested in tests/integration/test_sandbox.py and
test_network.py."""

from __future__ import annotations

import ipaddress
import re

import pytest

from shellyard.config import Settings
from shellyard.errors import InvalidInput
from shellyard.runner.network.egress_rules import (
    EgressRules,
    blocked_reason,
    own_addresses,
    parse_exception,
    parse_pattern,
)
from shellyard.runner.policy import SandboxPolicy
from shellyard.runner.sandbox.seccomp import build_filter


def test_allow_list_patterns_match_names_and_ports() -> None:
    exact = parse_pattern("Example.org")
    assert exact.matches("example.org", 443) and exact.matches("EXAMPLE.org.", 80)
    assert not exact.matches("example.org", 8443)
    assert not exact.matches("www.example.org", 443)
    wild = parse_pattern("*.example.org")
    assert wild.matches("a.example.org", 443) and wild.matches("a.b.example.org", 80)
    assert not wild.matches("example.org", 443)
    assert not wild.matches("badexample.org", 443)
    port = parse_pattern("pypi.example.org:8443")
    assert port.matches("pypi.example.org", 8443) and not port.matches("pypi.example.org", 443)
    for bad in ("", "*.", "a/b", "*.*.org", "x.org:0", "x.org:99999", "x.org:http"):
        with pytest.raises(ValueError, match="allow-list entry"):
            parse_pattern(bad)


def test_exceptions_are_exact_host_and_port() -> None:
    assert parse_exception("10.0.0.5:3128") == ("10.0.0.5", 3128)
    assert parse_exception("[fd00::1]:80") == ("fd00::1", 80)
    with pytest.raises(ValueError, match="host:port"):
        parse_exception("10.0.0.5")
    rules = EgressRules.build([], ["Mirror.local:8080"])
    assert rules.is_exception("mirror.local", 8080)
    assert not rules.is_exception("mirror.local", 8081)
    assert rules.name_refusal("anything.org", 443) is None  # no allow-list: every name
    listed = EgressRules.build(["pypi.org"], [])
    assert listed.name_refusal("pypi.org", 443) is None
    assert "allow-list" in (listed.name_refusal("evil.org", 443) or "")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.1.2.3",
        "0.0.0.0",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fc00::1",
        "fd12::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:0001::1",  # 6to4 of 127.0.0.1
    ],
)
def test_private_loopback_and_link_local_addresses_are_refused(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address), frozenset()) is not None


def test_public_addresses_pass_and_own_addresses_do_not() -> None:
    public = ipaddress.ip_address("93.184.216.34")
    assert blocked_reason(public, frozenset()) is None
    assert blocked_reason(ipaddress.ip_address("2606:4700::1111"), frozenset()) is None
    assert "own" in (blocked_reason(public, frozenset({public})) or "")
    assert ipaddress.ip_address("127.0.0.1") in own_addresses()


def test_policy_defaults_and_old_spelling() -> None:
    policy = SandboxPolicy()
    assert policy.network == "off" and policy.tools_network == "egress"
    assert SandboxPolicy.model_validate({"network": "on"}).network == "host"
    assert SandboxPolicy(network="host").tools_network == "host"
    assert SandboxPolicy(tool_network="off").tools_network == "off"
    a = SandboxPolicy(egress_allow=["a.org", "b.org"]).egress_digest()
    assert a == SandboxPolicy(egress_allow=["b.org", "a.org"]).egress_digest()
    assert a != SandboxPolicy(egress_allow=["a.org"]).egress_digest()
    with pytest.raises(ValueError, match="absolute"):
        SandboxPolicy(host_paths=["relative/path"])


def test_settings_read_the_sandbox_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELLYARD_NETWORK", "egress")
    monkeypatch.setenv("SHELLYARD_EGRESS_ALLOW", "pypi.org, *.pythonhosted.org")
    monkeypatch.setenv("SHELLYARD_EGRESS_EXCEPTIONS", "10.0.0.5:3128")
    monkeypatch.setenv("SHELLYARD_HOST_PATHS", "/opt/tools:/srv/data")
    monkeypatch.setenv("SHELLYARD_TOOL_NETWORK", "off")
    policy = Settings.from_env().local_policy
    assert policy.network == "egress" and policy.tool_network == "off"
    assert policy.egress_allow == ["pypi.org", "*.pythonhosted.org"]
    assert policy.egress_exceptions == ["10.0.0.5:3128"]
    assert policy.host_paths == ["/opt/tools", "/srv/data"]
    monkeypatch.setenv("SHELLYARD_NETWORK", "sometimes")
    said = re.escape("SHELLYARD_NETWORK='sometimes' is not valid: use off, egress, host")
    with pytest.raises(InvalidInput, match=said):
        Settings.from_env()
    monkeypatch.setenv("SHELLYARD_NETWORK", "off")
    monkeypatch.setenv("SHELLYARD_EGRESS_ALLOW", "bad/entry")
    with pytest.raises(InvalidInput, match="allow-list entry"):
        Settings.from_env()


def test_the_seccomp_program_is_built() -> None:
    program = build_filter()
    assert program and len(program) % 8 == 0  # whole struct sock_filter instructions


def test_package_registries_default_to_the_configured_sources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R2: without SHELLYARD_PACKAGE_REGISTRIES the registries are the hosts the managers'
    default sources name (PyPI and its file host, conda's channel alias, CRAN,
    Bioconductor) on 443; with an allow-list of sources, only what it names; the setting
    replaces the default, ``none`` empties it, a bad entry is a clear error."""
    from shellyard.runner.policy import policy_from_env

    monkeypatch.delenv("SHELLYARD_PACKAGE_REGISTRIES", raising=False)
    monkeypatch.delenv("SHELLYARD_ALLOWED_SOURCES", raising=False)
    default = dict(SandboxPolicy().registries())
    assert default == {
        "pypi.org": 443,
        "files.pythonhosted.org": 443,
        "cloud.r-project.org": 443,
        "bioconductor.org": 443,
        "conda.anaconda.org": 443,
    }
    only = SandboxPolicy(
        allowed_sources=["https://mirror.example.org:8443/simple", "conda-forge", "/srv/wheels"]
    )
    assert only.registries() == [("mirror.example.org", 8443), ("conda.anaconda.org", 443)]
    monkeypatch.setenv("SHELLYARD_PACKAGE_REGISTRIES", "Pypi.org, mirror.example.org:8443")
    policy = policy_from_env(SandboxPolicy())
    assert policy.registries() == [("pypi.org", 443), ("mirror.example.org", 8443)]
    rules = policy.egress_rules()
    assert rules.is_registry("pypi.org", 443) and not rules.is_registry("pypi.org", 80)
    assert not rules.is_registry("files.pythonhosted.org", 443)
    assert policy.egress_digest() != SandboxPolicy().egress_digest()  # records name the list
    monkeypatch.setenv("SHELLYARD_PACKAGE_REGISTRIES", "none")
    assert policy_from_env(SandboxPolicy()).registries() == []
    monkeypatch.setenv("SHELLYARD_PACKAGE_REGISTRIES", "https://pypi.org/simple")
    with pytest.raises(InvalidInput, match="SHELLYARD_PACKAGE_REGISTRIES: package registry"):
        policy_from_env(SandboxPolicy())
