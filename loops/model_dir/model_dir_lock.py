"""Refuses a second process that would write into a model_dir a live run is writing."""

from __future__ import annotations

import errno
import fcntl
import os
import socket

from loops.core import own_files

LOCK_NAME = ".lock"
# flock errors of a file system that cannot lock a directory (some network file systems).
_NO_DIRECTORY_LOCKS = (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP)

# realpath of a lock file -> [its file descriptor, the directory's (or -1), holders in this process]
_held: dict[str, list[int]] = {}


def acquire(directory: str) -> str:
    """Takes the model_dir's lock for this process; returns the lock file's path.

    The lock is an advisory `flock` on the model_dir directory itself, and one
    on model_dir/.lock, which names the holder. The kernel drops both when the
    holding process ends in any way (kill -9 included), so a crash never
    leaves a directory locked. The directory's lock is what keeps a second
    run out while the first lives even when someone deletes `.lock` (only
    deleting the directory gets around it); the file's keeps out programs
    that lock only the file. Loops in one process share them.

    Raises:
        ValueError: another live process holds the lock, the directory
            cannot be written, or a link (or other no plain file) is planted at
            its .lock (nothing it points to is opened).
    """
    # The directory's real path keys the hold; .lock itself is never resolved.
    path = os.path.join(os.path.realpath(directory), LOCK_NAME)
    if path in _held:
        _held[path][2] += 1
        return path
    try:
        os.makedirs(directory, exist_ok=True)
        directory_descriptor = _lock_directory(directory, path)
    except OSError as error:
        raise _unwritable(directory, error) from error
    try:
        descriptor = _lock_file(directory, path)
    except ValueError:
        _close(directory_descriptor)
        raise
    except own_files.PlantedLinkError as error:
        _close(directory_descriptor)
        raise ValueError(str(error)) from None
    except OSError as error:
        _close(directory_descriptor)
        raise _unwritable(directory, error) from error
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[path] = [descriptor, directory_descriptor, 1]
    return path


def _unwritable(directory: str, error: OSError) -> ValueError:
    return ValueError(
        f"model_dir {directory!r} cannot be written ({error.strerror or error}). Pass a "
        "--model_dir in a writable place (not under a file, not on a read-only or full disk)."
    )


def _close(directory_descriptor: int) -> None:
    """Closes a directory's descriptor from `_lock_directory`: its only one, so its lock ends."""
    if directory_descriptor >= 0:
        os.close(directory_descriptor)


def _in_use(directory: str, owner: str) -> ValueError:
    return ValueError(
        f"model_dir {directory!r} is in use by another live run ({owner}). Wait for it to "
        "finish or stop it, or pass a different --model_dir."
    )


def _lock_directory(directory: str, path: str) -> int:
    """An open descriptor of `directory` holding its flock; -1 where the file system has none."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise _in_use(directory, _owner(path) or "whose .lock file was removed") from None
    except OSError as error:
        os.close(descriptor)
        if error.errno in _NO_DIRECTORY_LOCKS:
            return -1  # the lock file alone guards such a directory
        raise
    return descriptor


def _lock_file(directory: str, path: str) -> int:
    """An open descriptor of the lock file at `path`, holding its flock."""
    while True:
        descriptor = own_files.open_own_file(path)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise _in_use(directory, _owner(path) or "unknown process") from None
        # The holder before us removes the file as it releases it: a lock
        # taken on a file no longer at `path` guards nothing, so take a new one.
        if os.path.lexists(path) and os.path.samestat(os.fstat(descriptor), os.lstat(path)):
            return descriptor
        os.close(descriptor)


def _owner(path: str) -> str:
    """What the lock file at `path` says of its holder; empty when it is gone or says nothing."""
    return own_files.read_own_file(path, 200).decode(errors="replace").strip()


def release(path: str) -> None:
    """Gives back one hold on the lock at `path`; the last one removes the file and unlocks it."""
    entry = _held.get(path)
    if entry is None:
        return
    entry[2] -= 1
    if entry[2] == 0:
        del _held[path]
        # Removed while still locked, so no other process can take a lock on
        # it in between (see the loop in `_lock_file`).
        try:
            os.remove(path)
        except OSError:
            pass  # gone already, or a read-only directory now: the lock still ends
        fcntl.flock(entry[0], fcntl.LOCK_UN)
        os.close(entry[0])
        _close(entry[1])
