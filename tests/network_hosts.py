"""Hosts that are apart, on this machine: Linux network namespaces joined by a bridge.

Each host is a namespace with its own loopback and one interface, `eth0`,
addressed 10.X.Y.(index + 1)/24; its other end is a port of a bridge in a
switch namespace of its own. Nothing is added to the machine's own network
namespace, so the tasks' traffic stays between the namespaces the test made;
`cut` and `mend` take a host's switch port down and up (a pulled cable), and
everything is deleted on exit.

Needs root and iproute2's `ip`. Without them the tests that use this fail
with the reason, unless LOOPS_ALLOW_NOT_RUN=1 makes them skip (not run).
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess

ALLOW_NOT_RUN_VARIABLE = "LOOPS_ALLOW_NOT_RUN"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"loops-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*words: str) -> None:
    done = subprocess.run(["ip", *words], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(words)} failed: {done.stderr.strip()}")


class NetworkHosts:
    """`count` hosts (network namespaces) on one private bridge; a context manager."""

    def __init__(self, count: int):
        self._tag = f"{os.getpid() % 100000}{random.randrange(1000)}"
        self._switch = f"lsw{self._tag}"
        self.names = [f"lh{self._tag}-{index}" for index in range(count)]
        # A subnet of its own per harness; it exists only inside the namespaces.
        self._subnet = f"10.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
        self.addresses = [f"{self._subnet}.{index + 1}" for index in range(count)]

    def __enter__(self) -> NetworkHosts:
        try:
            self._create()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _create(self) -> None:
        _ip("netns", "add", self._switch)
        _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self._switch, "link", "set", "br0", "up")
        for index, (name, address) in enumerate(zip(self.names, self.addresses)):
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip(
                "link", "add", "eth0", "netns", name, "type", "veth",
                "peer", "name", self._port(index), "netns", self._switch,
            )  # fmt: skip
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", self._switch, "link", "set", self._port(index), "master", "br0")
            _ip("-n", self._switch, "link", "set", self._port(index), "up")

    def __exit__(self, *exc_info) -> None:
        for name in [*self.names, self._switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)

    @staticmethod
    def _port(index: int) -> str:
        return f"p{index}"

    def command(self, index: int, argv: list[str]) -> list[str]:
        """`argv` run on host `index`."""
        return ["ip", "netns", "exec", self.names[index], *argv]

    def cut(self, index: int) -> None:
        """Host `index` loses its link (its switch port goes down), as a pulled cable."""
        _ip("-n", self._switch, "link", "set", self._port(index), "down")

    def mend(self, index: int) -> None:
        """Host `index` gets its link back."""
        _ip("-n", self._switch, "link", "set", self._port(index), "up")
