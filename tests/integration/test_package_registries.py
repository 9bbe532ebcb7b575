"""The package registries the egress proxy may dial in a documentation block (R2;
docs/security.md "Network, per mode", SHELLYARD_PACKAGE_REGISTRIES).

Real components: the runner's ``EgressProxy`` on its Unix socket, this machine's resolver
and its package registry (pypi.org and deb.debian.org resolve to 203.0.113.80 here, a
TEST-NET-3 address, served by a real HTTPS mirror). A registry of the list is reached on
its port; the same address under a name not in the list, or the listed name on another
port, is refused with a 403 that names the block and the setting to change.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shellyard.runner.network.egress_proxy import EgressProxy
from shellyard.runner.policy import SandboxPolicy

pytestmark = pytest.mark.timeout(120)

LISTED, UNLISTED = "pypi.org", "deb.debian.org"
TEST_NET_3 = ipaddress.ip_network("203.0.113.0/24")


def _in_test_net(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return any(ipaddress.ip_address(info[4][0]) in TEST_NET_3 for info in infos)


needs_test_net = pytest.mark.skipif(
    not (_in_test_net(LISTED) and _in_test_net(UNLISTED)),
    reason=f"this machine does not resolve {LISTED} and {UNLISTED} into 203.0.113.0/24",
)


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[Path]:
    policy = SandboxPolicy(network="egress", package_registries=[LISTED])
    server = EgressProxy(tmp_path / "egress.sock", policy.egress_rules())
    await server.start()
    try:
        yield server.socket_path
    finally:
        await server.close()


async def _connect(socket_path: Path, host: str, port: int) -> str:
    """What the proxy answers to ``CONNECT host:port`` (its status line and body)."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        if b" 200 " in head.split(b"\r\n", 1)[0]:
            return head.decode()
        body = await asyncio.wait_for(reader.read(4096), 30)
        return (head + body).decode()
    finally:
        writer.close()


@needs_test_net
async def test_a_listed_registry_is_reached_on_its_port_only(proxy: Path) -> None:
    """R2: pypi.org (listed, port 443) at 203.0.113.80 is tunnelled; pypi.org on port 80 is
    refused for the documentation block like any destination."""
    answer = await _connect(proxy, LISTED, 443)
    assert answer.startswith("HTTP/1.1 200 Connection established"), answer
    refused = await _connect(proxy, LISTED, 80)
    assert refused.startswith("HTTP/1.1 403"), refused
    assert "203.0.113.80" in refused and "documentation" in refused, refused


@needs_test_net
async def test_a_host_not_in_the_list_in_a_documentation_block_is_refused_clearly(
    proxy: Path,
) -> None:
    """R2: deb.debian.org resolves to the same 203.0.113.80 but is not in the list: 403,
    naming the address, the block, and SHELLYARD_PACKAGE_REGISTRIES as the fix."""
    refused = await _connect(proxy, UNLISTED, 443)
    assert refused.startswith("HTTP/1.1 403"), refused
    assert f"refused {UNLISTED}:443" in refused and "203.0.113.80" in refused, refused
    assert "documentation (TEST-NET-3)" in refused, refused
    assert "SHELLYARD_PACKAGE_REGISTRIES" in refused, refused
