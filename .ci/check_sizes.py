"""Checks that no function under loops/ is over 60 lines and no class over 300, bar a baseline.

Run by .ci/run: `python .ci/check_sizes.py` (`--root DIR` checks the tree at DIR instead).

How it counts: a function's (or method's) size is the number of source lines from its
`def` line to the last line of its body, inclusive, as Python's `ast` reports them
(`end_lineno - lineno + 1`): the docstring, comments and blank lines inside the body
count; decorators above the `def` and comments after the body's last statement do
not. A class is counted the same way from its `class` line, methods included. A nested
function or class is counted on its own too, named `outer.inner`. Limits: 60 lines for
a function, 300 for a class.

Each violation is printed as `path:line: name is N lines (limit L)` and the check exits
with status 1. Items over the limit today are listed in .ci/size_baseline.txt as
`path:qualname N` (N: its size when listed). The baseline is a ratchet: a listed item
may be up to N lines, never more; an entry whose item is now within the limit, or no
longer exists, fails the check until it is removed, so the list only shrinks.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

FUNCTION_LIMIT = 60
CLASS_LIMIT = 300
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(".ci", "size_baseline.txt")


@dataclass(frozen=True)
class Item:
    """One function or class: where it starts, its dotted name in its module, its size."""

    path: str  # relative to the repository root, with "/" separators
    line: int
    qualname: str
    kind: str  # "function" or "class"
    size: int

    @property
    def limit(self) -> int:
        return CLASS_LIMIT if self.kind == "class" else FUNCTION_LIMIT

    @property
    def key(self) -> str:
        return f"{self.path}:{self.qualname}"


def items(root: str, package: str = "loops") -> Iterator[Item]:
    """Every function and class in the modules under `root/package`, in path and line order."""
    for directory, subdirectories, names in os.walk(os.path.join(root, package)):
        subdirectories.sort()
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as source:
                    tree = ast.parse(source.read(), filename=path)
                yield from sorted(_definitions(tree, relative, prefix=""), key=lambda i: i.line)


def _definitions(node: ast.AST, path: str, prefix: str) -> Iterator[Item]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qualname = prefix + child.name
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            assert child.end_lineno is not None  # set by ast.parse
            yield Item(path, child.lineno, qualname, kind, child.end_lineno - child.lineno + 1)
            yield from _definitions(child, path, prefix=qualname + ".")
        else:
            # Definitions inside an `if`, `try` or `with` belong to the enclosing scope.
            yield from _definitions(child, path, prefix)


def read_baseline(path: str) -> dict[str, int]:
    """The baseline's `path:qualname -> N`; an empty baseline when the file is missing."""
    if not os.path.exists(path):
        return {}
    baseline = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, size = line.rpartition(" ")
            if ":" not in key or not size.isdigit():
                raise ValueError(
                    f"{path}:{number}: {line!r} is not `path:qualname N`, "
                    "e.g. `loops/run/loop.py:Loop.__init__ 160`"
                )
            baseline[key] = int(size)
    return baseline


def violations(found: list[Item], baseline: dict[str, int], baseline_name: str) -> list[str]:
    """One message per item over its limit beyond the baseline, and per stale baseline entry."""
    messages = []
    sizes: dict[str, int] = {}
    for item in found:
        sizes[item.key] = max(item.size, sizes.get(item.key, 0))
        allowed = baseline.get(item.key, item.limit)
        if item.size > max(item.limit, allowed):
            message = (
                f"{item.path}:{item.line}: {item.qualname} is {item.size} lines "
                f"(limit {item.limit})"
            )
            if item.key in baseline:
                message += f"; {baseline_name} lets it be {allowed}, it may not grow"
            messages.append(message)
    limits = {item.key: item.limit for item in found}
    for key in baseline:
        if key not in sizes:
            messages.append(f"{baseline_name}: {key} no longer exists: remove it from the baseline")
        elif sizes[key] <= limits[key]:
            messages.append(
                f"{baseline_name}: {key} is {sizes[key]} lines, within the limit {limits[key]}: "
                "remove it from the baseline"
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
        baseline = read_baseline(baseline_path)
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
        f"within {FUNCTION_LIMIT} and {CLASS_LIMIT} lines, or their baseline "
        f"({len(baseline)} listed in {baseline_name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
