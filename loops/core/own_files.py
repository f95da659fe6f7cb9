"""Writes and reads a run's own files at their names only, never through a link planted there.

A run writes into directories other users may reach (the temp dir, a shared
disk). A symbolic link planted at a name the run writes would send the write
(or a delete) to the file the link points to, with the run's rights. So every
file is written as a new temporary made with O_CREAT|O_EXCL (which never follows
a link) and renamed over the name (a rename replaces a link itself, never its
target); a link found at the name is refused with a sentence that names it,
before anything is written. Imports no TensorFlow: flag parsing uses it.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import tempfile

# The temporaries of `write_atomic`: .results.XXXX.tmp (what a killed writer leaves).
TEMPORARY_PREFIX = ".results."


class PlantedLinkError(OSError):
    """A name a run writes holds a link (or something else that is no plain file of its own)."""


def refuse_link(path: str) -> None:
    """Raises PlantedLinkError when `path` is a symbolic link (nothing it points to is touched)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(status.st_mode):
        raise planted_link(path)


def planted_link(path: str) -> PlantedLinkError:
    """The refusal of the symbolic link at `path`."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "somewhere"
    return PlantedLinkError(
        f"{path} is a symbolic link (to {target}) that this program did not make, where it "
        "writes a file of its own; it writes nothing through a link, and nothing the link "
        "points to was read or changed. Remove the link (or use another directory) and run "
        "the same command again."
    )


def write_atomic(path: str, data: bytes) -> None:
    """Writes a file so a reader (or a crash) never sees it half-written, and never through a link.

    The file gets the user's usual mode (0666 less the umask), not the 0600
    of a temporary file.

    Raises:
        PlantedLinkError: `path` is a symbolic link; nothing was written.
        OSError: the file cannot be written (full disk, read-only directory);
            a previous version of it is intact.
    """
    refuse_link(path)
    directory = os.path.dirname(path) or "."
    temporary = None
    try:
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX, suffix=".tmp")
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
            os.fchmod(stream.fileno(), 0o666 & ~current_umask())
        os.replace(temporary, path)
        temporary = None
    except OSError as error:
        raise OSError(
            error.errno,
            f"could not write {path} ({error.strerror or error}); free "
            "space or make the directory writable (a previous version is intact)",
        ) from error
    finally:
        if temporary is not None and os.path.lexists(temporary):
            os.remove(temporary)


def current_umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_own_file(path: str) -> int:
    """A read-write descriptor of the plain file at `path` (made when missing), never a link's.

    Raises:
        PlantedLinkError: `path` is a symbolic link, not a plain file, or a file
            with other names too (a hard link): writing it would change another file.
        OSError: it cannot be opened.
    """
    try:
        descriptor = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666
        )
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise planted_link(path) from None
        raise
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(descriptor)
        raise PlantedLinkError(
            f"{path} is not a plain file of its own ({_what(status)}), where this program "
            "keeps a file it writes; nothing was written to it. Remove it (or use another "
            "directory) and run the same command again."
        )
    return descriptor


def _what(status: os.stat_result) -> str:
    if stat.S_ISREG(status.st_mode):
        return f"a file with {status.st_nlink} hard links"
    return "a directory" if stat.S_ISDIR(status.st_mode) else "a device, pipe or socket"


def read_own_file(path: str, limit: int) -> bytes:
    """Up to `limit` bytes of the plain file at `path`; b"" when it is gone, a link or no file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return b""
        return os.read(descriptor, limit)
    finally:
        os.close(descriptor)


def private_directory(path: str, *, fix: str) -> None:
    """Makes `path` a directory only this user can enter (0700), or checks that the one there
    is this user's own and no link. `fix`: the sentence's way out (e.g. pass --model_dir).

    Raises:
        ValueError: `path` is a link, no directory, or another user's directory.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)}), not a directory this user made"
    elif not stat.S_ISDIR(status.st_mode):
        problem = "is not a directory"
    elif status.st_uid != os.getuid():
        problem = (
            f"belongs to {user_name(status.st_uid)}, not to this user "
            f"({user_name(os.getuid())}), who could replace what a run writes there"
        )
    else:
        return
    raise ValueError(f"{path} {problem}. {fix}")


def foreign_owner(path: str) -> str | None:
    """The other user (not root) who owns the nearest existing directory of `path`; else None."""
    directory = os.path.abspath(path)
    while not os.path.isdir(directory) and directory != os.path.dirname(directory):
        directory = os.path.dirname(directory)
    owner = os.stat(directory).st_uid
    if owner in (0, os.getuid()):
        return None
    return f"{directory} belongs to {user_name(owner)}"


def user_name(uid: int) -> str:
    """'user NAME (uid N)', or 'uid N' for a uid with no name."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
