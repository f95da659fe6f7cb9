"""Image classification read from disk by index: TFDS dataset folders and image folders.

Every example is read by its index, decoded and (for training) augmented
with a random crop and flip keyed on (seed, epoch, index), so the train
stream starts at any batch without reading the ones before it
(`loops.random_access`) and a resumed run sees bit-identical batches.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf
import tensorflow_datasets as tfds

from loops.input import random_access
from loops_data import image_classification, image_folders
from loops_data.image_classification import DatasetSpec

AUGMENTATIONS = ("none", "crop_flip")


@dataclasses.dataclass(frozen=True)
class ImageStreams:
    """A dataset's spec, its endless train stream and a function building one eval pass."""

    spec: DatasetSpec
    train: random_access.SeekableBatches
    eval: Callable[[], tf.data.Dataset]


def is_tfds_directory(path: str | None) -> bool:
    """Whether `path` is one prepared TFDS dataset (a version folder with dataset_info.json)."""
    return bool(path) and os.path.isfile(os.path.join(str(path), "dataset_info.json"))


def from_tfds_builder(
    builder: tfds.core.DatasetBuilder,
    *,
    train_split: str,
    eval_split: str,
    global_batch_size: int,
    seed: int,
    augment: str = "none",
    image_size: tuple[int, int] | None = None,
    input_nice: int = 0,
) -> ImageStreams:
    """Streams of a prepared TFDS image-classification dataset, read from its files by index.

    `input_nice` is `random_access.shuffled_batches`' (the train stream's).

    Raises:
        ValueError: a split that does not exist, images of no fixed size
            without `image_size`, or a bad augmentation.
    """
    _check_augment(augment)
    info = builder.info
    name = info.name
    keys = info.supervised_keys
    if not keys or not isinstance(info.features[keys[1]], tfds.features.ClassLabel):
        raise ValueError(
            f"Dataset {name!r} at {builder.data_dir} is not image classification "
            f"(supervised keys {keys!r}); pick one with (image, class label) pairs."
        )
    image_key, label_key = keys
    shape = tuple(info.features[image_key].shape)
    if image_size is None and any(size is None for size in shape[:2]):
        raise ValueError(
            f"Dataset {name!r} has images of no fixed size ({shape}); pass "
            "--image_size=HEIGHT,WIDTH to resize them."
        )
    channels = shape[2]
    height, width = image_size or shape[:2]
    file_format = str(getattr(info.file_format, "value", info.file_format or "tfrecord"))

    def records(split: str) -> random_access.RecordFiles:
        if split not in info.splits:
            raise ValueError(
                f"Dataset {name!r} has no split {split!r}; it has {sorted(info.splits)}. "
                "Pick one of them (--train_split / --eval_split)."
            )
        paths = [os.fspath(path) for path in info.splits[split].filepaths]
        return random_access.RecordFiles(paths, file_format=file_format)

    image_feature = info.features[image_key]
    serialized_info = info.features.get_serialized_info()
    encoded_layout = (
        isinstance(image_feature, tfds.features.Image)
        and set(serialized_info) == {image_key, label_key}
        and serialized_info[image_key].shape == ()
        and serialized_info[image_key].dtype == tf.string
        and serialized_info[label_key].shape == ()
    )

    def parse(serialized):
        """(encoded or decoded images, labels) of a batch of serialized examples."""
        if not encoded_layout:  # any other layout: TFDS's own per-example decoding
            return random_access.map_rows(
                lambda row: _pair(info.features.deserialize_example(row), image_key, label_key),
                serialized,
            )
        # One parse for the batch; only the image decode is done per image.
        parsed = tf.io.parse_example(
            serialized,
            {
                image_key: tf.io.FixedLenFeature([], tf.string),
                label_key: tf.io.FixedLenFeature([], serialized_info[label_key].dtype),
            },
        )
        return parsed[image_key], parsed[label_key]

    train_records, eval_records = records(train_split), records(eval_split)
    return _streams(
        dataclasses.replace(
            image_classification.builder_spec(builder), input_shape=(height, width, channels)
        ),
        train_records,
        eval_records,
        parse,
        global_batch_size=global_batch_size,
        seed=seed,
        augment=augment,
        image_size=image_size,
        image_format=getattr(image_feature, "encoding_format", None),
        input_nice=input_nice,
    )


def from_tfds_directory(path: str, **options) -> ImageStreams:
    """`from_tfds_builder` for the dataset prepared in `path` (`tfds.builder_from_directory`)."""
    if not is_tfds_directory(path):
        raise ValueError(
            f"{path!r} is not a prepared TFDS dataset: it has no dataset_info.json. Point "
            "--data_dir at the dataset's version folder (DATA_DIR/NAME/VERSION), or at the "
            "TFDS data directory together with --dataset=NAME."
        )
    return from_tfds_builder(tfds.builder_from_directory(path), **options)


def from_image_folder(
    root: str,
    *,
    train_split: str,
    eval_split: str,
    global_batch_size: int,
    seed: int,
    augment: str = "none",
    image_size: tuple[int, int] | None = None,
    skip_bad_images: bool = False,
    say: Callable[[str], None] | None = None,
    input_nice: int = 0,
) -> ImageStreams:
    """Streams of an image folder (`loops_data.image_folders` layout), 3 channels.

    `skip_bad_images` and `say` are `image_folders.read_splits`'s; the spec's
    `left_out` lists the files left out. `input_nice` is
    `random_access.shuffled_batches`' (the train stream's).

    Raises:
        image_folders.BadImageFolderError: see `image_folders.read_splits`, and
            images of several sizes without `image_size`.
    """
    _check_augment(augment)
    train, evaluation = image_folders.read_splits(
        root, (train_split, eval_split), skip_bad_images=skip_bad_images, say=say
    )
    if image_size is None:
        image_size = image_folders.check_one_size([train, evaluation])
        resize = None
    else:
        resize = image_size

    def parse(rows):
        return rows  # (file contents, labels)

    return _streams(
        DatasetSpec(
            name=os.path.basename(os.path.normpath(root)),
            input_shape=(*image_size, 3),
            num_classes=len(train.class_names),
            class_names=train.class_names,
            split_sizes={train_split: train.num_examples, eval_split: evaluation.num_examples},
            left_out=train.left_out + evaluation.left_out,
        ),
        train,
        evaluation,
        parse,
        global_batch_size=global_batch_size,
        seed=seed,
        augment=augment,
        image_size=resize,
        input_nice=input_nice,
    )


def _streams(
    spec: DatasetSpec,
    train_source,
    eval_source,
    parse,
    *,
    global_batch_size: int,
    seed: int,
    augment: str,
    image_size: tuple[int, int] | None,
    image_format: str | None = None,
    input_nice: int = 0,
) -> ImageStreams:
    height, width, channels = spec.input_shape
    # A known format skips decode_image's sniffing of the bytes.
    decoder = {"jpeg": tf.io.decode_jpeg, "png": tf.io.decode_png}.get(image_format or "")

    def decoded_image(image):
        if image.dtype == tf.string and decoder is not None:
            image = decoder(image, channels=channels)
        elif image.dtype == tf.string:
            image = tf.io.decode_image(image, channels=channels, expand_animations=False)
        if image_size is not None:
            image = tf.cast(
                tf.clip_by_value(tf.round(tf.image.resize(image, image_size)), 0, 255), tf.uint8
            )
        return tf.ensure_shape(image, [height, width, channels])

    def decode(rows, keys, *, train: bool):
        images, labels = parse(rows)
        if images.dtype == tf.string or image_size is not None:
            images = random_access.map_rows(decoded_image, images)
        if train and augment == "crop_flip":
            images = crop_flip(images, keys)
        return images, tf.cast(labels, tf.int64)

    return ImageStreams(
        spec=spec,
        train=random_access.shuffled_batches(
            train_source,
            lambda rows, keys: decode(rows, keys, train=True),
            global_batch_size=global_batch_size,
            seed=seed,
            input_nice=input_nice,
        ),
        eval=lambda: random_access.ordered_batches(
            eval_source,
            lambda rows, keys: decode(rows, keys, train=False),
            global_batch_size=global_batch_size,
        ),
    )


def crop_flip(images: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
    """Each image cropped at random from itself padded by an eighth of its size; half flipped.

    Padding reflects the border. The crop and flip of an image are drawn from
    its key (`random_access.keyed_integers`), for the whole batch at once: one
    gather, about a fifth of the CPU of per-image random crops (benchmarks/RESULTS.md).
    """
    count = tf.shape(images, out_type=tf.int64)[0]
    height, width, channels = images.shape[1:]
    # An eighth, at least 1; a side of 1 pixel has nothing to reflect.
    pad_y, pad_x = (min(max(1, size // 8), size - 1) for size in (height, width))
    draws = random_access.keyed_integers(keys)
    shift_y = draws % (2 * pad_y + 1) - pad_y
    draws //= 2 * pad_y + 1
    shift_x = draws % (2 * pad_x + 1) - pad_x
    flip = (draws // (2 * pad_x + 1)) % 2 == 1
    rows = _reflected(shift_y[:, None] + tf.range(height, dtype=tf.int64)[None], height)
    columns = shift_x[:, None] + tf.range(width, dtype=tf.int64)[None]
    columns = _reflected(tf.where(flip[:, None], tf.reverse(columns, [1]), columns), width)
    pixels = (tf.range(count)[:, None, None] * height + rows[:, :, None]) * width + columns[
        :, None, :
    ]
    flat = tf.reshape(images, [-1, channels])
    return tf.reshape(tf.gather(flat, pixels), [count, height, width, channels])


def _reflected(index: tf.Tensor, size: int) -> tf.Tensor:
    """Positions past either edge mirrored back inside [0, size) (as tf.pad's REFLECT)."""
    index = tf.abs(index)
    return tf.where(index >= size, 2 * (size - 1) - index, index)


def _pair(example, image_key: str, label_key: str):
    return example[image_key], example[label_key]


def _check_augment(augment: str) -> None:
    if augment not in AUGMENTATIONS:
        raise ValueError(f"Unknown augmentation {augment!r}; use one of {AUGMENTATIONS}.")


INPUT_FROM = ("auto", "memory", "disk")


def classification_input(
    *,
    dataset: str,
    data_dir: str | None,
    image_dir: str | None,
    train_split: str,
    eval_split: str,
    global_batch_size: int,
    seed: int,
    input_from: str = "auto",
    augment: str = "none",
    image_size: tuple[int, int] | None = None,
    skip_bad_images: bool = False,
    say: Callable[[str], None] | None = None,
    input_nice: int = 0,
):
    """(spec, train_data, eval_data) for a classifier: a TFDS name, dataset folder or image folder.

    `data_dir` is the TFDS data directory for `dataset`, or one prepared
    dataset's folder (it holds dataset_info.json). `input_from`: 'memory'
    reads the splits into memory once (the bundled digits' fast path),
    'disk' reads every example from its file by index; 'auto' picks memory
    for a split that fits in `image_classification.IN_MEMORY_BYTES` with no
    augmentation or resize, disk otherwise. Image folders are always read
    from disk, and checked first (`skip_bad_images` and `say`: see
    `image_folders.read_splits`). `input_nice` is the niceness of the threads
    that read and decode the train stream from disk
    (`random_access.shuffled_batches`).

    Raises:
        ValueError: a bad combination, with the flag that fixes it.
    """
    if input_from not in INPUT_FROM:
        raise ValueError(f"Unknown input_from {input_from!r}; use one of {INPUT_FROM}.")
    _check_augment(augment)
    options = dict(
        train_split=train_split,
        eval_split=eval_split,
        global_batch_size=global_batch_size,
        seed=seed,
        augment=augment,
        image_size=image_size,
        input_nice=input_nice,
    )
    if image_dir is not None:
        if input_from == "memory":
            raise ValueError(
                "--image_dir is read from disk, example by example; drop --input_from=memory."
            )
        streams = from_image_folder(image_dir, skip_bad_images=skip_bad_images, say=say, **options)
        return streams.spec, streams.train, streams.eval
    if is_tfds_directory(data_dir):
        builder = tfds.builder_from_directory(data_dir)
    else:
        builder = image_classification.load_builder(dataset, data_dir)
    fits = image_classification.split_fits_in_memory(builder, train_split)
    if input_from == "memory" or (
        input_from == "auto" and fits and augment == "none" and image_size is None
    ):
        if augment != "none" or image_size is not None:
            raise ValueError(
                "--augment and --image_size apply to data read from disk; pass "
                "--input_from=disk (or auto) with them."
            )
        spec = image_classification.builder_spec(builder)

        def batches(split, shuffle_seed, repeat):
            return lambda: image_classification.builder_batches(
                builder,
                split,
                global_batch_size=global_batch_size,
                shuffle_seed=shuffle_seed,
                repeat=repeat,
            )

        return spec, batches(train_split, seed, True), batches(eval_split, None, False)
    streams = from_tfds_builder(builder, **options)
    return streams.spec, streams.train, streams.eval
