"""How one replica computes the loss, logs and gradients that a `loops.Update` applies.

`loops.core.update.Update` checks and applies what this computes: the tape
over the replica function (the model's regularization losses added once, the
float16 loss scale applied and undone, XLA where `jit_compile` asks), in one
pass or micro-batch by micro-batch (gradient accumulation, weighted by each
micro-batch's normalizer), and the function the exact parameter-server mode
runs on each slice of a step, computed on its workers.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from loops.core import compilation, micro_batches
from loops.core.mixed_precision import DynamicLossScale
from loops.core.table_updates import TableGradients
from loops.tables import table_rows
from loops.topology import replica_bounds

# A replica function's result: its share of the loss (already divided by the
# real global count, `loops.scale_to_global_batch`) and scalars to sum over replicas.
ReplicaLoss = Callable[..., "tuple[tf.Tensor, Mapping[str, tf.Tensor]]"]


class ReplicaGradients:
    """One replica's loss, logs and gradients of an Update's variables; replica context.

    Args:
        trained: the Update's Keras model (whose regularization losses are
            added once) or function returning its variables.
        variables: returns the variables to differentiate, in the Update's order.
        tables: the Update's `TableGradients` (a slice's table gradients leave as rows).
        loss_scale: the Update's float16 loss scale, or None.
        jit_compile: compile the forward and backward pass with XLA.
        grad_accum_steps: the micro-batches a replica's share is cut into.
    """

    def __init__(
        self,
        trained: keras.Model | Callable[[], Sequence[tf.Variable]],
        variables: Callable[[], list[tf.Variable]],
        *,
        tables: TableGradients,
        loss_scale: DynamicLossScale | None,
        jit_compile: bool,
        grad_accum_steps: int,
    ):
        self._trained = trained
        self._variables = variables
        self._tables = tables
        self._loss_scale = loss_scale
        self._jit_compile = jit_compile
        self._grad_accum_steps = grad_accum_steps
        self._slice_functions: dict[ReplicaLoss, Callable[..., tuple]] = {}

    def __call__(self, replica_loss: ReplicaLoss, args: Sequence) -> tuple[Any, dict, list]:
        """`replica_loss(*args)`'s loss, logs and gradients: at once, or summed over the
        micro-batches under `grad_accum_steps` > 1."""
        if self._grad_accum_steps == 1:
            return self._loss_and_gradients(replica_loss, args)
        return self._accumulated(replica_loss, args)

    def slice_function(
        self, replica_loss: ReplicaLoss, converted: Callable[[ReplicaLoss], ReplicaLoss]
    ) -> Callable[..., tuple]:
        """The function `context.slice_gradients` runs on each slice, the same object for the
        same `replica_loss` (so that it is traced once), which runs `converted(replica_loss)`
        (its AutoGraph conversion, made once)."""
        if replica_loss not in self._slice_functions:
            self._slice_functions[replica_loss] = functools.partial(
                self._slice_gradients, converted(replica_loss)
            )
        return self._slice_functions[replica_loss]

    def _slice_gradients(self, replica_loss: ReplicaLoss, step_rows, first_row, *args):
        """One slice's loss (divided by its own count), logs, dense gradients and that count:
        a micro-batch of the step computed elsewhere (`UpdateContext.slice_gradients`)."""
        micro_batch = micro_batches.MicroBatch(step_rows, first_row=first_row)
        with micro_batch.computing():
            loss, logs, gradients = self._loss_and_gradients(replica_loss, args)
        try:
            count = micro_batch.normalizer(1)
        except ValueError as error:
            raise ValueError(
                "parameter_server_mode='exact' sums the workers' gradients weighted by the "
                f"count each slice's loss is divided by, and: {error}"
            ) from None
        # A table's as its rows, each id once, for the transfer to the chief, which sums
        # the slices' and trains them as one replica's (`TableGradients.sent_rows`).
        gradients = self._tables.sent_rows(gradients)
        return loss, logs, gradients, tf.cast(count, tf.float32)

    def _loss_and_gradients(self, replica_loss: ReplicaLoss, args: Sequence):
        variables = self._variables()
        compiled = compilation.compiling() if self._jit_compile else contextlib.nullcontext()
        with tf.GradientTape() as tape, compiled:
            loss, logs = replica_loss(*args)
            if isinstance(self._trained, keras.Model) and self._trained.losses:
                # Every replica adds it, so each adds its 1/num_replicas share.
                loss += tf.nn.scale_regularization_loss(tf.add_n(self._trained.losses))
            # Scaling up keeps small float16 gradients from flushing to zero.
            target = loss if self._loss_scale is None else self._loss_scale.scale_loss(loss)
        gradients = tape.gradient(target, variables)
        if self._loss_scale is not None:
            gradients = self._loss_scale.unscale(gradients)
        return loss, dict(logs), gradients

    def _accumulated(self, replica_loss: ReplicaLoss, args: Sequence):
        """The loss, logs and gradients of the whole share, computed micro-batch by micro-batch.

        Each micro-batch's loss is divided by its own global count c_k; the
        share's is sum_k c_k * loss_k / sum_k c_k, and so are its gradients.
        The micro-batches are unrolled (their all-reduces cannot sit in a
        `tf.while_loop` under MirroredStrategy), and each one's input waits
        for the previous one's gradients, so that one micro-batch's
        activations are alive at a time.
        """
        steps = self._grad_accum_steps
        parts = tf.nest.flatten(args)
        batched = [isinstance(part, tf.Tensor) and part.shape.rank != 0 for part in parts]
        if not any(batched):
            raise ValueError(
                f"grad_accum_steps={steps} splits a step's examples into "
                "micro-batches along the first axis of the tensors in the Update's args, and "
                "these args hold no tensor of rank >= 1. Pass the step's batch in args, or "
                "set grad_accum_steps=1."
            )
        rows = tf.shape(parts[batched.index(True)])[0]
        context = tf.distribute.get_replica_context()
        step_rows = context.all_reduce(tf.distribute.ReduceOp.SUM, rows)
        replica_start, _ = replica_bounds(
            step_rows, context.replica_id_in_sync_group, context.num_replicas_in_sync
        )
        size = -(-rows // steps)  # ceil: the last micro-batches may be short
        total = weighted_loss = None
        summed_logs: dict[str, tf.Tensor] = {}
        weighted: list[tf.Tensor | None] = []
        for index in range(steps):
            start = tf.minimum(index * size, rows)
            stop = tf.minimum(start + size, rows)
            with tf.control_dependencies([g for g in weighted if g is not None]):
                sliced = [
                    tf.identity(part[start:stop]) if cut else part
                    for part, cut in zip(parts, batched)
                ]
            micro_batch = micro_batches.MicroBatch(step_rows, first_row=replica_start + start)
            with micro_batch.computing():
                loss, logs, gradients = self._loss_and_gradients(
                    replica_loss, tf.nest.pack_sequence_as(args, sliced)
                )
            count = tf.cast(micro_batch.normalizer(steps), tf.float32)
            scaled = [_times(g, count) for g in gradients]
            if total is None:
                total, weighted_loss, summed_logs, weighted = count, count * loss, logs, scaled
                continue
            total += count
            weighted_loss += count * loss
            summed_logs = {name: summed_logs[name] + logs[name] for name in summed_logs}
            weighted = [_plus(w, g) for w, g in zip(weighted, scaled)]
        return (
            tf.math.divide_no_nan(weighted_loss, total),
            summed_logs,
            [_divided(w, total) for w in weighted],
        )


def _times(gradient, factor):
    """A gradient (dense, a table's IndexedSlices, or None) times a scalar, sparse kept."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return table_rows.scaled(gradient, factor)
    return factor * gradient


def _divided(gradient, total):
    """A gradient divided by a count (0 where the count is 0); a table's stays sparse."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = tf.math.divide_no_nan(gradient.values, tf.cast(total, gradient.values.dtype))
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return tf.math.divide_no_nan(gradient, total)


def _plus(first, second):
    """The sum of two micro-batches' gradients of one variable; a table's stays sparse.

    None is no rows: a shard of an EmbeddingTable that one micro-batch did not look up.
    """
    if first is None or second is None:
        return second if first is None else first
    if isinstance(first, tf.IndexedSlices):
        return table_rows.concatenated(first, second)
    return first + second
