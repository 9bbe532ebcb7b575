"""The sandbox's network modes (R2; docs/security.md "Network"), with real sandboxes.

``off`` (the default) gives a command its own loopback only; ``egress`` reaches outside only
through the runner's filtering proxy; ``host`` shares the host's network. The "internet" of
these tests is a test host in a network namespace the test makes, joined to this host by a
veth pair with addresses of 198.20.0.0/29 that exist only between the two namespaces, so
nothing leaves the machine. They must be outside every IANA special-purpose block (the proxy
refuses documentation and benchmarking addresses like any other special one): 198.20.0.0/30 is
ordinary unicast just past the benchmarking block 198.18.0.0/15, routed here only to the veth
for the test's lifetime.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from env_fixtures import make_wheel

from conftest import Yard, make_home
from shellyard.contract.executions import ExecutionLogsQuery, ExecutionWait
from shellyard.runner.local import LocalRunner
from shellyard.runner.policy import SandboxPolicy
from shellyard.runner.protocol import EnvChangeState, EnvironmentChange, EnvironmentChangeRequest

HOST_SIDE = "198.20.0.1"  # this host's end of the veth: one of the runner's own addresses
TEST_HOST = "198.20.0.2"  # the test host inside its namespace
LINK_SIDE = "198.20.0.5"  # this host's address on a link 198.20.0.4/30 of its own
LINK_NEIGHBOUR = "198.20.0.6"  # a neighbour on that link: the runner's LAN, refused
METADATA = "169.254.169.254"

needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="making a network namespace needs root and iproute2's ip",
)
needs_socat = pytest.mark.skipif(
    shutil.which("socat") is None, reason="network 'egress' needs socat (Debian package socat)"
)


def _serve(server: socket.socket, stop: threading.Event, reply: bytes) -> None:
    server.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except OSError:
            continue
        with conn:
            conn.settimeout(2)
            try:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply)
            except OSError:
                pass


@pytest.fixture
def loopback_server() -> Iterator[int]:
    """A TCP (HTTP) listener on this host's 127.0.0.1; the port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()
    thread = threading.Thread(target=_serve, args=(server, stop, b"hello-from-host\n"))
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@dataclass
class NetnsHost:
    """An HTTP server in its own network namespace at ``TEST_HOST``: ``port`` serves
    ``folder``; ``other_port`` answers too (never allow-listed); ``own_port`` listens on this
    host's end of the veth (a runner address)."""

    namespace: str
    folder: Path
    port: int
    other_port: int
    own_port: int

    def url(self, port: int | None = None) -> str:
        return f"http://{TEST_HOST}:{port or self.port}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def test_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsHost]:
    tag = secrets.token_hex(3)
    namespace, host_if, peer_if = f"sy-net-{tag}", f"syh{tag}", f"syn{tag}"
    folder = Path(tmp_path_factory.mktemp("www"))
    (folder / "index.html").write_text("hello-from-test-host\n")
    _ip("netns", "add", namespace)
    servers: list[subprocess.Popen[bytes]] = []
    own = socket.socket()
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", namespace)
        # The test host is reached by a route, not as a neighbour on a link of this host's
        # (the proxy refuses the host's own links): /32 addresses and a route each way.
        _ip("addr", "add", f"{HOST_SIDE}/32", "dev", host_if)
        # and a link of this host's own, with nobody on it but LINK_NEIGHBOUR's address
        _ip("addr", "add", f"{LINK_SIDE}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("route", "add", f"{TEST_HOST}/32", "dev", host_if)
        _ip("-n", namespace, "addr", "add", f"{TEST_HOST}/32", "dev", peer_if)
        _ip("-n", namespace, "link", "set", peer_if, "up")
        _ip("-n", namespace, "route", "add", f"{HOST_SIDE}/32", "dev", peer_if)
        _ip("-n", namespace, "link", "set", "lo", "up")
        ports = []
        for _ in range(2):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
            probe.close()
        for port in ports:
            servers.append(
                subprocess.Popen(
                    [
                        *("ip", "netns", "exec", namespace, sys.executable, "-m", "http.server"),
                        *(str(port), "--bind", TEST_HOST, "--directory", str(folder)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        own.bind((HOST_SIDE, 0))
        own.listen(8)
        thread = threading.Thread(target=_serve, args=(own, stop, b"runner-own-address\n"))
        thread.start()
        for port in ports:
            _wait_listening(namespace, port)
        yield NetnsHost(namespace, folder, ports[0], ports[1], own.getsockname()[1])
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        own.close()
        for server in servers:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def _wait_listening(namespace: str, port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        probe = subprocess.run(
            ["ip", "netns", "exec", namespace, "ss", "-ltnH", f"sport = :{port}"],
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.stdout.strip():
            return
        time.sleep(0.05)
    raise AssertionError(f"the test host's server on port {port} did not start")


def fetch(url: str) -> str:
    """A command printing what ``url`` answers, or FAILED and curl's exit code (through the
    sandbox's proxy variables when there are any; --noproxy '' so even loopback names go to
    the proxy and the proxy's own check is what is tested)."""
    return f"curl -sS -m 10 --noproxy '' {url} 2>&1 || echo FAILED $?"


async def test_network_off_cannot_reach_a_loopback_server(yard: Yard, loopback_server: int) -> None:
    """R2, default policy: a listener the test opens on 127.0.0.1 gets no connection; the
    command's own loopback works (a server and its client inside meet there)."""
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server} && head -n1 <&3 || echo CONNECT-FAILED"
    result = await yard.run(
        f"{probe}; (python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &); "
        "for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; "
        "sleep 0.1; done; curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/"
    )
    assert "CONNECT-FAILED" in result.stdout
    assert "hello-from-host" not in result.stdout
    assert result.stdout.endswith("200")
    assert result.policy is not None and result.policy.network == "off"


async def test_network_host_reaches_the_hosts_loopback(
    yard_factory: Any, loopback_server: int
) -> None:
    """R2: ``host`` (an explicit choice) still shares the host's network."""
    yard: Yard = await yard_factory(SandboxPolicy(network="host"))
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{loopback_server} && printf 'GET /\\r\\n\\r\\n' >&3 "
    result = await yard.run(probe + "&& cat <&3 | tail -n1")
    assert result.stdout == "hello-from-host\n"
    assert result.policy is not None and result.policy.network == "host"


@needs_netns
@needs_socat
async def test_egress_reaches_only_allow_listed_public_hosts(
    yard_factory: Any, test_host: NetnsHost, loopback_server: int
) -> None:
    """R2 ``egress``: the allow-listed test host is reached, a port of it not on the list is
    refused; loopback (by address and by name), the metadata address and the runner's own
    address and a neighbour on the runner's own link are refused even when allow-listed;
    outside the proxy nothing is reachable."""
    allow = [
        f"{TEST_HOST}:{test_host.port}",
        f"127.0.0.1:{loopback_server}",
        f"localhost:{loopback_server}",
        f"{METADATA}:80",
        f"{HOST_SIDE}:{test_host.own_port}",
        f"{LINK_NEIGHBOUR}:{test_host.port}",
    ]
    yard: Yard = await yard_factory(SandboxPolicy(network="egress", egress_allow=allow))
    urls = [
        test_host.url(),
        test_host.url(test_host.other_port),
        f"http://127.0.0.1:{loopback_server}/",
        f"http://localhost:{loopback_server}/",
        f"http://{METADATA}/latest/meta-data/",
        f"http://{HOST_SIDE}:{test_host.own_port}/",
        f"http://{LINK_NEIGHBOUR}:{test_host.port}/",
    ]
    result = await yard.run("; ".join(f"echo '#'; {fetch(url)}" for url in urls))
    answers = [part.strip() for part in result.stdout.split("#\n")[1:]]
    assert answers[0] == "hello-from-test-host"
    assert "not on this runner's egress allow-list" in answers[1]
    assert "127.0.0.0/8" in answers[2] and "127.0.0.0/8" in answers[3]
    assert "169.254.0.0/16" in answers[4]
    assert "this host's own addresses" in answers[5]
    assert "this host's own links" in answers[6]
    for answer in answers[1:]:
        assert "hello" not in answer and "runner-own-address" not in answer
    # Without the proxy there is no way out: the test host by address, directly.
    direct = await yard.run(
        f"exec 3<>/dev/tcp/{TEST_HOST}/{test_host.port} && echo CONNECTED || echo NO-ROUTE"
    )
    assert "NO-ROUTE" in direct.stdout
    assert result.policy is not None
    assert result.policy.network == "egress"
    assert result.policy.egress_digest == SandboxPolicy(egress_allow=allow).egress_digest()
    view = await yard.plane.executions.status(result.execution_id)
    assert view.policy is not None and view.policy.egress_digest == result.policy.egress_digest


@needs_netns
@needs_socat
async def test_egress_without_allow_list_and_operator_exceptions(
    yard_factory: Any, test_host: NetnsHost, loopback_server: int
) -> None:
    """R2 ``egress`` with no allow-list: any public address (the test host, both ports);
    loopback only through an operator's exact host:port exception."""
    yard: Yard = await yard_factory(
        SandboxPolicy(network="egress", egress_exceptions=[f"127.0.0.1:{loopback_server}"])
    )
    result = await yard.run(
        f"{fetch(test_host.url(test_host.other_port))}; {fetch(test_host.url())}; "
        f"{fetch(f'http://127.0.0.1:{loopback_server}/')}; "
        f"{fetch(f'http://127.0.0.1:{test_host.port}/')}"
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == ["hello-from-test-host", "hello-from-test-host", "hello-from-host"]
    assert "127.0.0.0/8" in result.stdout.split("hello-from-host\n")[1]


#: Every special-purpose form the proxy once dialled or misjudged (TEST-NET-1, benchmarking,
#: the IPv4-compatible and NAT64 spellings of 127.0.0.1), and one of every other block.
SPECIAL_FORMS = [
    "127.0.0.1", "0.0.0.0", "10.0.0.1", "100.64.0.1", "169.254.169.254", "172.16.0.1",
    "192.0.0.9", "192.0.2.1", "192.88.99.1", "192.168.0.1", "198.18.0.1", "198.51.100.1",
    "203.0.113.1", "224.0.0.1", "240.0.0.1", "255.255.255.255",
    "[::1]", "[::]", "[::7f00:1]", "[::ffff:127.0.0.1]", "[64:ff9b::7f00:1]",
    "[64:ff9b::a9fe:a9fe]", "[64:ff9b:1::1]", "[100::1]", "[2001::1]", "[2001:db8::1]",
    "[2002:7f00:1::1]", "[3fff::1]", "[fc00::1]", "[fe80::1]", "[ff02::1]",
]  # fmt: skip


@needs_socat
async def test_egress_refuses_every_special_purpose_form(
    yard_factory: Any, loopback_server: int
) -> None:
    """R2 ``egress``: the proxy answers 403 with the block's name for every IANA
    special-purpose address in every spelling, before any connection (a dial would answer
    502 or reach the host's listener on 127.0.0.1, whose greeting never appears)."""
    yard: Yard = await yard_factory(SandboxPolicy(network="egress"))
    fetches = [
        f"echo '#'; curl -sS -m 10 --noproxy '' -o /dev/null -w '%{{http_code}} ' "
        f"http://{address}:{loopback_server}/ 2>&1; "
        f"curl -s -m 10 --noproxy '' http://{address}:{loopback_server}/ 2>&1"
        for address in SPECIAL_FORMS
    ]
    result = await yard.run("; ".join(fetches))
    answers = [part.strip() for part in result.stdout.split("#\n")[1:]]
    assert len(answers) == len(SPECIAL_FORMS), result.stdout
    for address, answer in zip(SPECIAL_FORMS, answers, strict=True):
        assert answer.startswith("403 "), (address, answer)
        assert "which nothing done for an agent may reach" in answer, (address, answer)
        assert "hello-from-host" not in answer


@needs_netns
@needs_socat
async def test_pip_installs_from_an_index_through_egress(
    yard_factory: Any, test_host: NetnsHost
) -> None:
    """R2 ``egress``: ordinary work goes through the proxy: pip, in a venv made inside the
    sandbox, installs from a package index on the allow-listed test host."""
    make_wheel(test_host.folder / "files", "sy-gamma", "3.0")
    project = test_host.folder / "simple" / "sy-gamma"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        '<a href="../../files/sy_gamma-3.0-py3-none-any.whl">sy_gamma-3.0-py3-none-any.whl</a>'
    )
    yard: Yard = await yard_factory(
        SandboxPolicy(network="egress", egress_allow=[f"{TEST_HOST}:{test_host.port}"])
    )
    started = await yard.run(
        "python3 -m venv v && v/bin/pip install -q --disable-pip-version-check "
        f"--trusted-host {TEST_HOST} --index-url {test_host.url()}/simple/ sy-gamma && "
        "v/bin/python -c 'import sy_gamma; print(sy_gamma.VERSION)'",
        background=True,
    )
    view = await yard.plane.executions.wait(started.execution_id, ExecutionWait(timeout_s=300))
    out = await yard.plane.executions.logs(started.execution_id, ExecutionLogsQuery())
    err = await yard.plane.executions.logs(
        started.execution_id, ExecutionLogsQuery(stream="stderr")
    )
    assert view.exit_code == 0, err.data
    assert out.data.strip().splitlines()[-1] == "3.0", err.data


@needs_netns
@needs_socat
async def test_package_tools_get_the_same_filtered_egress(
    test_host: NetnsHost, loopback_server: int
) -> None:
    """R2 with V2: on a runner whose commands have no network (the default), the package
    tools keep theirs through the same filter: pip (uv in the tool sandbox) installs from an
    index on the allow-listed test host; an index on a runner address is refused by the proxy
    and the host's loopback is out of reach."""
    make_wheel(test_host.folder / "files", "sy-delta", "4.0")
    project = test_host.folder / "simple" / "sy-delta"
    project.mkdir(parents=True)
    (project / "index.html").write_text(
        '<a href="../../files/sy_delta-4.0-py3-none-any.whl">sy_delta-4.0-py3-none-any.whl</a>'
    )
    home = make_home()
    own = f"{HOST_SIDE}:{test_host.own_port}"  # a runner address: refused though allow-listed
    allow = [f"{TEST_HOST}:{test_host.port}", own]
    # plain-http indexes: only those the operator names (issue 20's allowed sources)
    http = [test_host.url(), f"http://{own}", f"http://127.0.0.1:{loopback_server}"]
    policy = SandboxPolicy(egress_allow=allow, allowed_sources=http)
    runner = LocalRunner(home / "runner", policy)
    await runner.startup()
    try:
        assert runner.policy.network == "off" and runner.policy.tools_network == "egress"

        async def change(**fields: object) -> EnvironmentChange:
            request = EnvironmentChangeRequest.model_validate(fields)
            await runner.environment_change(request)
            return await runner.environment_change_wait(request.change_id, 600)

        created = await change(
            change_id="c", environment_id="e", action="create", language="python"
        )
        assert created.state == EnvChangeState.succeeded, created.error
        done = await change(
            change_id="i", environment_id="e", action="install", manager="pip",
            specs=["sy-delta"], index_url=f"{test_host.url()}/simple",
        )  # fmt: skip
        assert done.state == EnvChangeState.succeeded, done.error
        assert {p.name: p.version for p in done.packages if p.manager == "pip"}["sy-delta"] == (
            "4.0"
        )
        refused = await change(
            change_id="j", environment_id="e", action="install", manager="pip",
            specs=["sy-other"], index_url=f"http://{own}/simple",
        )  # fmt: skip
        assert refused.state == EnvChangeState.failed
        assert "403" in (refused.error or ""), refused.error
        # and the host's loopback is not even a route: the tool's namespace has its own
        loopback = await change(
            change_id="k", environment_id="e", action="install", manager="pip",
            specs=["sy-other"], index_url=f"http://127.0.0.1:{loopback_server}/simple",
        )  # fmt: skip
        assert (loopback.state, loopback.error_kind) == (EnvChangeState.failed, "unreachable")
    finally:
        await runner.aclose()
        shutil.rmtree(home, ignore_errors=True)
