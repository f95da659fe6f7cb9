"""The lines of an interaction log (or a CSV feature table) as text, read within bounds: a log
this machine cannot hold, a line over `MAX_LINE_BYTES`, a NUL byte, a compressed or UTF-16 file
and bytes that are not UTF-8 are each refused with a sentence naming the file, the line and the
fix (in the reader's words, `TextWords`), after reading at most one line (of at most
`MAX_LINE_BYTES`) past what is checked."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import BinaryIO

from loops.vocabulary.host_memory import in_units, memory_bytes

# The longest line read, in bytes. An interaction is a few ids and numbers (a MovieLens line
# is about 25 bytes), so 64 KiB leaves room for wide feature columns; each line is read with
# this bound, so a file with no line ends (a 2 GB single line, a sparse file) is refused after
# 64 KiB, not after reading gigabytes. Half the csv module's field limit (128 KiB): a field on
# one line never reaches it, only a quoted field left open across lines does.
MAX_LINE_BYTES = 1 << 16

# Reading holds every field as a Python string (about 50 bytes a field beside its text), each
# row as a list, and the id columns again as NumPy strings of 4 bytes a character: a MovieLens
# u.data of 300,000 rows peaked at 19 bytes a byte of file. 4 is below what any log needs, so a
# log refused for it could never be read; one allowed may still be too large.
HELD_BYTES_PER_FILE_BYTE = 4

# The first bytes of compressed files (gzip, zip, bzip2, xz, zstd): read as text they would
# give one garbled line; the user decompresses first.
_COMPRESSED = {
    b"\x1f\x8b": ("gzip", "gunzip"),
    b"PK\x03\x04": ("zip", "unzip"),
    b"BZh": ("bzip2", "bunzip2"),
    b"\xfd7zXZ\x00": ("xz", "unxz"),
    b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"),
}
_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# {encoding}: the one it is likely in, for iconv.
_TEXT_FIX = "save it as UTF-8 text (e.g. iconv -f {encoding} -t utf-8 FILE)"


@dataclasses.dataclass(frozen=True)
class TextWords:
    """What the refusals call the file and its lines, so that each reader's sentences speak of
    what it reads: `file` ("the {file}"), `too_long` (after "over 65,536 bytes,"), `per_line`
    (what one line holds) and `smaller` (a smaller file to pass; {size} its largest size)."""

    file: str
    too_long: str
    per_line: str
    smaller: str


INTERACTION_LOG = TextWords(
    file="text log",
    too_long="longer than any interaction (a few ids and numbers)",
    per_line="one interaction a line",
    smaller="a log of at most {size} (a sample of the users, or the columns user, item, rating "
    "and timestamp alone)",
)


def check_fits_memory(
    path: str, size: int, memory: int | None = None, *, words: TextWords = INTERACTION_LOG
) -> None:
    """Refuses a log of `size` bytes that reading cannot hold in `memory` bytes (default:
    this machine's memory; 0 checks nothing), before a byte of it is read.

    Raises:
        ValueError: the file, its size, what reading it needs and the memory there is.
    """
    memory = memory_bytes() if memory is None else memory
    needed = size * HELD_BYTES_PER_FILE_BYTE
    if not memory or needed <= memory:
        return
    raise ValueError(
        f"{path} is {in_units(size)}, more than this machine can read: its fields as strings "
        f"need at least {HELD_BYTES_PER_FILE_BYTE} bytes a byte of file ({in_units(needed)}), "
        f"and it has {in_units(memory)} of memory; pass "
        + words.smaller.format(size=in_units(memory // HELD_BYTES_PER_FILE_BYTE))
        + "."
    )


def text_lines(path: str, stream: BinaryIO, *, words: TextWords = INTERACTION_LOG) -> Iterator[str]:
    """The lines of a binary `stream` as text, line ends kept, a UTF-8 byte-order mark removed.

    Raises:
        ValueError: a compressed or UTF-16 file, a line over MAX_LINE_BYTES, a NUL byte, or
            bytes that are not UTF-8; each naming `path`, the line and the fix.
    """
    number = 0
    while line := stream.readline(MAX_LINE_BYTES + 1):
        number += 1
        if number == 1:
            line = _without_mark(path, line, words)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise ValueError(
                f"{path} line {number} is over {MAX_LINE_BYTES:,} bytes, {words.too_long}; "
                f"check that the file is the {words.file}, {words.per_line} (a file with no "
                "line ends is one long line)."
            )
        if b"\0" in line:
            nul = line.index(b"\0")
            raise ValueError(
                f"{path} line {number} holds a NUL byte (column {nul + 1}), which no "
                f"{words.file} holds; remove it, or check that the file is the {words.file} and "
                "not binary data."
            )
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{path} line {number} is not UTF-8 text (byte 0x{line[error.start]:02x} at "
                f"column {error.start + 1} does not decode); "
                + _TEXT_FIX.format(encoding="latin1")
                + "."
            ) from None


def _without_mark(path: str, line: bytes, words: TextWords) -> bytes:
    """The first line without a UTF-8 byte-order mark; a compressed or UTF-16 file refused."""
    for magic, (kind, tool) in _COMPRESSED.items():
        if line.startswith(magic):
            raise ValueError(
                f"{path} is a {kind} file (it starts with {kind}'s bytes {magic.hex(' ')}), "
                f"not a {words.file}; decompress it first (e.g. {tool}) and pass the text file."
            )
    if line.startswith(_UTF16_BOMS):
        fix = _TEXT_FIX.format(encoding="utf-16")
        raise ValueError(f"{path} is UTF-16 text (it starts with a UTF-16 mark); {fix}.")
    return line.removeprefix(_UTF8_BOM)
