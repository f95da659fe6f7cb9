"""Keras models the loops' binaries train.

The names below load on first use, so that `loops_models.settings` (a binary's
flags) imports without Keras.
"""

import importlib
from typing import Any

__all__ = ["CLASSIFIERS", "build_classifier", "cnn", "mlp"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("loops_models.classifiers"), name)
