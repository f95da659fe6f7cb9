"""The settings of the example data, declared once
(`loops.vocabulary.settings.Setting`): a binary's flags.

Nothing here imports TensorFlow: a binary declares its flags from these before
--help, which answers without it.
"""

from __future__ import annotations

import os
from typing import Any

from loops.vocabulary.settings import Setting, satisfies
from loops.vocabulary.whole_numbers import is_whole


def parse_image_size(value: list[str] | None) -> tuple[int, int] | None:
    """--image_size's HEIGHT,WIDTH as (height, width); ValueError with the fix."""
    if value is None:
        return None
    try:
        height, width = (int(part) for part in value)
    except ValueError:
        height = width = 0
    if height < 1 or width < 1:
        raise ValueError(
            f"--image_size={','.join(value)} is not HEIGHT,WIDTH in pixels; pass two "
            "whole numbers >= 1, e.g. --image_size=32,32."
        )
    return height, width


def _check_image_size(name: str, value: Any) -> tuple[int, int] | None:
    """A check: None (each image keeps its size), or (height, width), whole numbers >= 1 (the
    flag's HEIGHT,WIDTH, parsed by `parse_image_size`)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        height = width = None
    else:
        height, width = value
    if not (is_whole(height, 1) and is_whole(width, 1)):
        raise ValueError(
            f"{name} must be (height, width), two whole numbers >= 1, got {value!r}; "
            "e.g. (32, 32) (--image_size=32,32)."
        )
    return height, width


def _data_dir_is_a_folder(name: str, value: str | None) -> str | None:
    """A check: refuses a path to a file given as --data_dir while the flags are parsed,
    before any work."""
    if value is None or not os.path.exists(value) or os.path.isdir(value):
        return value
    raise ValueError(
        f"{name} names a file, not a folder; point it at the TFDS data directory or at "
        "one prepared dataset's folder (DATA_DIR/NAME/VERSION), or leave it unset."
    )


# loops.bin.classifier: a TFDS dataset, a prepared dataset's folder, or a folder of images
# (the keyword arguments of `loops_data.image_streams.classification_input`).
IMAGE_CLASSIFICATION: tuple[Setting, ...] = (
    Setting(
        "dataset",
        "data",
        "TFDS image-classification dataset: 'digits' (bundled, offline), 'mnist', 'cifar10', ...",
        "string",
        default="digits",
    ),
    Setting(
        "data_dir",
        "data",
        "TFDS data directory (default: ~/tensorflow_datasets), or one prepared TFDS "
        "dataset's folder (DATA_DIR/NAME/VERSION, holding dataset_info.json; --dataset "
        "is then not used).",
        "string",
        check=_data_dir_is_a_folder,
        path=True,
    ),
    Setting(
        "image_dir",
        "data",
        "A folder of your own images instead of --dataset: IMAGE_DIR/train/CLASS/*.png|jpg "
        "and IMAGE_DIR/test/CLASS/*.png|jpg (TFDS ImageFolder layout). Every image is "
        "decoded before training (once per file while it does not change: the outcome is "
        "kept in ~/.cache/loops/image_checks).",
        "string",
        path=True,
    ),
    Setting(
        "skip_bad_images",
        "data",
        "--image_dir: leave out the files that are no PNG or JPEG or do not decode "
        "completely (truncated or corrupt), listed in results.json, instead of refusing "
        "to start.",
        "bool",
        default=False,
    ),
    Setting("train_split", "data", "Split to train on.", "string", default="train"),
    Setting("eval_split", "data", "Split to evaluate on.", "string", default="test"),
    Setting(
        "input_from",
        "data",
        "memory: read the splits into memory once (fastest for small data); disk: read "
        "each example from its file by index, decode and augment it on the fly (any "
        "size; a resume starts at its step without reading earlier batches); auto: "
        "memory when the train split fits in 1 GiB with no --augment or --image_size.",
        "enum",
        default="auto",
        choices=("auto", "memory", "disk"),
    ),
    Setting(
        "augment",
        "data",
        "Train-time augmentation of data read from disk: crop_flip = a random crop of "
        "the image padded by an eighth of its size, flipped half the time, drawn from "
        "(--seed, epoch, example), so a resumed run draws the same.",
        "enum",
        default="none",
        choices=("none", "crop_flip"),
    ),
    Setting(
        "input_nice",
        "data",
        "Data read from disk: 1-19 runs the reading, decoding and augmenting of the "
        "train batches on threads of their own, one per core, at that niceness (Linux's "
        "nice), so the train step takes the cores first and the input runs in its gaps "
        "(benchmarks/RESULTS.md); 0 leaves them to tf.data at the process's priority. Not "
        "for cores that other busy processes share: the input would wait behind them.",
        "integer",
        default=0,
        lower_bound=0,
        upper_bound=19,
    ),
    Setting(
        "image_size",
        "data",
        "HEIGHT,WIDTH: resize every image to it (needed for images of mixed sizes), e.g. "
        "--image_size=32,32.",
        "list",
        check=_check_image_size,
        from_flag=parse_image_size,
        annotation="tuple[int, int] | None",
    ),
)


def check_one_image_source(values: dict[str, Any], *, dataset_given: bool) -> None:
    """Refuses an --image_dir given with --dataset (`dataset_given`) or --data_dir, and
    --skip_bad_images without --image_dir.

    Raises:
        ValueError: both sources, and which to drop; --skip_bad_images, and what it needs.
    """
    if values["skip_bad_images"] and values["image_dir"] is None:
        raise ValueError(
            "--skip_bad_images leaves files out of an --image_dir; pass --image_dir, or "
            "drop --skip_bad_images."
        )
    if values["image_dir"] is not None and (dataset_given or values["data_dir"]):
        raise ValueError(
            f"--image_dir={values['image_dir']} replaces --dataset and --data_dir; pass "
            "one source of data."
        )


# loops.bin.gan: what the GAN learns to draw (it also picks the networks).
GAN_DATA: tuple[Setting, ...] = (
    Setting(
        "dataset",
        "data",
        "'ring': 8 Gaussians on a circle (2-D points, mode-coverage metrics); "
        "'digits': the bundled 8x8 digit images (sample grids as PNG). For digits "
        "a shorter run is enough, e.g. --train_steps=2000 --global_batch_size=128.",
        "enum",
        default="ring",
        choices=("ring", "digits"),
    ),
    Setting(
        "data_dir",
        "data",
        "TFDS data directory for digits (default: ~/tensorflow_datasets).",
        "string",
        check=_data_dir_is_a_folder,
        path=True,
    ),
)

# loops.bin.lm: windows of Python's own source (`loops_data.python_text`).
PYTHON_TEXT: tuple[Setting, ...] = (
    Setting(
        "sequence_length",
        "data",
        "Bytes the model reads per window (a row holds one more: the targets are shifted).",
        "integer",
        default=128,
        lower_bound=1,
    ),
)


def _check_data_file(name: str, value: str | None) -> str | None:
    """None (the generated log), or a file, a directory or a glob that names a file."""
    import glob

    if value is None or os.path.isfile(value) or os.path.isdir(value) or glob.glob(value):
        return value
    raise ValueError(
        f"{name} must name an interaction log that exists (a file, or a directory or glob of "
        f"shards), got {value!r}."
    )


# --format and --shuffle_window: how a log of shards is read (loops-ctr, loops-recommender).
SHARD_FORMAT = Setting(
    "format",
    "data",
    "The format of --data's shards, which streams them: parquet, tfrecord "
    "(tf.train.Example), csv, tsv, or criteo (Criteo's headerless TSV: label, I1..I13, "
    "C1..C26). Default: by the shards' suffixes; a single CSV file (for loops-ctr also a "
    "Parquet file) is read whole.",
    "enum",
    default=None,
    choices=("parquet", "tfrecord", "csv", "tsv", "criteo"),
)
SHUFFLE_WINDOW = Setting(
    "shuffle_window",
    "data",
    "With shards: the blocks (Parquet row groups, or 8192 records or lines) whose rows "
    "are shuffled together each epoch, the blocks' order drawn anew each epoch; what "
    "the stream holds at once.",
    "integer",
    default=8,
    lower_bound=1,
)


# loops.bin.recommender: an interaction log of the user's, or the generated one, and its split.
INTERACTIONS: tuple[Setting, ...] = (
    Setting(
        "data",
        "data",
        "An interaction log to train on: a file of user, item, rating and timestamp "
        "columns (MovieLens u.data, RecBole .inter, or CSV with a header), read whole; or "
        "a log of shards streamed in bounded memory: a directory, a glob, a Parquet, "
        "TFRecord or TSV file, or any of them with --format (docs/recommenders.md, 'Logs "
        "of shards'). Default: a generated log with planted user and item factors and Zipf "
        "item popularity. E.g. --data=~/.cache/loops/movielens/ml-100k.inter.",
        "string",
        check=_check_data_file,
        path=True,
    ),
    Setting(
        "split",
        "data",
        "Which interactions are held out for evaluation: random = a random --test_fraction "
        "of them (drawn from --seed), time = each user's latest --test_fraction by "
        "timestamp (rounded down).",
        "enum",
        default="random",
        choices=("random", "time"),
    ),
    Setting(
        "test_fraction",
        "data",
        "The share of the interactions held out for evaluation, in (0, 1).",
        "float",
        default=0.2,
        check=satisfies(lambda value: 0 < value < 1, "{name} must lie in (0, 1), e.g. 0.2."),
    ),
    Setting(
        "validation_fraction",
        "data",
        "The share of the training interactions held out for validation, by --split's rule "
        "(random: drawn from --seed; time: each user's latest before their test rows), in "
        "[0, 1). Evaluation during training reads it, the best checkpoint by the model's own "
        "metric (rmse, or recall_at_K; --keep_best_metric names another) is kept, restored "
        "before the export, and tested once at the end (results.json: best_step, validation, "
        "test). 0: no validation; the run evaluates on the test rows.",
        "float",
        default=0.1,
        check=satisfies(lambda value: 0 <= value < 1, "{name} must lie in [0, 1), e.g. 0.1."),
    ),
    SHARD_FORMAT,
    SHUFFLE_WINDOW,
)


# loops.bin.ctr: a feature table of the user's and its spec, or the generated click log, split.
CTR_DATA: tuple[Setting, ...] = (
    Setting(
        "data",
        "data",
        "A feature table to train on: a CSV file (a header line, then comma-separated "
        "fields) or a Parquet file, read whole by --spec; or a log of shards streamed in "
        "bounded memory: a directory, a glob, a TFRecord or TSV file, or any of them with "
        "--format (docs/ctr.md, 'Sharded logs'). Default: a generated Criteo-shaped click "
        "log of --generated_rows rows with a planted logistic truth (numeric, categorical "
        "and multi-hot columns, power-law value frequencies).",
        "string",
        path=True,
    ),
    SHARD_FORMAT,
    SHUFFLE_WINDOW,
    Setting(
        "spec",
        "data",
        "The JSON feature spec of --data: its label column (and the value of a click) and "
        "each feature column's kind, numeric, categorical or multi_hot, with its options "
        "(docs/ctr.md). Needed with --data.",
        "string",
        path=True,
    ),
    Setting(
        "generated_rows",
        "data",
        "Without --data: the rows of the generated click log.",
        "integer",
        default=100_000,
        lower_bound=10,
    ),
    Setting(
        "test_fraction",
        "data",
        "The share of the rows held out for the test, drawn at random from --seed (a sharded "
        "log's: by a hash of each row's shard and row number), in (0, 1).",
        "float",
        default=0.2,
        check=satisfies(lambda value: 0 < value < 1, "{name} must lie in (0, 1), e.g. 0.2."),
    ),
    Setting(
        "validation_fraction",
        "data",
        "The share of the training rows held out for validation, in [0, 1). Evaluation "
        "during training reads it, the checkpoint of the best validation auc (or "
        "--keep_best_metric) is kept, restored before the export, and tested once at the end "
        "(results.json: best_step, validation, test). 0: no validation; the run evaluates on "
        "the test rows.",
        "float",
        default=0.1,
        check=satisfies(lambda value: 0 <= value < 1, "{name} must lie in [0, 1), e.g. 0.1."),
    ),
)
