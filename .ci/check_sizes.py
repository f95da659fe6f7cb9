"""Checks the sizes of functions (in code lines) and classes (in all lines) under loops/.

Run by .ci/run: `python .ci/check_sizes.py` (`--root DIR` checks the tree at DIR instead).

How it counts:
- a function's (or method's) size is its number of CODE lines, from its `def` line to
  the last line of its body: lines holding code, not lines that are blank, hold only a
  comment, or belong to a docstring (the string that is the first statement of a
  module, class or function). Rewrapping a docstring or a comment therefore neither
  helps nor hurts. Decorators above the `def` do not count.
- a class's size is ALL its lines, from its `class` line to its last line: its
  docstring, its methods' docstrings, comments and blank lines included (decorators
  above it not).
Why the two differ: a class is what a reader has to hold in mind as one thing, and its
docstrings and comments are part of that reading; counted by code lines, a class of 390
lines passed as 214. A function's docstring is its contract (its Args, Raises), which a
limit on the function must not push to be cut short; counted by all lines, a dozen
functions of 40-odd code lines would be near their limit for their docstrings alone.
A nested function or class is counted on its own too, named `outer.inner`. Limits: 60
code lines for a function, 300 lines for a class.

Two rules, each violation printed as `path:line: name is N code lines ...` (`N lines`
for a class; exit status 1):
- no item over its limit;
- no item within 5 lines of its limit (a function over 55 code lines, a class over 295
  lines) without a reason: something that close cannot take the next fix without a split.

.ci/size_baseline.txt lists the exceptions, one a line: `path:qualname N reason`, N the
item's size when listed (counted as above) and the reason in words (why it stays whole).
The baseline is a ratchet: a listed item may be up to N lines, never more; an entry whose
item is no longer within 5 lines of its limit (or over it), or no longer exists, fails the
check until it is removed, so the list only shrinks.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass

FUNCTION_LIMIT = 60
CLASS_LIMIT = 300
# An item within this many lines of its limit needs a reason in the baseline.
MARGIN = 5
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(".ci", "size_baseline.txt")
BASELINE_FORMAT = (
    "`path:qualname N reason`, e.g. `loops/definition/loop.py:Loop.__init__ 58 "
    "one table of the settings, read top to bottom`"
)
# Tokens that are not code: a line holding only these (and docstrings) is not counted.
NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


@dataclass(frozen=True)
class Item:
    """One function or class: where it starts, its dotted name in its module, its size."""

    path: str  # relative to the repository root, with "/" separators
    line: int
    qualname: str
    kind: str  # "function" or "class"
    size: int  # code lines of a function, all lines of a class

    @property
    def unit(self) -> str:
        """What `size` counts, as the messages say it."""
        return "lines" if self.kind == "class" else "code lines"

    @property
    def limit(self) -> int:
        return CLASS_LIMIT if self.kind == "class" else FUNCTION_LIMIT

    @property
    def near_limit(self) -> bool:
        """Within MARGIN lines of its limit, or over it: needs a baseline entry."""
        return self.size > self.limit - MARGIN

    @property
    def key(self) -> str:
        return f"{self.path}:{self.qualname}"


@dataclass(frozen=True)
class Entry:
    """One baseline line: the size its item may reach and why it may stay that close."""

    size: int
    reason: str


def items(root: str, package: str = "loops") -> Iterator[Item]:
    """Every function and class in the modules under `root/package`, in path and line order."""
    for directory, subdirectories, names in os.walk(os.path.join(root, package)):
        subdirectories.sort()
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as source:
                    text = source.read()
                tree = ast.parse(text, filename=path)
                lines = code_lines(text, tree)
                found = _definitions(tree, relative, prefix="", lines=lines)
                yield from sorted(found, key=lambda item: item.line)


def code_lines(text: str, tree: ast.AST) -> set[int]:
    """The numbers of the lines of `text` that hold code: a token other than a comment, a
    line break, an indent or a docstring (a string token inside a docstring's span)."""
    docstrings = [
        ((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset))
        for node in _docstring_nodes(tree)
    ]
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in NOT_CODE:
            continue
        if token.type == tokenize.STRING and any(
            start <= token.start and token.end <= end for start, end in docstrings
        ):
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def _docstring_nodes(tree: ast.AST) -> Iterator[ast.expr]:
    """The docstring expression of the module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    yield first.value


def _definitions(node: ast.AST, path: str, prefix: str, lines: set[int]) -> Iterator[Item]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qualname = prefix + child.name
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            assert child.end_lineno is not None  # set by ast.parse
            span = range(child.lineno, child.end_lineno + 1)
            # A class by all its lines, a function by its code lines (why: the module docstring).
            size = len(span) if kind == "class" else sum(line in lines for line in span)
            yield Item(path, child.lineno, qualname, kind, size)
            yield from _definitions(child, path, qualname + ".", lines)
        else:
            # Definitions inside an `if`, `try` or `with` belong to the enclosing scope.
            yield from _definitions(child, path, prefix, lines)


def read_baseline(path: str, shown_as: str) -> dict[str, Entry]:
    """The baseline's `path:qualname -> Entry`; an empty baseline when the file is missing.
    A malformed line raises ValueError naming it as `shown_as:line`."""
    if not os.path.exists(path):
        return {}
    baseline = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, size, reason = (line.split(maxsplit=2) + ["", ""])[:3]
            if ":" not in key or not size.isdigit() or not reason:
                raise ValueError(f"{shown_as}:{number}: {line!r} is not {BASELINE_FORMAT}")
            baseline[key] = Entry(int(size), reason)
    return baseline


def violations(found: list[Item], baseline: dict[str, Entry], baseline_name: str) -> list[str]:
    """One message per item over or near its limit beyond the baseline, and per stale entry."""
    messages = []
    largest: dict[str, Item] = {}  # by key: two definitions of one name count as the larger
    for item in found:
        if item.key not in largest or item.size > largest[item.key].size:
            largest[item.key] = item
        entry = baseline.get(item.key)
        where = f"{item.path}:{item.line}: {item.qualname} is {item.size} {item.unit}"
        if entry is not None:
            if item.size > max(entry.size, item.limit - MARGIN):
                messages.append(
                    f"{where} (limit {item.limit}); {baseline_name} lets it be {entry.size}, "
                    "it may not grow"
                )
        elif item.size > item.limit:
            messages.append(f"{where} (limit {item.limit})")
        elif item.near_limit:
            messages.append(
                f"{where}, within {MARGIN} of its limit {item.limit}: split it, or give the "
                f"reason it stays whole in {baseline_name} as "
                f"`{item.key} {item.size} <reason>`"
            )
    for key in baseline:
        if key not in largest:
            messages.append(f"{baseline_name}: {key} no longer exists: remove it from the baseline")
        elif not largest[key].near_limit:
            item = largest[key]
            messages.append(
                f"{baseline_name}: {key} is {item.size} {item.unit}, not within {MARGIN} of its "
                f"limit {item.limit}: remove it from the baseline"
            )
    return messages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", default=REPOSITORY, help="the repository root, holding loops/ (default: this one)"
    )
    parser.add_argument(
        "--baseline", help=f"the baseline file (default: {BASELINE} under the root)"
    )
    args = parser.parse_args(argv)
    baseline_path = args.baseline or os.path.join(args.root, BASELINE)
    baseline_name = os.path.relpath(baseline_path, args.root).replace(os.sep, "/")
    try:
        baseline = read_baseline(baseline_path, baseline_name)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    found = list(items(args.root))
    messages = violations(found, baseline, baseline_name)
    for message in messages:
        print(message)
    if messages:
        return 1
    functions = sum(item.kind == "function" for item in found)
    print(
        f"check_sizes: {functions} functions and {len(found) - functions} classes in loops/ "
        f"within {FUNCTION_LIMIT - MARGIN} code lines and {CLASS_LIMIT - MARGIN} lines, or their "
        f"baseline ({len(baseline)} listed in {baseline_name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
