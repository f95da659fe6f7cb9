"""Random draws keyed on the step and each example's global row: replicas differ, 1 and N agree."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

import keras
import tensorflow as tf

from loops.core import micro_batches
from loops.topology import replica_bounds


def step_seed(seed: int, step: tf.Tensor, *streams: int | tf.Tensor) -> tf.Tensor:
    """The stateless [2] seed of one random stream of one training step.

    Args:
        seed: the run's (or the layer's) seed.
        step: the training step (a tensor or variable).
        *streams: further keys folded in, in order (a substep, a purpose).
    """
    key = tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])
    for stream in streams:
        key = tf.random.experimental.stateless_fold_in(key, stream)
    return key


def replica_rows(
    draw: Callable[..., tf.Tensor],
    seed: tf.Tensor,
    *,
    local_rows: tf.Tensor,
    global_rows: tf.Tensor,
    row_shape: Sequence[int] | tf.Tensor,
) -> tf.Tensor:
    """This replica's rows of one random tensor drawn for the whole global batch.

    Every replica draws `draw([global_rows, *row_shape], seed=seed)` and keeps
    the rows its data slice holds (the Loop's split,
    `topology.replica_bounds`). Row i is therefore the same for 1 or N
    replicas, and different rows, on any replicas, are independent; a stateful
    or seeded generator would repeat the same rows on every replica (BUILD.md
    fact 7). Under gradient accumulation (`loops.Update`) the rows are those
    of the whole step, whatever micro-batch is being computed, so the draws
    do not depend on the number of micro-batches either. Call in replica
    context.

    Args:
        draw: a stateless sampler, e.g. tf.random.stateless_normal.
        seed: its [2] seed, e.g. from `step_seed`.
        local_rows: rows this replica holds.
        global_rows: rows all replicas hold (from `reduction.global_count`).
        row_shape: the shape of one row (a sequence or a 1-D int tensor).
    """
    micro_batch = micro_batches.current()
    if micro_batch is not None:
        global_rows, start = micro_batch.step_rows, micro_batch.first_row
    else:
        context = tf.distribute.get_replica_context()
        global_rows = tf.cast(global_rows, tf.int32)
        start, _ = replica_bounds(
            global_rows,
            tf.cast(context.replica_id_in_sync_group, tf.int32),
            context.num_replicas_in_sync,
        )
    shape = tf.concat([[global_rows], tf.cast(row_shape, tf.int32)], 0)
    values = draw(shape, seed=seed)
    return values[start : start + tf.cast(local_rows, tf.int32)]


# The keys a replica's random layers read. Thread-local: MirroredStrategy traces
# each replica's function in a thread of its own, and they take turns mid-call.
_keys = threading.local()


@contextlib.contextmanager
def keyed_on(*, step: tf.Tensor, global_rows: tf.Tensor) -> Iterator[None]:
    """Keys the `StatelessDropout` layers called inside on this step and global batch.

    Wrap a replica's model call in it, in replica context (inside
    `strategy.run`), as `ClassifierLoop` does:

        count = loops.global_count(tf.shape(labels)[0])
        with loops.replica_random.keyed_on(step=self.global_step, global_rows=count):
            logits = self.model(inputs, training=True)

    Args:
        step: the training step (e.g. the Loop's `global_step`): masks change
            from step to step.
        global_rows: examples all replicas hold in this step, from
            `reduction.global_count`; each replica takes its rows of draws made
            for all of them.
    """
    stack = _keys.__dict__.setdefault("stack", [])
    stack.append((step, global_rows))
    try:
        yield
    finally:
        stack.pop()


class StatelessDropout(keras.layers.Layer):
    """Dropout whose mask of example i at step s depends only on (seed, s, i).

    Keras' `Dropout` draws the same mask on every replica (BUILD.md fact 7).
    This layer draws one mask for the step's whole global batch, keyed on its
    seed and the step, and each replica keeps the rows of its own examples:
    replicas holding the same inputs still drop different units, and 1 and N
    replicas drop the same units of the same example. In training it must be
    called inside `keyed_on`; at inference it passes its input through.

    Args:
        rate: fraction of the units to drop, in [0, 1).
        seed: the layer's random stream; give each layer of a model its own.
    """

    def __init__(self, rate: float, *, seed: int, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"Dropout rate must lie in [0, 1), got {rate!r}; e.g. rate=0.2.")
        self.rate = float(rate)
        self.seed = int(seed)

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        stack = getattr(_keys, "stack", None)
        if not stack:
            raise ValueError(
                f"StatelessDropout {self.name!r} was called with training=True outside "
                "loops.replica_random.keyed_on(step=..., global_rows=...); wrap the "
                "model call of your replica step in it (ClassifierLoop does)."
            )
        step, global_rows = stack[-1]
        uniform = replica_rows(
            tf.random.stateless_uniform,
            step_seed(self.seed, step),
            local_rows=tf.shape(inputs)[0],
            global_rows=global_rows,
            row_shape=tf.shape(inputs)[1:],
        )
        scale = tf.cast(1.0 / (1.0 - self.rate), inputs.dtype)
        return tf.where(uniform >= self.rate, inputs * scale, tf.zeros_like(inputs))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
