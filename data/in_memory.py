"""tf.data streams of batches of arrays held in memory: one epoch, or endless full batches of
passes drawn as permutations, the same sequence every run.

Kept apart from the TFDS readers so that the logs read whole into memory (the
recommenders', the click logs', the text corpus) load without TensorFlow
Datasets' import (a quarter of a second of each process)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def batches_in_memory(arrays, batch_size: int, shuffle_seed: int | None = None) -> tf.data.Dataset:
    """One epoch of batches of `arrays` (a nest of tensors with the same first dimension).

    Without a seed the rows keep their order. With one, every pass (every
    repetition of the returned dataset) takes a new permutation, drawn from a
    sequence that is the same on every run.
    """
    arrays = tf.nest.map_structure(tf.convert_to_tensor, arrays)
    rows = int(tf.nest.flatten(arrays)[0].shape[0])
    full = rows // batch_size

    def cut(parts):
        batches = tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(
                lambda part: tf.reshape(
                    part[: full * batch_size], [full, batch_size, *part.shape[1:]]
                ),
                parts,
            )
        )
        if rows % batch_size:
            batches = batches.concatenate(
                tf.data.Dataset.from_tensors(
                    tf.nest.map_structure(lambda part: part[full * batch_size :], parts)
                )
            )
        return batches

    if shuffle_seed is None:
        return _untuned(cut(arrays))

    def permuted(epoch_seed):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(rows), seed=tf.stack([epoch_seed, tf.constant(shuffle_seed, tf.int64)])
        )
        return cut(tf.nest.map_structure(lambda part: tf.gather(part, order), arrays))

    # One random number per pass picks the pass's permutation; the sequence of
    # numbers is fixed by the seed, and a new pass draws the next one.
    return _untuned(
        tf.data.Dataset.random(seed=shuffle_seed, rerandomize_each_iteration=True)
        .take(1)
        .flat_map(permuted)
    )


# What `endless_batches_in_memory` draws at a time, at most (but one pass at
# least): whole passes of a small split at once, so the per-pass work is
# spread over many batches.
ROWS_PER_DRAW = 1 << 16
BYTES_PER_DRAW = 64 << 20


def endless_batches_in_memory(
    arrays, batch_size: int, shuffle_seed: int | None = None
) -> tf.data.Dataset:
    """Endless full batches of `arrays` (a nest of tensors with the same first dimension).

    Passes over the rows follow each other, each a new permutation with a
    seed (the same sequence every run, so `skip(k)` resumes exactly), in
    order without one; the rows a pass leaves over start the next pass's
    first batch. Passes are drawn as many at a time as fit in
    `ROWS_PER_DRAW` rows and `BYTES_PER_DRAW` bytes, and gathered with one
    gather.

    Raises:
        ValueError: `arrays` has no rows.
    """
    arrays = tf.nest.map_structure(tf.convert_to_tensor, arrays)
    rows = int(tf.nest.flatten(arrays)[0].shape[0])
    if rows == 0:
        raise ValueError(
            "No rows to batch: an endless stream of an empty split would never "
            "yield a batch. Train on a split that holds examples."
        )
    row_bytes = sum(
        int(np.prod(part.shape[1:])) * part.dtype.size for part in tf.nest.flatten(arrays)
    )
    passes = max(1, min(ROWS_PER_DRAW // rows, BYTES_PER_DRAW // max(row_bytes * rows, 1)))

    def draw(draw_seed):
        if shuffle_seed is None:
            return tf.tile(tf.range(rows, dtype=tf.int64), [passes])
        keys = tf.random.stateless_uniform(
            [passes, rows],
            seed=tf.stack([draw_seed, tf.constant(shuffle_seed, tf.int64)]),
            minval=None,
            maxval=None,
            dtype=tf.int64,
        )
        return tf.reshape(tf.argsort(keys, axis=1, stable=True), [-1])

    def cut(left_over, draw_seed):
        order = tf.concat([left_over, tf.cast(draw(draw_seed), tf.int64)], 0)
        used = tf.size(order, out_type=tf.int64) // batch_size * batch_size
        return order[used:], tf.reshape(order[:used], [-1, batch_size])

    def gathered(indices):
        return tf.data.Dataset.from_tensor_slices(
            tf.nest.map_structure(lambda part: tf.gather(part, indices), arrays)
        )

    seeds = (
        tf.data.Dataset.random(seed=shuffle_seed)
        if shuffle_seed is not None
        else tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    )
    return _untuned(seeds.scan(tf.zeros([0], tf.int64), cut).flat_map(gathered))


def _untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    # Batching from memory runs nothing in parallel and buffers nothing, so
    # there is nothing to tune: autotuning's bookkeeping alone cost about
    # 60 us of CPU a batch.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
