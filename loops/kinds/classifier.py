"""The classifier step: supervised training of a Keras model on (image, label) batches."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf

from loops.core import outputs, reduction
from loops.core.replica_random import keyed_on
from loops.core.update import Update, check_clip_norm
from loops.run.loop import Loop


def sparse_softmax_cross_entropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-example cross entropy of integer labels against logits."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int32), logits=tf.cast(logits, tf.float32)
    )


class ClassifierLoop(Loop):
    """Trains a classifier whose model maps a batch of inputs to logits.

    The loss a replica differentiates is the sum of its per-example losses
    divided by the real number of examples in the step across all replicas,
    plus the model's regularization losses scaled by the replica count, so any
    replica count gives the single-device gradient. A step whose loss or
    gradients are not finite on any replica reports `nonfinite` = 1; the
    run's `on_nonfinite` policy decides what follows (`Loop.apply_update`).

    With `mixed_precision` the model is built under that Keras dtype policy
    (float16 or bfloat16 compute, float32 variables). Under "mixed_float16"
    the loss is multiplied by a dynamic loss scale before differentiating and
    the gradients divided by it; the scale halves after a step that is not
    finite on any replica and doubles after `loss_scale_growth_steps` finite
    ones. A step skipped only because the scaled gradients overflowed is
    logged as `overflow`, not `nonfinite`, so it never stops the run; the
    scale used is logged as `loss_scale` and checkpointed.
    """

    name = "classifier"
    supports_parameter_server = True

    def __init__(
        self,
        *,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        loss_fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor] = sparse_softmax_cross_entropy,
        clip_norm: float | None = None,
        data_notes: Mapping[str, Any] | None = None,
    ):
        """
        Args:
            model_fn: builds the model (called in the strategy's scope); it must
                have its weights created, e.g. by starting with `keras.Input`.
            optimizer_fn: builds the optimizer (called in the strategy's scope).
            loss_fn: (labels, logits) -> one loss per example. A Keras `Loss`
                must use reduction=None.
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            data_notes: what the data left out or holds (e.g. the image files it
                skipped), recorded in results.json under "data".
        """
        if isinstance(loss_fn, keras.losses.Loss) and loss_fn.reduction not in (None, "none"):
            raise ValueError(
                f"loss_fn {loss_fn.name!r} has reduction={loss_fn.reduction!r}; build it "
                "with reduction=None so the loop can divide by the real global batch."
            )
        check_clip_norm(clip_norm)
        self.model_fn = model_fn
        self.optimizer_fn = optimizer_fn
        self.loss_fn = loss_fn
        self.clip_norm = clip_norm
        self.data_notes = dict(data_notes or {})

    def build(self) -> None:
        self.model = self.model_fn()
        if not self.model.built or not self.model.trainable_variables:
            raise ValueError(
                "model_fn returned a model without weights; start it with "
                "keras.Input(shape) so its weights exist before training."
            )
        self.optimizer = self.optimizer_fn()
        # Built here, in scope: built lazily inside strategy.run it fails (BUILD.md fact 1).
        self.optimizer.build(self.model.trainable_variables)
        self.update = Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)
        self.loss_scale = self.update.loss_scale

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def results_extra(self) -> dict[str, Any]:
        return {"data": self.data_notes} if self.data_notes else {}

    def _replica_loss(self, inputs, labels):
        """This replica's share of the step's loss (the Update adds regularization)."""
        count = reduction.global_count(tf.shape(labels)[0])
        # Random layers (StatelessDropout) draw per example, keyed on the step.
        with keyed_on(step=self.global_step, global_rows=count):
            logits = self.model(inputs, training=True)
        loss = reduction.scale_to_global_batch(self.loss_fn(labels, logits), count)
        return loss, _correct_and_count(labels, logits)

    def train_step(self, iterator):
        # Read before the update: the rate this step uses (a schedule moves with iterations).
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        result = self.update(self._replica_loss, args=next(iterator))
        count = result.sums["num_examples"]
        return {
            "loss": outputs.Mean(result.sums["loss"], weight=count),
            "accuracy": outputs.Mean(
                tf.math.divide_no_nan(result.sums["correct"], count), weight=count
            ),
            "num_examples": outputs.Sum(tf.cast(count, tf.int64)),
            "learning_rate": outputs.Last(learning_rate),
            **result.outputs,
        }

    def _replica_eval_step(self, inputs, labels):
        logits = self.model(inputs, training=False)
        loss_sum = tf.reduce_sum(self.loss_fn(labels, logits))
        counts = _correct_and_count(labels, logits)
        return {
            "loss": loss_sum,
            "accuracy": counts["correct"],
            "num_examples": counts["num_examples"],
        }

    def eval_step(self, batch):
        inputs, labels = batch
        sums = reduction.sum_over_replicas(
            self.strategy, self.strategy.run(self._replica_eval_step, args=(inputs, labels))
        )
        count = sums["num_examples"]
        return {
            "loss": outputs.Ratio(sums["loss"], count),
            "accuracy": outputs.Ratio(sums["accuracy"], count),
            "num_examples": outputs.Sum(tf.cast(count, tf.int64)),
        }


def _correct_and_count(labels, logits):
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int64)
    correct = tf.cast(tf.equal(predictions, tf.cast(labels, tf.int64)), tf.float32)
    return {
        "correct": tf.reduce_sum(correct),
        "num_examples": tf.cast(tf.size(correct), tf.float32),
    }
