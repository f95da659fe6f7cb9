"""Datasets the loops train on: TFDS image classification and the bundled digits."""

from loops_data.image_classification import (
    DatasetSpec,
    dataset_spec,
    global_batches,
    load_builder,
    read_split,
)

__all__ = ["DatasetSpec", "dataset_spec", "global_batches", "load_builder", "read_split"]
