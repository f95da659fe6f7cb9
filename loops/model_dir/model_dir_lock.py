"""Refuses a second process that would write into a model_dir a live run is writing."""

from __future__ import annotations

import fcntl
import os
import socket

LOCK_NAME = ".lock"

# realpath of a lock file -> [file descriptor, holders in this process]
_held: dict[str, list[int]] = {}


def acquire(directory: str) -> str:
    """Takes the model_dir's lock for this process; returns the lock's path.

    The lock is an advisory `flock` on model_dir/.lock: the kernel drops it when
    the holding process ends in any way (kill -9 included), so a crash never
    leaves a directory locked. Loops in one process share it.

    Raises:
        ValueError: another live process holds the lock.
    """
    path = os.path.realpath(os.path.join(directory, LOCK_NAME))
    if path in _held:
        _held[path][1] += 1
        return path
    try:
        os.makedirs(directory, exist_ok=True)
        while True:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(descriptor, 200).decode(errors="replace").strip()
                os.close(descriptor)
                raise ValueError(
                    f"model_dir {directory!r} is in use by another live run "
                    f"({owner or 'unknown process'}). Wait for it to finish or stop it, or pass "
                    "a different --model_dir."
                ) from None
            # The holder before us removes the file as it releases it: a lock
            # taken on a file no longer at `path` guards nothing, so take a new one.
            if os.path.exists(path) and os.path.samestat(os.fstat(descriptor), os.stat(path)):
                break
            os.close(descriptor)
    except OSError as error:
        raise ValueError(
            f"model_dir {directory!r} cannot be written ({error.strerror or error}). Pass a "
            "--model_dir in a writable place (not under a file, not on a read-only or full "
            "disk)."
        ) from error
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[path] = [descriptor, 1]
    return path


def release(path: str) -> None:
    """Gives back one hold on the lock at `path`; the last one removes the file and unlocks it."""
    entry = _held.get(path)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[path]
        # Removed while still locked, so no other process can take a lock on
        # it in between (see the loop in `acquire`).
        try:
            os.remove(path)
        except OSError:
            pass  # gone already, or a read-only directory now: the lock still ends
        fcntl.flock(entry[0], fcntl.LOCK_UN)
        os.close(entry[0])
