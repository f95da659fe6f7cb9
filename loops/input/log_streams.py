"""Global batches of a sharded log in bounded memory: each epoch its blocks in a new order and
their rows shuffled within windows of a few blocks, batch k a function of k alone, so a resume
at any batch opens only the blocks of the window it starts in (`shuffled_log_batches`); and one
pass in the log's order for evaluation (`ordered_log_batches`).

The stream's rows: epoch e orders the blocks by a permutation drawn from (seed, e); each run of
`window_blocks` blocks of that order is a window, its rows of the part read
(`sharded_logs.LogPart`) permuted by a draw from (seed, e, window). Epochs follow each other
with no partial batch between them, as `random_access.shuffled_batches`' do. Every draw is
numpy's PCG64 of those numbers, and the block counts come from the log's index, so the global
batch at step k is the same on any layout and after any kill: the input of exact parity
(`distributed_input` splits it over the replicas). What it holds at once: one window of prepared
rows and one batch (`StreamStats.most_rows_held`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from loops.input.random_access import SeekableBatches
from loops.input.sharded_logs import BlockTable, ShardedLog
from loops.vocabulary.whole_numbers import check_whole

# A block's rows as the step reads them: a nest of arrays, rows first.
Prepare = Callable[[BlockTable], Any]


@dataclasses.dataclass
class StreamStats:
    """What a stream did: the most rows it held prepared at once, and the blocks it read."""

    most_rows_held: int = 0
    blocks_read: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def held(self, rows: int) -> None:
        with self.lock:
            self.most_rows_held = max(self.most_rows_held, rows)


class Part(Protocol):
    """Some rows of a log, read block by block: a `sharded_logs.LogPart` (a hash split) or
    another rule's part (a time split's)."""

    @property
    def log(self) -> ShardedLog: ...

    def counts(self) -> np.ndarray: ...

    def read(self, block: int) -> BlockTable: ...


@dataclasses.dataclass(frozen=True)
class Rows:
    """Some rows of a log (`part`: a split) and how a block of them is prepared for the step."""

    part: Part
    prepare: Prepare

    @property
    def log(self) -> ShardedLog:
        return self.part.log

    def counts(self) -> np.ndarray:
        return self.part.counts()

    def block(self, block: int, stats: StreamStats | None = None) -> Any:
        """Block `block`'s rows of the part, prepared."""
        if stats is not None:
            stats.blocks_read += 1
        return self.prepare(self.part.read(block))


def _rows_of(part: Any) -> int:
    return int(tf.nest.flatten(part)[0].shape[0])


def _joined(parts: list[Any]) -> Any:
    """The parts' rows one after another; arrays of a second axis (multi-hot bags) padded to
    the widest with -1 first."""

    def join(*arrays: np.ndarray) -> np.ndarray:
        if arrays[0].ndim == 2:
            width = max(array.shape[1] for array in arrays)
            arrays = tuple(
                np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=-1) for a in arrays
            )
        return np.concatenate(arrays)

    return tf.nest.map_structure(join, *parts) if len(parts) > 1 else parts[0]


def _taken(part: Any, index: np.ndarray) -> Any:
    return tf.nest.map_structure(lambda array: array[index], part)


class _Epochs:
    """Where each kept row of the stream sits: epoch, window and place, from the counts alone."""

    def __init__(self, counts: np.ndarray, window_blocks: int, seed: int):
        self.counts, self.window_blocks, self.seed = counts, window_blocks, seed
        self.rows = int(counts.sum())
        self._cached: tuple[int, list[np.ndarray], np.ndarray] | None = None

    def windows(self, epoch: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Epoch `epoch`'s windows (their blocks, in order) and the first row of each."""
        if self._cached is None or self._cached[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.counts))
            windows = [
                order[start : start + self.window_blocks]
                for start in range(0, len(order), self.window_blocks)
            ]
            sizes = np.array([self.counts[w].sum() for w in windows], np.int64)
            self._cached = (epoch, windows, np.concatenate([[0], np.cumsum(sizes)]))
        return self._cached[1], self._cached[2]

    def order(self, epoch: int, window: int, rows: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch, window]).permutation(rows)


def shuffled_log_batches(
    rows: Rows,
    *,
    global_batch_size: int,
    seed: int,
    signature: Any,
    window_blocks: int = 8,
    stats: StreamStats | None = None,
) -> SeekableBatches:
    """Endless full global batches of `rows`, shuffled as the module docstring says; a
    `SeekableBatches` whose `batches_from(k)` reads from the window that batch k starts in.

    Args:
        rows: the log's rows the stream reads, and how they are prepared.
        global_batch_size: rows a batch.
        seed: every permutation's seed.
        signature: the nest of `tf.TensorSpec` of a batch (its row axis None).
        window_blocks: blocks a window (the shuffle's reach, and what it holds at once).
        stats: where the stream counts what it held and read (tests), or None.

    Raises:
        ValueError: no rows to read, or a size that is not a whole number >= 1.
    """
    check_whole("global_batch_size", global_batch_size, 1)
    check_whole("window_blocks", window_blocks, 1)
    epochs = _Epochs(rows.counts(), window_blocks, seed)
    if epochs.rows == 0:
        raise ValueError(f"{rows.part!r} holds no rows to train on.")
    stats = stats if stats is not None else StreamStats()

    generated = (signature, signature, tf.TensorSpec([None], tf.int64))
    return SeekableBatches(
        lambda position: (
            tf.data.Dataset.from_generator(
                lambda: _windows(rows, epochs, stats, global_batch_size, position),
                output_signature=generated,
            )
            .flat_map(
                lambda carry, part, order: _whole_batches(carry, part, order, global_batch_size)
            )
            .prefetch(4)
        )
    )


def _windows(
    rows: Rows, epochs: _Epochs, stats: StreamStats, global_batch_size: int, position: int
) -> Iterator[tuple[Any, Any, np.ndarray]]:
    """From batch `position` on: (rows carried over, a window's prepared rows, the order its
    rows are taken in), the carried rows and the ordered ones filling whole batches; what is
    left is carried on to the next window."""
    stream_row, carry = position * global_batch_size, None
    while True:
        epoch, place = divmod(stream_row, epochs.rows)
        blocks, starts = epochs.windows(epoch)
        window = int(np.searchsorted(starts, place, side="right")) - 1
        parts = [rows.block(int(b), stats) for b in blocks[window] if epochs.counts[b]]
        prepared = _joined(parts)
        order = epochs.order(epoch, window, _rows_of(prepared))[place - starts[window] :]
        stream_row += len(order)
        carry = _taken(prepared, order[:0]) if carry is None else carry
        held = _rows_of(carry) + len(order)
        stats.held(_rows_of(prepared) + _rows_of(carry))
        if held < global_batch_size:
            carry = _joined([carry, _taken(prepared, order)])
            continue
        kept = len(order) - held % global_batch_size
        yield carry, prepared, order[:kept]
        carry = _taken(prepared, order[kept:])


def _whole_batches(carry, window, order, global_batch_size: int) -> tf.data.Dataset:
    """The carried rows, then the window's rows in `order`, as whole batches (a gather and a
    reshape in the graph: the permutation runs without Python's lock)."""
    rows_in = tf.nest.map_structure(
        lambda before, part: _padded_concat(before, tf.gather(part, order)), carry, window
    )
    count = tf.shape(tf.nest.flatten(rows_in)[0])[0] // global_batch_size
    return tf.data.Dataset.from_tensor_slices(
        tf.nest.map_structure(
            lambda part: tf.reshape(
                part, tf.concat([[count, global_batch_size], tf.shape(part)[1:]], 0)
            ),
            rows_in,
        )
    )


def _padded_concat(first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    """Rows of both; bags (a second axis) padded with -1 to the wider first."""
    if first.shape.rank == 2:
        width = tf.maximum(tf.shape(first)[1], tf.shape(second)[1])
        first, second = (
            tf.pad(part, [[0, 0], [0, width - tf.shape(part)[1]]], constant_values=-1)
            for part in (first, second)
        )
    return tf.concat([first, second], 0)


def ordered_log_batches(
    rows: Rows, *, global_batch_size: int, signature: Any, stats: StreamStats | None = None
) -> Callable[[], tf.data.Dataset]:
    """One pass over `rows` in the log's order (shards by path, blocks in their order), its
    last batch partial: an evaluation's stream, as a function that builds it."""
    check_whole("global_batch_size", global_batch_size, 1)

    def batches() -> Iterator[Any]:
        held: list[Any] = []
        held_rows = 0
        for block in range(len(rows.log.blocks)):
            part = rows.block(block, stats)
            count = _rows_of(part)
            start = 0
            while start < count:
                taken = min(global_batch_size - held_rows, count - start)
                held.append(_taken(part, np.arange(start, start + taken)))
                held_rows, start = held_rows + taken, start + taken
                if held_rows == global_batch_size:
                    yield _joined(held)
                    held, held_rows = [], 0
        if held_rows:
            yield _joined(held)

    return lambda: tf.data.Dataset.from_generator(batches, output_signature=signature).prefetch(2)
