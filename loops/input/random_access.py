"""Shuffled global batches over a random-access source, startable at any batch at the cost of one.

A stream that resumes by skipping re-reads (and re-decodes) every batch
before its position: hours at step 100,000 of a large dataset. Here batch k
of the stream is a function of k alone: its examples are the stream positions
[k * B, (k + 1) * B), position p is example `index_shuffle(p mod N)` of epoch
`p // N` (a new permutation of the whole dataset each epoch, drawn from the
seed and the epoch), and those examples are read by index. Starting at batch k
reads batch k first, whatever k is, and the batches are bit-identical to the
ones an uninterrupted stream hands out there.

A source is anything with `num_examples` and `read(indices)` that returns
one row per index (a serialized example, or a file's bytes and its label), in
graph mode:
`RecordFiles` reads TFRecord and ArrayRecord files (TFDS's two formats),
`loops_data.image_folders` reads files of a folder.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import tensorflow as tf

from loops.vocabulary.whole_numbers import is_whole


class SeekableBatches:
    """An endless stream of global batches that begins at any batch without reading earlier ones.

    Pass it as a loop's `train_data`: a resume then builds the stream at its
    position (`batches_from(position)`) instead of skipping `position`
    batches. Called with no argument it is the stream from its start, so it
    is also a plain dataset function.
    """

    def __init__(self, batches_from: Callable[[int], tf.data.Dataset]):
        self._batches_from = batches_from

    def batches_from(self, position: int) -> tf.data.Dataset:
        """The stream's batches from batch `position` (0 is the first) on, endless."""
        if not is_whole(position, 0):
            raise ValueError(f"A stream position is a whole number >= 0, got {position!r}.")
        return self._batches_from(position)

    def __call__(self) -> tf.data.Dataset:
        return self.batches_from(0)


class RandomAccessSource(Protocol):
    """What `shuffled_batches` reads: a count of examples and a read by index."""

    @property
    def num_examples(self) -> int: ...

    def read(self, indices: tf.Tensor):
        """What the examples at `indices` (int64 vector) hold, one row each, in graph mode.

        Serialized examples (a string vector), or a nest of vectors (an image
        folder: file contents and labels); `decode` gets the batch of them.
        """
        ...


def shuffled_batches(
    source: RandomAccessSource,
    decode: Callable[[object, tf.Tensor], object],
    *,
    global_batch_size: int,
    seed: int,
    input_nice: int = 0,
) -> SeekableBatches:
    """Endless full global batches of `source`, the whole dataset shuffled anew each epoch.

    Epochs follow each other with no partial batch between them (a batch may
    end one epoch and start the next), so every batch has `global_batch_size`
    rows and a static shape.

    Reading and decoding share the cores with the train step. With
    `input_nice` 1-19 they run on a pool of their own, a thread per core,
    each lowered to that niceness (Linux's `nice`) when it first reads, so
    the step takes the cores when it needs them and the input runs in its
    gaps: faster than the two taking turns (benchmarks/RESULTS.md, "Streaming
    from disk"). Opt-in: other busy processes on the cores starve the input,
    and one run under load hung (BUILD.md).

    Args:
        source: where examples are read by index.
        decode: (rows of `source.read`, keys) -> one decoded batch (a nest of
            tensors). Row i's key, an int64 pair (seed, epoch * num_examples
            + index), names that example's draw in that epoch: augmentation
            keyed on it (`keyed_integers`) repeats exactly in a resumed run
            and differs every epoch. `map_rows` applies a per-example function.
        global_batch_size: rows per batch.
        seed: picks each epoch's permutation and every example's key.
        input_nice: 0 (tf.data's own threads, at the process's priority) or
            the niceness 1-19 of the input's own threads.

    Raises:
        ValueError: a source with no examples, or `input_nice` out of 0-19.
    """
    num_examples = _checked_count(source)
    _check_nice(input_nice)

    def batch_at(batch):
        stream = batch * global_batch_size + tf.range(global_batch_size, dtype=tf.int64)
        epochs = stream // num_examples
        indices = shuffled_index(
            stream % num_examples, epochs, num_examples=num_examples, seed=seed
        )
        seeds = tf.fill([global_batch_size], tf.constant(seed, tf.int64))
        if input_nice:
            indices = _after_lowering_the_thread(indices, input_nice)
        return decode(source.read(indices), tf.stack([seeds, epochs * num_examples + indices], 1))

    def batches_from(position: int) -> tf.data.Dataset:
        batches = (
            tf.data.Dataset.range(position, np.iinfo(np.int64).max)
            .map(batch_at, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        return batches.with_options(_own_threads()) if input_nice else batches

    return SeekableBatches(batches_from)


NICEST = 19  # Linux's lowest priority


def lower_calling_thread(nice: int) -> bool:
    """Lowers the calling thread to niceness `nice` unless it is that low already; True."""
    thread = threading.get_native_id()
    if os.getpriority(os.PRIO_PROCESS, thread) < nice:
        os.setpriority(os.PRIO_PROCESS, thread, nice)
    return True


def _after_lowering_the_thread(indices: tf.Tensor, nice: int) -> tf.Tensor:
    """`indices`, once the thread reading the batch has lowered itself (once; then a check)."""
    lowered = tf.numpy_function(
        functools.partial(lower_calling_thread, nice), [], tf.bool, stateful=True
    )
    with tf.control_dependencies([lowered]):
        return tf.identity(indices)


def _own_threads() -> tf.data.Options:
    """A private pool of a thread per usable core that runs all of the input's work.

    Kernels that would split their work over TensorFlow's shared pool (the
    one the step's kernels use) run on the calling pool thread instead.
    """
    options = tf.data.Options()
    options.threading.private_threadpool_size = len(os.sched_getaffinity(0))
    options.threading.max_intra_op_parallelism = 1
    return options


def _check_nice(input_nice: int) -> None:
    if not is_whole(input_nice) or not 0 <= input_nice <= NICEST:
        raise ValueError(
            f"input_nice={input_nice!r} is not a niceness the input can run at: pass a whole "
            f"number from 0 (the process's own priority) to {NICEST} (the lowest)."
        )


def ordered_batches(
    source: RandomAccessSource,
    decode: Callable[[object, tf.Tensor], object],
    *,
    global_batch_size: int,
) -> tf.data.Dataset:
    """One pass over `source` in index order, the last batch maybe partial (evaluation).

    `decode` is `shuffled_batches`' with keys (0, index); an evaluation
    decode ignores them.
    """
    num_examples = _checked_count(source)

    def batch_from(first):
        indices = tf.range(first, tf.minimum(first + global_batch_size, num_examples))
        return decode(source.read(indices), tf.stack([tf.zeros_like(indices), indices], 1))

    return (
        tf.data.Dataset.range(0, num_examples, global_batch_size)
        .map(batch_from, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(tf.data.AUTOTUNE)
    )


# Batches up to this size get one copy of a per-row function per row in the
# graph (`map_rows`); larger ones loop over rows (`tf.map_fn`).
UNROLLED_ROWS = 512


def map_rows(function: Callable, rows):
    """`function(row)` for each row of `rows` (a nest of tensors of one length), stacked.

    For the work that has no batched op (decoding an image). A batch of
    static size up to `UNROLLED_ROWS` gets one copy of `function` per row,
    which TensorFlow runs in parallel: a tf.data map per example (unbatch,
    map, batch) cost 1.4x the CPU per image and a `tf.map_fn` 1.3x
    (benchmarks/RESULTS.md, "Streaming from disk").
    """
    count = tf.nest.flatten(rows)[0].shape[0]
    if count is not None and count <= UNROLLED_ROWS:
        results = [
            function(tf.nest.map_structure(lambda part, row=row: part[row], rows))
            for row in range(count)
        ]
        return tf.nest.map_structure(lambda *parts: tf.stack(parts), *results)
    row_spec = tf.nest.map_structure(lambda part: tf.TensorSpec(part.shape[1:], part.dtype), rows)
    traced = tf.function(function, autograph=False).get_concrete_function(row_spec)
    signature = tf.nest.map_structure(
        lambda value: tf.TensorSpec(value.shape, value.dtype), traced.structured_outputs
    )
    return tf.map_fn(function, rows, fn_output_signature=signature)


def keyed_integers(keys: tf.Tensor) -> tf.Tensor:
    """A pseudo-random int64 in [0, 2**62) for each key (rows of [seed, example key]), vectorized.

    The rows share one seed (the first row's).

    The same key gives the same number in any batch, at any position; a
    batch of draws costs one op (stateless random ops take one seed at a
    time, so per-example draws with them cost a few ops per example).
    """
    count = tf.shape(keys)[0]
    # A keyed bijection of [0, 2**62): distinct example keys, distinct numbers.
    # Its round keys are drawn (Philox) from the seed: RandomIndexShuffle
    # keyed on small raw numbers barely permutes.
    round_keys = tf.random.stateless_uniform(
        [3],
        seed=tf.stack([keys[0, 0], tf.constant(0x6B657973, tf.int64)]),
        minval=None,
        maxval=None,
        dtype=tf.int64,
    )
    return tf.raw_ops.RandomIndexShuffle(
        index=keys[:, 1] % (1 << 62),
        seed=tf.tile(round_keys[None], [count, 1]),
        max_index=tf.fill([count], tf.constant((1 << 62) - 1, tf.int64)),
        rounds=4,
    )


def shuffled_index(slots, epochs, *, num_examples: int, seed: int):
    """Which example sits at place `slots` of epoch `epochs`' permutation (int64 vectors)."""
    if num_examples == 1:
        return tf.zeros_like(slots)
    # The permutation's key is drawn (Philox) from (seed, epoch): keyed
    # directly, small seeds such as (0, 0) give a permutation close to the
    # identity. A batch spans one epoch or a few: one draw each.
    first = tf.reduce_min(epochs)
    keys = tf.map_fn(
        lambda epoch: tf.random.stateless_uniform(
            [3],
            seed=tf.stack([tf.constant(seed, tf.int64), epoch]),
            minval=None,
            maxval=None,
            dtype=tf.int64,
        ),
        tf.range(first, tf.reduce_max(epochs) + 1),
    )
    count = tf.shape(slots)[0]
    # The raw op: TF 2.21's `tf.random.experimental.index_shuffle` pads a
    # batched [n, 2] seed along the wrong axis and rejects it.
    return tf.raw_ops.RandomIndexShuffle(
        index=slots,
        seed=tf.gather(keys, epochs - first),
        max_index=tf.fill([count], tf.constant(num_examples - 1, tf.int64)),
        rounds=4,
    )


def _checked_count(source: RandomAccessSource) -> int:
    count = source.num_examples
    if count < 1:
        raise ValueError(
            f"{source!r} holds no examples: there is nothing to batch. Point it at a "
            "split or folder that holds examples."
        )
    return int(count)


class RecordFiles:
    """Random access by index to the records of TFRecord or ArrayRecord files, in file order.

    TFRecord files have no index: the first use scans each file's record
    headers once (a seek per record, no data read) and keeps the offsets.
    ArrayRecord files are read with the `array_record` package that
    tensorflow-datasets installs with itself.

    `records_read` counts the records handed out (tests use it to show that
    a resume reads nothing before its position).
    """

    def __init__(self, paths: Sequence[str], *, file_format: str = "tfrecord"):
        if not paths:
            raise ValueError("RecordFiles needs at least one file; got none.")
        if file_format not in ("tfrecord", "array_record"):
            raise ValueError(
                f"Unsupported record file format {file_format!r}: use 'tfrecord' or "
                "'array_record' (TFDS's formats)."
            )
        self.paths = [os.fspath(path) for path in paths]
        self.file_format = file_format
        self.records_read = 0
        self._lock = threading.Lock()
        if file_format == "tfrecord":
            # Python lists: indexing them is several times faster than numpy arrays.
            self._files, self._offsets, self._lengths = _tfrecord_index(self.paths)
            self._reader = None
            self._count = len(self._offsets)
        else:
            from array_record.python import array_record_data_source  # noqa: PLC0415

            self._reader = array_record_data_source.ArrayRecordDataSource(self.paths)
            self._count = len(self._reader)

    @property
    def num_examples(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"RecordFiles({len(self.paths)} {self.file_format} files, {self._count} records)"

    def read_numpy(self, indices: np.ndarray) -> np.ndarray:
        """The records at `indices` as an object array of bytes."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self._count):
            raise IndexError(f"Record indices must lie in [0, {self._count}), got {indices!r}.")
        if self._reader is not None:
            records = self._reader.__getitems__(indices.tolist())
        else:
            maps = self._memory_maps()
            files, offsets, lengths = self._files, self._offsets, self._lengths
            records = [
                maps[files[i]][offsets[i] : offsets[i] + lengths[i]] for i in indices.tolist()
            ]
        with self._lock:
            self.records_read += len(records)
        array = np.empty(len(records), dtype=object)
        array[:] = records
        return array.reshape(indices.shape)

    def read(self, indices: tf.Tensor) -> tf.Tensor:
        records = tf.numpy_function(self.read_numpy, [indices], tf.string, stateful=False)
        return tf.ensure_shape(records, indices.shape)

    def _memory_maps(self) -> list[mmap.mmap | bytes]:
        # Mapped per process on first use (a forked reader maps its own):
        # slicing a map costs a quarter of a pread call per record.
        if self.__dict__.get("_maps_pid") != os.getpid():
            maps: list[mmap.mmap | bytes] = []
            for path in self.paths:
                if not os.path.getsize(path):  # an empty shard: no records, nothing to map
                    maps.append(b"")
                    continue
                with open(path, "rb") as handle:
                    maps.append(mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ))
            self._maps, self._maps_pid = maps, os.getpid()
        return self._maps


_TFRECORD_HEADER = 12  # uint64 length, uint32 masked CRC of the length
_TFRECORD_FOOTER = 4  # uint32 masked CRC of the data


def _tfrecord_index(paths: Sequence[str]):
    files, offsets, lengths = [], [], []
    for file, path in enumerate(paths):
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            position = 0
            while position < size:
                handle.seek(position)
                header = handle.read(_TFRECORD_HEADER)
                if len(header) < _TFRECORD_HEADER:
                    raise ValueError(
                        f"{path} ends inside a record header at byte {position}: the file is "
                        "truncated. Write it again (or prepare the dataset again)."
                    )
                (length,) = struct.unpack("<Q", header[:8])
                end = position + _TFRECORD_HEADER + length + _TFRECORD_FOOTER
                if end > size:
                    raise ValueError(
                        f"{path}: the record at byte {position} claims {length} bytes but the "
                        "file ends first: it is truncated or not a TFRecord file. Write it again."
                    )
                files.append(file)
                offsets.append(position + _TFRECORD_HEADER)
                lengths.append(length)
                position = end
    return files, offsets, lengths
