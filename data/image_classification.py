"""tf.data streams of global batches for TFDS image-classification datasets."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from loops.vocabulary.whole_numbers import check_whole
from loops_data import digits
from loops_data.in_memory import batches_in_memory, endless_batches_in_memory

# Datasets whose preparation needs no network: prepared on first use.
OFFLINE_DATASETS = {"digits": digits.Digits}


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What a model needs to know about a dataset."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    split_sizes: dict[str, int]
    # Each class's name in label order (the dataset's ClassLabel names, or its folders').
    class_names: tuple[str, ...] = ()
    # (path, why) of each file of the data left out as unusable (--skip_bad_images).
    left_out: tuple[tuple[str, str], ...] = ()


def load_builder(name: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
    """Returns the TFDS builder for `name`, preparing the offline ones.

    Raises:
        ValueError: the dataset is unknown or is not image classification.
    """
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise ValueError(
            f"Unknown dataset {name!r}. Use 'digits' (bundled, offline) or a TFDS "
            "image-classification dataset name such as 'mnist' or 'cifar10'."
        ) from error
    if name in OFFLINE_DATASETS and not builder.is_prepared():
        builder.download_and_prepare()
    keys = builder.info.supervised_keys
    label = builder.info.features[keys[1]] if keys else None
    if not keys or not isinstance(label, tfds.features.ClassLabel):
        raise ValueError(
            f"Dataset {name!r} is not image classification (supervised keys {keys!r}); "
            "pick one with (image, class label) pairs such as 'digits', 'mnist' or 'cifar10'."
        )
    return builder


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> tf.data.Dataset:
    """The (image, label) examples of `split`, in their stored order.

    Raises:
        ValueError: the split does not exist, or the dataset needs a download
            that has not been done into the builder's data_dir.
    """
    name = builder.info.name
    try:
        return builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
    except AssertionError as error:  # TFDS's way of saying "not prepared"
        raise ValueError(
            f"Dataset {name!r} is not prepared under data_dir {str(builder.data_dir_root)!r} "
            "and needs a download (this machine may have no network). On a machine with "
            'network run: python -c "import tensorflow_datasets as tfds; '
            f"tfds.builder('{name}', data_dir='DIR').download_and_prepare()\", copy DIR "
            "here, and pass --data_dir=DIR."
        ) from error
    except ValueError as error:
        raise ValueError(
            f"Dataset {name!r}: {error} Pick one of its splits (--train_split / --eval_split)."
        ) from error


def dataset_spec(name: str, data_dir: str | None = None) -> DatasetSpec:
    """Input shape, class count and split sizes (empty before preparation) of `name`."""
    return builder_spec(load_builder(name, data_dir))


def builder_spec(builder: tfds.core.DatasetBuilder) -> DatasetSpec:
    """Input shape, class count and split sizes (empty before preparation) of a builder."""
    info = builder.info
    image_key, label_key = info.supervised_keys
    return DatasetSpec(
        name=info.name,
        input_shape=tuple(info.features[image_key].shape),
        num_classes=info.features[label_key].num_classes,
        class_names=tuple(info.features[label_key].names),
        split_sizes={split: info.splits[split].num_examples for split in info.splits},
    )


# Splits up to this size are read into memory once and batched from there;
# larger ones stream through a cache and a shuffle buffer (or, in the
# binaries, from disk by index: `image_streams`).
IN_MEMORY_BYTES = 1 << 30


def split_fits_in_memory(builder: tfds.core.DatasetBuilder, split: str) -> bool:
    """Whether the split's decoded images fit in `IN_MEMORY_BYTES`.

    A split of unknown size (no split metadata, as under `tfds.testing.mock_data`)
    counts as fitting: `builder_batches` reads it into memory when it does.
    """
    try:
        count = builder.info.splits[split].num_examples
    except KeyError:
        return True
    return _split_bytes(builder, count) <= IN_MEMORY_BYTES


def global_batches(
    name: str,
    split: str,
    *,
    global_batch_size: int,
    data_dir: str | None = None,
    shuffle_seed: int | None = None,
    shuffle_buffer: int = 10_000,
    repeat: bool = False,
) -> tf.data.Dataset:
    """(image, label) global batches: one epoch, the last maybe partial, or endless full ones.

    With `repeat` (training streams) the passes over the split follow each
    other with no partial batch between them (a batch may end one pass and
    start the next), so every batch is full and its batch dimension is
    static: the train step is traced for exactly that shape, about 13% less
    time a step on the digits MLP than for a batch dimension of None
    (benchmarks/RESULTS.md).

    Images stay uint8 (a quarter of float32's bytes through the pipeline); the
    model scales them. With `shuffle_seed`, each pass over the dataset (each
    repetition) draws a new order, the same sequence of orders every run, so
    skipping k batches of a repeated stream lands exactly where a run that
    stopped after k batches was.

    A split of up to `IN_MEMORY_BYTES` is read into memory when the dataset is
    built and each epoch is a full permutation of it, cut into batches with one
    gather per epoch: no per-example work per step (a 64-example batch costs
    about 10 us instead of 60 us of CPU). A larger split streams through a
    cache and a `shuffle_buffer`-example shuffle.

    Raises:
        ValueError: a bad batch size, or see `load_builder` and `read_split`.
    """
    return builder_batches(
        load_builder(name, data_dir),
        split,
        global_batch_size=global_batch_size,
        shuffle_seed=shuffle_seed,
        shuffle_buffer=shuffle_buffer,
        repeat=repeat,
    )


def builder_batches(
    builder: tfds.core.DatasetBuilder,
    split: str,
    *,
    global_batch_size: int,
    shuffle_seed: int | None = None,
    shuffle_buffer: int = 10_000,
    repeat: bool = False,
) -> tf.data.Dataset:
    """`global_batches` of a builder's dataset."""
    check_whole("global_batch_size", global_batch_size)
    examples = read_split(builder, split)
    count = _split_count(builder, split, examples)
    if _split_bytes(builder, count) <= IN_MEMORY_BYTES:
        arrays = _read_all(examples, count)
        if repeat:
            return endless_batches_in_memory(arrays, global_batch_size, shuffle_seed)
        return batches_in_memory(arrays, global_batch_size, shuffle_seed)
    dataset = examples.cache()
    if shuffle_seed is not None:
        dataset = dataset.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
    if repeat:
        return dataset.repeat().batch(global_batch_size, drop_remainder=True)
    return dataset.batch(global_batch_size)


def _split_count(
    builder: tfds.core.DatasetBuilder, split: str, examples: tf.data.Dataset
) -> int | None:
    """The number of examples in the split, or None when it is not known."""
    try:
        return builder.info.splits[split].num_examples
    except KeyError:  # no split metadata (mocked data): ask tf.data
        count = int(examples.cardinality())
        return count if count >= 0 else None


def _split_bytes(builder: tfds.core.DatasetBuilder, count: int | None) -> float:
    """The split's size in memory, or inf when it is not known."""
    image = builder.info.features[builder.info.supervised_keys[0]]
    if count is None or any(size is None for size in image.shape):
        return float("inf")
    return count * (int(np.prod(image.shape)) * np.dtype(image.np_dtype).itemsize + 8)


def _read_all(examples: tf.data.Dataset, count: int):
    """The `count` (image, label) pairs of `examples` as two tensors, in eager or graph mode.

    A tf.function (a parameter-server worker's dataset function) builds
    datasets in graph mode: the read is a dataset op that runs there.
    """
    if count == 0:
        return tuple(tf.zeros([0, *spec.shape], spec.dtype) for spec in examples.element_spec)
    return tuple(
        tf.ensure_shape(part, [count, *spec.shape])
        for part, spec in zip(examples.batch(count).get_single_element(), examples.element_spec)
    )
