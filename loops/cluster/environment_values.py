"""Reads a scheduler's environment variables as bounded values, and shows a bad value short."""

from __future__ import annotations

import re
from collections.abc import Mapping

# The most characters of a value a sentence quotes: a host list of ten million
# names must give a short line, not one of 99 MB.
SHOWN_CHARACTERS = 200
# More tasks (or nodes) than any cluster of this framework runs: a count past
# it is a mistake, refused before anything of its size is built.
MOST_TASKS = 100_000
# Digits of a number read from the environment: int() past 4300 digits raises
# an error of its own, and no rank, count or node number needs more than this.
MOST_DIGITS = 18
# Only ASCII digits: str.isdigit() takes '²' (which int() refuses) and int()
# takes other scripts' digits, which no scheduler writes.
_WHOLE_NUMBER = re.compile(f"[0-9]{{1,{MOST_DIGITS}}}")
# RFC 1123: a DNS label is 1-63 lower-case letters, digits and '-', not at either end.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
MOST_DNS_NAME_CHARACTERS = 253


def shown(value: str) -> str:
    """`value` quoted, cut to SHOWN_CHARACTERS with its length said when longer."""
    if len(value) <= SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value)} characters)"


def is_whole_number(text: str) -> bool:
    """Whether `text` is 1 to MOST_DIGITS ASCII digits, nothing around them."""
    return _WHOLE_NUMBER.fullmatch(text) is not None


def whole_number(environ: Mapping[str, str], name: str, what: str, fix: str) -> int:
    """Variable `name` as a whole number (`what` it is, `fix` when it is not one).

    Raises:
        ValueError: it is unset, or not 1 to MOST_DIGITS ASCII digits.
    """
    value = environ.get(name)
    if value is None or not is_whole_number(value):
        found = "unset" if value is None else shown(value)
        raise ValueError(
            f"{name} ({what}) is {found}, not a whole number in the digits 0-9; {fix}."
        )
    return int(value)


def task_count(environ: Mapping[str, str], name: str, what: str, fix: str) -> int:
    """Variable `name` as a count of tasks from 1 to MOST_TASKS.

    Raises:
        ValueError: not a whole number (`whole_number`), 0, or past MOST_TASKS.
    """
    count = whole_number(environ, name, what, fix)
    if not 1 <= count <= MOST_TASKS:
        raise ValueError(
            f"{name}={count} ({what}) is not a task count from 1 to {MOST_TASKS}; {fix}."
        )
    return count


def is_dns_label(name: str) -> bool:
    """Whether `name` is one DNS label (RFC 1123): what a Kubernetes Job, Service and pod
    host name must be to be reached by name."""
    return _DNS_LABEL.fullmatch(name) is not None


def check_dns_name(variable: str, value: str, what: str, fix: str) -> None:
    """Checks that `value` of `variable` is DNS labels joined by dots, at most 253 characters.

    Raises:
        ValueError: a label that breaks RFC 1123 (an upper-case letter, a space, '/',
            ':', '_', a label over 63 characters...), naming `what` it is and the `fix`.
    """
    labels = value.split(".")
    if len(value) <= MOST_DNS_NAME_CHARACTERS and all(map(is_dns_label, labels)):
        return
    raise ValueError(
        f"{variable}={shown(value)} ({what}) is not a DNS name, so no address built from it "
        "would resolve: each part between dots must be 1-63 lower-case letters, digits and "
        f"'-', starting and ending with a letter or digit (RFC 1123); {fix}."
    )
