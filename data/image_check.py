"""Whether each image file decodes completely: checked in parallel, remembered per file.

Every file is decoded in full by the decoder training uses
(`tf.io.decode_image`), which refuses a truncated PNG or JPEG and a JPEG
whose body is too damaged to decode. (A JPEG body that libjpeg decodes with
only a "Corrupt JPEG data" warning gives pixels in training too: no decoder
at hand, Pillow included, refuses it.) The (height, width) of each file that
decodes is remembered in a small JSON file under the user's cache directory,
keyed by the file's path, size, modification and change times and inode, so a
rerun decodes only new or changed files (one damaged with its size and
modification time put back has a new change time). Anything that is not a
regular file (a directory, a device such as /dev/zero, a pipe, or a link to one)
is refused before a byte of it is read, and opening never waits on a pipe.
The image folder itself is never written (it may be read-only), and the cache
is safe to lose.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Sequence

import tensorflow as tf

from loops.core import reporting

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_START = b"\xff\xd8\xff"
_CACHE_VERSION = 2  # 2: entries keyed on ctime and inode too
# A line at most this often while a large folder is being decoded.
PROGRESS_SECONDS = 10.0

# Why a file is left out or refused: each a clause that follows its path.
NOT_AN_IMAGE = "is not a PNG or JPEG image (it does not start like one)"
DOES_NOT_DECODE = "does not decode completely (truncated or corrupt)"
NOT_A_FILE = "is not a regular file (a directory, device or pipe, or a link to one)"


class _NotARegularFile(OSError):
    """An image path that opens to a directory, a device or a pipe."""


@dataclasses.dataclass(frozen=True)
class ImageCheck:
    """What the check of a list of files found.

    Attributes:
        sizes: path -> (height, width) of each file that decodes.
        bad: path -> why it is not usable (a clause following the path),
            in the order the files were given.
        decoded: how many files were decoded now; the others were known to
            decode from an earlier check of the same file (`_cache_key`).
    """

    sizes: dict[str, tuple[int, int]]
    bad: dict[str, str]
    decoded: int


def check_images(
    paths: Sequence[str], *, folder: str, say: Callable[[str], None] | None = None
) -> ImageCheck:
    """Decodes each of `paths` that an earlier check of `folder` does not vouch for.

    Args:
        paths: the image files, each in `folder` or below.
        folder: names the cache entry (one per folder).
        say: prints a progress line while a large folder is decoded, and a
            line with what was checked; None: silent.
    """
    cache_file = cache_path(folder)
    known = _read_cache(cache_file)
    stats: dict[str, os.stat_result] = {}
    sizes: dict[str, tuple[int, int]] = {}
    bad: dict[str, str] = {}
    for path in paths:
        try:
            # Opened even when known: a chmod since the check leaves size and mtime alone.
            with _open_regular(path) as handle:
                stats[path] = os.fstat(handle.fileno())
        except OSError as error:
            bad[path] = _unreadable(error)
            continue
        entry = known.get(os.path.relpath(path, folder))
        if entry is not None and entry[:-2] == _cache_key(stats[path]):
            sizes[path] = (entry[-2], entry[-1])
    from_cache = len(sizes)
    to_decode = [path for path in paths if path in stats and path not in sizes]
    for path, outcome in _decode_all(to_decode, folder=folder, say=say):
        if isinstance(outcome, str):
            bad[path] = outcome
        else:
            sizes[path] = outcome
    if to_decode:
        _write_cache(
            cache_file,
            {
                # Relative to the folder: about half the size of a large folder's cache.
                os.path.relpath(path, folder): [*_cache_key(stats[path]), *sizes[path]]
                for path in sizes
            },
        )
    if say is not None:
        say(
            f"checked the {len(paths)} images of {folder}: {len(to_decode)} decoded now, "
            f"{from_cache} known from an earlier check, {len(bad)} not usable"
        )
    return ImageCheck(
        sizes=sizes, bad={path: bad[path] for path in paths if path in bad}, decoded=len(to_decode)
    )


def _decode_all(paths: list[str], *, folder: str, say: Callable[[str], None] | None):
    """(path, (height, width) or why not) of each path, decoded on a thread per core."""
    # TensorFlow's decoders release the GIL: threads decode in parallel.
    workers = max(1, min(32, os.cpu_count() or 1))
    last_line = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for done, (path, outcome) in enumerate(pool.map(_decoded_size, paths), start=1):
            if say is not None and time.monotonic() - last_line >= PROGRESS_SECONDS:
                last_line = time.monotonic()
                say(f"checking the images of {folder}: {done}/{len(paths)} decoded")
            yield path, outcome


def _decoded_size(path: str) -> tuple[str, tuple[int, int] | str]:
    """(path, its (height, width)) when it decodes in full, else (path, why not).

    The why never quotes the file's bytes: a folder must not make the program
    print another file's contents (a symlink named x.png to a private file).
    """
    try:
        with _open_regular(path) as handle:
            contents = handle.read()
    except OSError as error:
        return path, _unreadable(error)
    if not contents.startswith((_PNG_SIGNATURE, _JPEG_START)):
        return path, NOT_AN_IMAGE
    try:
        shape = tf.io.decode_image(contents, channels=3, expand_animations=False).shape
    except tf.errors.InvalidArgumentError:
        return path, DOES_NOT_DECODE
    return path, (int(shape[0]), int(shape[1]))


def _open_regular(path: str):
    """`path` opened for reading, without waiting on a pipe; raises _NotARegularFile for
    anything that is not a regular file (checked before a byte is read)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise _NotARegularFile(path)
    return os.fdopen(descriptor, "rb")


def _cache_key(status: os.stat_result) -> list[int]:
    """What must stay the same for a file's earlier check to vouch for it."""
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


def _unreadable(error: OSError) -> str:
    if isinstance(error, _NotARegularFile):
        return NOT_A_FILE
    if isinstance(error, FileNotFoundError):
        return "cannot be read (a broken symbolic link, or removed since it was listed)"
    return f"cannot be read ({error.strerror}): fix its permissions"


def cache_path(folder: str) -> str:
    """The cache file of `folder`: $XDG_CACHE_HOME (or ~/.cache)/loops/image_checks/HASH.json."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(os.path.abspath(folder).encode()).hexdigest()[:24]
    return os.path.join(base, "loops", "image_checks", f"{digest}.json")


def _read_cache(cache_file: str) -> dict[str, list[int]]:
    """path in the folder -> [*_cache_key, height, width]; {} for a missing or damaged file."""
    try:
        with open(cache_file) as stream:
            cached = json.load(stream)
        files = cached["files"] if cached.get("version") == _CACHE_VERSION else {}
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return {}
    return {
        path: entry
        for path, entry in files.items()
        if isinstance(entry, list) and len(entry) == 6 and all(type(n) is int for n in entry)
    }


def _write_cache(cache_file: str, files: dict[str, list[int]]) -> None:
    """Replaces the cache file at once; a cache that cannot be written is only a slower rerun."""
    try:
        reporting.write_text_atomic(
            cache_file, json.dumps({"version": _CACHE_VERSION, "files": files})
        )
    except OSError:
        pass
