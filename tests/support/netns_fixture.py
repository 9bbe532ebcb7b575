"""A runner host in a network namespace of its own: a veth pair with a /30 in 10.200.x.0/24
between this (the control plane's) namespace and the new one, for R3 route-cut tests.

    host = make_netns()            # host.ns_ip is reachable from here; host.prefix runs in it
    host.cut(); host.mend()        # take the route down and back up
    host.delete()

``netns_or_skip()`` skips with the reason when this machine does not allow ``ip netns``.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess as sp
from dataclasses import dataclass

import pytest


def _ip(*args: str) -> None:
    sp.run(["ip", *args], check=True, capture_output=True)


def netns_or_skip() -> None:
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed on this machine")
    probe = f"sy-probe-{secrets.token_hex(3)}"
    done = sp.run(["ip", "netns", "add", probe], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"ip netns is not permitted here: {done.stderr.decode().strip()}")
    sp.run(["ip", "netns", "del", probe], capture_output=True)


@dataclass
class NetnsHost:
    name: str
    host_if: str
    host_ip: str
    ns_ip: str

    @property
    def prefix(self) -> list[str]:
        """Prepend to a command to run it inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        """Take the link, and so the route, to the namespace down."""
        _ip("link", "set", self.host_if, "down")

    def mend(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def delete(self) -> None:
        sp.run(["ip", "netns", "del", self.name], capture_output=True)  # takes the veth too
        sp.run(["ip", "link", "del", self.host_if], capture_output=True)


def make_netns() -> NetnsHost:
    tag = secrets.token_hex(3)
    subnet = secrets.randbelow(250) + 1
    host = NetnsHost(f"sy-{tag}", f"syh{tag}", f"10.200.{subnet}.1", f"10.200.{subnet}.2")
    ns_if = f"syn{tag}"
    _ip("netns", "add", host.name)
    try:
        _ip("link", "add", host.host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", host.name)
        _ip("addr", "add", f"{host.host_ip}/30", "dev", host.host_if)
        _ip("link", "set", host.host_if, "up")
        _ip("netns", "exec", host.name, "ip", "addr", "add", f"{host.ns_ip}/30", "dev", ns_if)
        _ip("netns", "exec", host.name, "ip", "link", "set", ns_if, "up")
        _ip("netns", "exec", host.name, "ip", "link", "set", "lo", "up")
    except sp.CalledProcessError:
        host.delete()
        raise
    return host
