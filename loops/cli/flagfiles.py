"""The --flagfile files of a command line, checked before absl reads them: each must be UTF-8
text of `--flag=value` lines that includes no file twice on one chain and sets no flag empty.

absl would read such a file with a raw UnicodeDecodeError, skip a file that includes itself
with a warning, and take `--flagfile=`, `--name=` or a line without dashes without a word.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

FLAGFILE = "flagfile"
# Bigger than any real run's settings; a file over it is read no further than this.
MAX_FLAGFILE_BYTES = 1 << 20
_SHOWN_CHARACTERS = 200  # of a bad value quoted in a sentence


def check_flagfiles(arguments: Iterable[str]) -> None:
    """Checks every --flagfile of `arguments` (a command line's options, before any `--`) and
    the files they include, in the order absl reads them.

    Raises:
        ValueError: a sentence naming the file (and line) and the fix.
    """
    for path in _flagfile_values(list(arguments), source="the command line"):
        _check_file(path, chain=())


def _flagfile_values(options: list[str], *, source: str) -> Iterator[str]:
    """The values of --flagfile=PATH (or -flagfile, or the value as the next option)."""
    for index, option in enumerate(options):
        name, has_value, value = option.lstrip("-").partition("=")
        if not option.startswith("-") or name != FLAGFILE:
            continue
        if not has_value:
            value = options[index + 1] if index + 1 < len(options) else ""
        if not value.strip():
            raise ValueError(
                f"{source} has --{FLAGFILE} with no file name; give the file "
                f"(--{FLAGFILE}=run.flags) or drop it."
            )
        yield value.strip()


def _check_file(path: str, chain: tuple[str, ...]) -> None:
    real = os.path.realpath(path)
    if real in chain:
        cycle = " -> ".join((*chain, real))
        raise ValueError(
            f"--{FLAGFILE}={path} includes itself ({cycle}); a flagfile may include other "
            "files, never one that includes it: remove that --flagfile line."
        )
    lines = _read_lines(path)
    chain = (*chain, real)
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith(("#", "//")):
            continue
        name, has_value, value = text.lstrip("-").partition("=")
        where = f"--{FLAGFILE}={path}, line {number}"
        if not text.startswith("-"):
            # absl passes such a line on as an argument, which its parser skips over.
            fix = f"write it as --{text}" if len(text) <= _SHOWN_CHARACTERS else "add them"
            raise ValueError(
                f"{where} is {_shown(text)}, no flag: a flagfile's lines start with dashes; "
                f"{fix}, or start it with # to keep it as a comment."
            )
        if has_value and not value:
            raise ValueError(
                f"{where} sets --{name} to an empty value ({_shown(text)}); give the value, "
                "or remove the line to take the default."
            )
        if name == FLAGFILE:
            for included in _flagfile_values([text], source=where):
                _check_file(included, chain)


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FLAGFILE_BYTES + 1)
    except OSError as error:
        raise ValueError(
            f"--{FLAGFILE}={path} does not read ({error.strerror or error}); give the path of "
            "a readable file of --flag=value lines."
        ) from None
    if len(data) > MAX_FLAGFILE_BYTES:
        raise ValueError(
            f"--{FLAGFILE}={path} is over {MAX_FLAGFILE_BYTES} bytes, not a file of settings; "
            "give the file of --flag=value lines, one a line."
        )
    fix = "save it as UTF-8 text, one --flag=value a line"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ValueError(f"--{FLAGFILE}={path} is UTF-16 text; {fix}.")
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(
            f"--{FLAGFILE}={path} holds binary data (a NUL byte at offset {nul}), not "
            f"--flag=value lines; {fix}."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"--{FLAGFILE}={path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start} does not decode); {fix}."
        ) from None
    return text.splitlines()


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN_CHARACTERS else text[:_SHOWN_CHARACTERS] + "...")
