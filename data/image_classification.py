"""tf.data streams of global batches for TFDS image-classification datasets."""

from __future__ import annotations

import dataclasses

import tensorflow as tf
import tensorflow_datasets as tfds

from data import digits

# Datasets whose preparation needs no network: prepared on first use.
OFFLINE_DATASETS = {"digits": digits.Digits}


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """What a model needs to know about a dataset."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    split_sizes: dict[str, int]


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
            "image-classification dataset name such as 'mnist' or 'cifar10'.") from error
    if name in OFFLINE_DATASETS and not builder.is_prepared():
        builder.download_and_prepare()
    keys = builder.info.supervised_keys
    label = builder.info.features[keys[1]] if keys else None
    if not keys or not isinstance(label, tfds.features.ClassLabel):
        raise ValueError(
            f"Dataset {name!r} is not image classification (supervised keys {keys!r}); "
            "pick one with (image, class label) pairs such as 'digits', 'mnist' or 'cifar10'.")
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
            "network run: python -c \"import tensorflow_datasets as tfds; "
            f"tfds.builder('{name}', data_dir='DIR').download_and_prepare()\", copy DIR "
            "here, and pass --data_dir=DIR.") from error
    except ValueError as error:
        raise ValueError(f"Dataset {name!r}: {error} Pick one of its splits "
                         "(--train_split / --eval_split).") from error


def dataset_spec(name: str, data_dir: str | None = None) -> DatasetSpec:
    """Input shape, class count and split sizes (empty before preparation) of `name`."""
    info = load_builder(name, data_dir).info
    image_key, label_key = info.supervised_keys
    return DatasetSpec(
        name=name,
        input_shape=tuple(info.features[image_key].shape),
        num_classes=info.features[label_key].num_classes,
        split_sizes={split: info.splits[split].num_examples for split in info.splits})


def global_batches(name: str, split: str, *, global_batch_size: int,
                   data_dir: str | None = None, shuffle_seed: int | None = None,
                   shuffle_buffer: int = 10_000) -> tf.data.Dataset:
    """One epoch of (image, label) global batches; the last may be partial.

    Images stay uint8 (a quarter of float32's bytes through the pipeline); the
    model scales them. With `shuffle_seed`, each pass over the dataset (each
    repetition) draws a new order, the same sequence of orders every run, so
    skipping k batches of a repeated stream lands exactly where a run that
    stopped after k batches was.

    Raises:
        ValueError: a bad batch size, or see `load_builder` and `read_split`.
    """
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) \
            or global_batch_size < 1:
        raise ValueError(f"global_batch_size must be a whole number >= 1, got {global_batch_size!r}.")
    dataset = read_split(load_builder(name, data_dir), split).cache()
    if shuffle_seed is not None:
        dataset = dataset.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=True)
    return dataset.batch(global_batch_size)
