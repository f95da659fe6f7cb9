"""Datasets the loops train on: TFDS image classification and the bundled digits.

The names below load on first use, so that `loops_data.settings` (a binary's
flags) imports without TensorFlow.
"""

import importlib
from typing import Any

__all__ = ["DatasetSpec", "dataset_spec", "global_batches", "load_builder", "read_split"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("loops_data.image_classification"), name)
