"""A network namespace with only loopback, where `loops-launch` starts a local cluster's tasks.

TensorFlow's servers bind every interface and take no credentials (BUILD.md);
tasks that share a namespace of their own still reach each other on 127.0.0.1,
while a connection from anywhere else, this machine included, finds nothing on
their ports. Only the network is private: the tasks keep this machine's
files, process ids, user and signals.

The namespace is made by a short-lived helper process (this file run as a
script): `unshare` of a user namespace is irreversible and needs a process
with one thread, which the launcher (or a test calling it) may not be; and
one namespace for all the tasks, rather than `unshare(1)` around each, lets
them reach each other. The launcher keeps descriptors of the helper's
namespaces, and each task joins them between fork and exec
(`PrivateNetwork.join`).

This module imports only the standard library: it runs as a script, with no
package on the path.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys

# linux/sched.h
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
# linux/sockios.h and linux/if.h: struct ifreq is a 16-byte name and a 24-byte union.
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ_FLAGS = struct.Struct("16sH22x")
_READY = "ready"

if sys.platform.startswith("linux"):
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
else:
    _LIBC = None


class NetworkRefused(OSError):
    """The kernel (or the platform) would not make a private network; the message says why."""


def _call(name: str, *args: int) -> None:
    """Calls the libc function `name`; raises OSError with its errno when it returns -1."""
    if _LIBC is None:
        raise NetworkRefused("network namespaces exist only on Linux")
    if getattr(_LIBC, name)(*args) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{name}: {os.strerror(number)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def make_namespace() -> None:
    """Moves this process (which must have one thread) into a new network namespace with
    loopback up.

    As root that is the network namespace alone. Without CAP_SYS_ADMIN, a user
    namespace of its own grants the capability for it; the user and group map
    to themselves, so the tasks' files keep their owner and ownership checks
    read the same ids.
    """
    uid, gid = os.geteuid(), os.getegid()
    try:
        _call("unshare", CLONE_NEWNET)
    except PermissionError:
        _call("unshare", CLONE_NEWUSER | CLONE_NEWNET)
        _write("/proc/self/setgroups", "deny")  # the kernel's condition for an unprivileged gid_map
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:
        current = fcntl.ioctl(control, _SIOCGIFFLAGS, _IFREQ_FLAGS.pack(b"lo", 0))
        flags = _IFREQ_FLAGS.unpack(current)[1]
        fcntl.ioctl(control, _SIOCSIFFLAGS, _IFREQ_FLAGS.pack(b"lo", flags | _IFF_UP))


class PrivateNetwork:
    """Descriptors of a private network's namespaces, for the tasks to join before exec."""

    def __init__(self, namespaces: list[tuple[int, int]]):
        self._namespaces = namespaces  # (descriptor, CLONE_NEW* type), the user namespace first

    @classmethod
    def create(cls) -> PrivateNetwork:
        """Makes the namespace in a helper process and keeps it open.

        Raises:
            NetworkRefused: the kernel refused (the message gives its reason).
        """
        if _LIBC is None:
            raise NetworkRefused("network namespaces exist only on Linux")
        # -I: the helper needs no package and must not run one from the current directory.
        helper = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            answer = helper.stdout.readline().strip() if helper.stdout else ""
            if answer != _READY:
                _, errors = helper.communicate(timeout=30)
                raise NetworkRefused(answer or errors.strip() or f"exit code {helper.returncode}")
            try:
                return cls(_open_namespaces(helper.pid))
            except OSError as error:
                raise NetworkRefused(f"cannot open the new namespace: {error}") from error
        finally:
            # The descriptors hold the namespace now; the helper may go.
            if helper.poll() is None:
                helper.communicate(timeout=30)

    def join(self) -> None:
        """Moves this process into the namespaces; run in a task between fork and exec."""
        for descriptor, kind in self._namespaces:
            _call("setns", descriptor, kind)

    def close(self) -> None:
        """Lets the namespace go once its tasks have exited."""
        for descriptor, _ in self._namespaces:
            os.close(descriptor)
        self._namespaces = []


def _open_namespaces(pid: int) -> list[tuple[int, int]]:
    """Descriptors of process `pid`'s network namespace and, where it differs from this
    process's, its user namespace (which must be joined first)."""
    namespaces: list[tuple[int, int]] = []
    own_user = os.readlink("/proc/self/ns/user")
    try:
        for name, kind in (("user", CLONE_NEWUSER), ("net", CLONE_NEWNET)):
            path = f"/proc/{pid}/ns/{name}"
            if name == "user" and os.readlink(path) == own_user:
                continue
            namespaces.append((os.open(path, os.O_RDONLY | os.O_CLOEXEC), kind))
    except OSError:
        for descriptor, _ in namespaces:
            os.close(descriptor)
        raise
    return namespaces


def _hold() -> int:
    """The helper: makes the namespace, says so, and keeps it until its stdin closes."""
    try:
        make_namespace()
    except OSError as error:
        print(f"the kernel refused a network namespace: {error.strerror}", flush=True)
        return 0
    print(_READY, flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(_hold())
