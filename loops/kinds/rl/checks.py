"""Checks of the RL loops' settings, each failing with the bad value and the fix."""

from __future__ import annotations

from collections.abc import Callable

import keras


def checked_model_fn(model_fn) -> Callable[[], keras.Model]:
    """`model_fn`, which must be callable (TypeError otherwise)."""
    if not callable(model_fn):
        raise TypeError(
            f"model_fn must be a function of no arguments that builds the network, got "
            f"{model_fn!r}; pass e.g. model_fn=lambda: my_network(seed=0)."
        )
    return model_fn


def largest_divisor(number: int, at_most: int) -> int:
    """The largest divisor of `number` that is at most `at_most`: a value to suggest."""
    return max(d for d in range(1, min(number, at_most) + 1) if number % d == 0)
