"""docs/flags.md's flag reference, generated from the declarations (`loops.bin.flag_reference`).

The flags every binary shares (`loops.vocabulary.settings.SETTINGS`) once, a
table per --help heading, then each binary's own (`loops.bin.binary_flags`) and
its own defaults of the shared ones. `--write docs/flags.md` puts it between
that file's markers; tests/test_readme.py fails when its copy differs.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from loops.bin import binary_flags
from loops.cli import flags as loop_flags
from loops.cli.flags import HEADINGS
from loops.vocabulary import settings

BEGIN = "<!-- flags:begin -->"
END = "<!-- flags:end -->"
# The one file the reference is written into, relative to the repository (README links to it).
TARGET = "docs/flags.md"
COMMAND = f"python -m loops.bin.flag_reference --write {TARGET}"
# A flag's type in words; an "enum" is shown as its choices.
_KINDS = {
    "integer": "integer",
    "float": "float",
    "bool": "bool",
    "string": "string",
    "list": "list",
}


def shown_default(value: Any) -> str:
    """A flag's default as --help shows it: `unset` for None, lower-case booleans."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(item) for item in value)
    return str(value)


def _cell(text: str) -> str:
    # Help text is plain: a `|` would end the cell, `*` start emphasis, `<` an HTML tag.
    return text.replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;")


def _row(setting: settings.Setting, default: Any) -> str:
    kind = _KINDS.get(setting.kind) or "one of " + ", ".join(
        f"`{choice}`" for choice in setting.choices
    )
    return f"| `--{setting.name}` | {kind} | `{shown_default(default)}` | {_cell(setting.help)} |"


def tables(declarations: Iterable[settings.Setting], level: str) -> list[str]:
    """One markdown table per --help heading of `declarations`, in --help's order."""
    declarations = tuple(declarations)
    lines: list[str] = []
    for heading in HEADINGS:
        under = [setting for setting in declarations if setting.heading == heading]
        if not under:
            continue
        lines += [f"{level} {heading}", "", "| flag | type | default | meaning |"]
        lines += ["| --- | --- | --- | --- |"]
        lines += [_row(setting, _flag_default(setting)) for setting in under]
        lines.append("")
    return lines


def _flag_default(setting: settings.Setting) -> Any:
    """What --help shows as the flag's default: the binaries' own where they share one."""
    return loop_flags.BINARY_DEFAULTS.get(setting.name, setting.flag_default)


def _own_defaults(defaults: Mapping[str, Any]) -> str:
    shown = ", ".join(f"`--{name}={shown_default(value)}`" for name, value in defaults.items())
    return f"Its defaults of shared flags: {shown}." if shown else ""


def reference() -> str:
    """The text between the markers of docs/flags.md."""
    lines = [
        "",
        f"Generated from the declarations by `{COMMAND}` (a test keeps it equal). Every "
        "binary answers `--help` with the same text, before TensorFlow loads; a run's "
        "settings can come from `--flagfile=run.flags` (one `--flag=value` a line, flags "
        "after it overriding the file). `loops-launch --help` lists the launcher's own "
        "options.",
        "",
        "### Flags of every binary",
        "",
        *tables(settings.SETTINGS, "####"),
    ]
    for binary in binary_flags.BINARIES:
        lines += [f"### {binary.command}", "", _own_defaults(binary.defaults), ""]
        lines += tables(binary.own_settings(), "####")
    return "\n".join(lines)


def replaced(readme: str, section: str) -> str:
    """`readme` (docs/flags.md's text) with the text between its markers replaced by `section`.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < begin:
        raise ValueError(
            f"{TARGET} has no {BEGIN} ... {END} pair (in that order); put both lines "
            "under its heading 'Flag reference' and run this again."
        )
    return readme[: begin + len(BEGIN)] + "\n" + section + "\n" + readme[end:]


def wrong_target(path: str) -> str | None:
    """Why `--write path` is refused (anything but docs/flags.md), or None."""
    if os.path.normpath(path).endswith(os.path.normpath(TARGET)):
        return None
    return (
        f"--write {path}: the flag reference lives in {TARGET} alone (README.md links to it "
        f"and holds no copy); run, from the repository's root: {COMMAND}"
    )


def main(argv: list[str] | None = None) -> int:
    """Prints the reference, or writes it into docs/flags.md given with --write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar=TARGET, help=f"write it into {TARGET}, in place")
    arguments = parser.parse_args(argv)
    if arguments.write is None:
        print(reference())
        return 0
    refusal = wrong_target(arguments.write)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    with open(arguments.write, encoding="utf-8") as file:
        readme = file.read()
    try:
        updated = replaced(readme, reference())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    with open(arguments.write, "w", encoding="utf-8") as file:
        file.write(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
