"""The one whole-number check every layer uses for counts, sizes and steps."""

from __future__ import annotations

from typing import TypeGuard


def is_whole(value: object, least: int | None = None) -> TypeGuard[int]:
    """Whether `value` is an int (never a bool) and, given `least`, at least `least`.

    Python counts True as 1, but a flag or a typo that yields a bool is never a
    count; floats are refused even when integral (2.0 steps is a type mistake
    a later `range` would raise on, far from its cause).
    """
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    return least is None or value >= least


def check_whole(name: str, value: object, least: int = 1, note: str = "") -> None:
    """Raises `ValueError: {name} must be a whole number >= {least}{note}, got {value!r}.`

    The sentence every setting and argument that holds a count uses; `note`
    says what a value means where the bound alone does not (" (0: no evaluation)").
    A caller with its own sentence asks `is_whole` instead.
    """
    if not is_whole(value, least):
        raise ValueError(f"{name} must be a whole number >= {least}{note}, got {value!r}.")
