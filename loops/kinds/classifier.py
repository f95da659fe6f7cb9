"""The classifier step: supervised training of a Keras model on (image, label) batches."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops import tf_private
from loops.core import outputs, pictures, plots, reduction
from loops.core.replica_random import keyed_on
from loops.core.update import check_clip_norm
from loops.definition.eval_reduce import reduced_eval
from loops.definition.loop import Loop, RunContext
from loops.vocabulary.whole_numbers import check_whole


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

    Each evaluation also counts a confusion matrix (rows the true class,
    columns the predicted one; summed over replicas batch by batch, so any
    replica count gives the same integers) and, for image inputs, keeps the
    `worst_images` examples of highest loss over the pass (`loops.Highest`),
    with their true and predicted classes. They are drawn as TensorBoard
    images (the matrix with its counts and the class names, the worst
    classes as text), kept in `last_eval_arrays`, and the matrix is written
    into results.json; the metrics stay numbers.
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
        worst_images: int = 16,
        class_names: Sequence[str] | None = None,
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
            worst_images: how many eval images of highest loss each evaluation
                draws (inputs [n, height, width, 1, 3 or 4] only; others draw
                none); 0: none.
            class_names: the name of each class in label order (the confusion
                matrix's axes); None: the class indices.
        """
        if isinstance(loss_fn, keras.losses.Loss) and loss_fn.reduction not in (None, "none"):
            raise ValueError(
                f"loss_fn {loss_fn.name!r} has reduction={loss_fn.reduction!r}; build it "
                "with reduction=None so the loop can divide by the real global batch."
            )
        check_clip_norm(clip_norm)
        check_whole("worst_images", worst_images, least=0)
        self.worst_images = worst_images
        if class_names is not None and (
            isinstance(class_names, str)
            or not class_names
            or not all(isinstance(name, str) for name in class_names)
        ):
            raise ValueError(
                f"class_names must be a list of strings, one a class in label order, got "
                f"{class_names!r}."
            )
        self.class_names = None if class_names is None else tuple(class_names)
        # The last evaluation's arrays by output name: "confusion_matrix" [classes, classes],
        # "worst_images" [n, height, width, channels], "worst_classes" [n, (true, predicted)].
        self.last_eval_arrays: dict[str, np.ndarray] = {}
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
        outputs_known = getattr(self.model, "outputs", None)
        if outputs_known:
            self._check_class_count(outputs_known[0].shape[-1])
        self.build_one_update(self.model, self.optimizer_fn, clip_norm=self.clip_norm)
        self.loss_scale = self.update.loss_scale

    def checkpoint_items(self):
        return self.one_update_checkpoint_items()

    def results_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"data": self.data_notes} if self.data_notes else {}
        if "confusion_matrix" in self.last_eval_arrays:
            extra["confusion_matrix"] = self.last_eval_arrays["confusion_matrix"].tolist()
        return extra

    def _loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """`loss_fn`'s losses; a user's `loss_fn` keeps its Python control flow on tensors."""
        return tf_private.converted_as_the_caller_is(self.loss_fn)(labels, logits)

    def _replica_loss(self, inputs, labels):
        """This replica's share of the step's loss (the Update adds regularization)."""
        count = reduction.global_count(tf.shape(labels)[0])
        # Random layers (StatelessDropout) draw per example, keyed on the step.
        with keyed_on(step=self.global_step, global_rows=count):
            logits = self.model(inputs, training=True)
        loss = reduction.scale_to_global_batch(self._loss(labels, logits), count)
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
        losses = self._loss(labels, logits)
        counts = _correct_and_count(labels, logits)
        sums = {
            "loss": tf.reduce_sum(losses),
            "accuracy": counts["correct"],
            "num_examples": counts["num_examples"],
            # Float counts: summed over replicas like the others, exact below 2**24 a batch.
            "confusion_matrix": tf.math.confusion_matrix(
                tf.reshape(labels, [-1]),
                tf.argmax(logits, axis=-1),
                num_classes=logits.shape[-1],
                dtype=tf.float32,
            ),
        }
        if not self._draws_worst(inputs):
            return sums, None
        # This replica's worst rows only: the rest of a batch's images never cross replicas.
        classes = tf.stack(
            [tf.cast(tf.reshape(labels, [-1]), tf.int64), tf.argmax(logits, axis=-1)], axis=1
        )
        scores, (images, classes) = outputs.top_rows(losses, (inputs, classes), self.worst_images)
        # One float64 row an example, exact for its loss, classes and pixels: one
        # all-gather a batch instead of three (and the collectives refuse uint8).
        columns = [scores[:, None], classes, tf.reshape(images, [self.worst_images, -1])]
        return sums, tf.concat([tf.cast(column, tf.float64) for column in columns], axis=1)

    def _draws_worst(self, inputs) -> bool:
        shape = inputs.shape if isinstance(inputs, tf.Tensor) else tf.TensorShape(None)
        return (
            self.worst_images > 0
            and shape.rank == 4
            and shape[1:].is_fully_defined()
            and shape[-1] in (1, 3, 4)
        )

    def eval_step(self, batch):
        inputs, labels = batch
        per_replica_sums, per_replica_worst = self.strategy.run(
            self._replica_eval_step, args=(inputs, labels)
        )
        results = reduced_eval(
            self.strategy,
            per_replica_sums,
            count="num_examples",
            ratios=("loss", "accuracy"),
            totals=("confusion_matrix",),
        )
        if per_replica_worst is not None:
            rows = _gather_rows(self.strategy, per_replica_worst)
            replica_images = self.strategy.experimental_local_results(inputs)[0]
            scores, classes = rows[:, 0], tf.cast(rows[:, 1:3], tf.int64)
            images = tf.reshape(
                tf.cast(rows[:, 3:], replica_images.dtype), [-1, *replica_images.shape[1:]]
            )
            results["worst_images"] = outputs.Highest(scores, images, self.worst_images)
            results["worst_classes"] = outputs.Highest(scores, classes, self.worst_images)
        return results

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        metrics: dict[str, Any] = dict(super().run_evaluation(run))
        arrays = {name: metrics.pop(name) for name in _ARRAY_OUTPUTS if name in metrics}
        if not arrays:
            return metrics  # no eval data
        self.last_eval_arrays = arrays
        if not run.summaries.silent:  # matplotlib's drawing costs; off the chief it is not seen
            self._draw(run, arrays)
        return metrics

    def _draw(self, run: RunContext, arrays: Mapping[str, np.ndarray]) -> None:
        """The evaluation's arrays as TensorBoard images (and the worst classes as text)."""
        matrix = arrays["confusion_matrix"]
        self._check_class_count(matrix.shape[0])  # a model whose outputs build could not see
        figure = plots.confusion_matrix_figure(matrix, self.class_names)
        drawn = {"confusion_matrix": tf.io.decode_png(plots.png_bytes(figure)).numpy()}
        if "worst_images" in arrays:
            columns = math.ceil(math.sqrt(self.worst_images))
            worst = pictures.pixels_from_extremes(arrays["worst_images"])
            drawn["worst_images"] = pictures.image_grid(worst, columns)
            # A tag of its own: TensorBoard keeps one kind of summary a tag.
            classes = _classes_text(arrays["worst_classes"])
            run.summaries.text("eval", run.step, {"worst_classes": classes})
        run.summaries.images("eval", run.step, drawn)

    def _check_class_count(self, classes: int | None) -> None:
        if self.class_names and classes is not None and classes != len(self.class_names):
            raise ValueError(
                f"class_names has {len(self.class_names)} names but the model gives {classes} "
                "logits a row; pass one name a class, in label order."
            )

    def evaluates_eval_data_only(self) -> bool:
        # This class's run_evaluation is the one eval_step pass, its arrays taken out and
        # drawn; a subclass's own run_evaluation is not.
        return type(self).run_evaluation in (Loop.run_evaluation, ClassifierLoop.run_evaluation)


# The eval step's array outputs, drawn and kept apart from the metrics.
_ARRAY_OUTPUTS = ("confusion_matrix", "worst_images", "worst_classes")


def _gather_rows(strategy: tf.distribute.Strategy, per_replica) -> tf.Tensor:
    """Every replica's rows of one tensor in replica order, which is global row order.

    `strategy.gather` takes one tensor (given a tuple it returns replica 0's
    rows alone, TF 2.21) and its result's shape is unknown, so it is set again.
    """
    local = strategy.experimental_local_results(per_replica)[0]
    return tf.ensure_shape(strategy.gather(per_replica, axis=0), [None, *local.shape[1:]])


def _classes_text(classes: np.ndarray) -> str:
    """The worst images' true and predicted classes, in the grid's row-major order."""
    return "true -> predicted, row by row: " + ", ".join(
        f"{true} -> {predicted}" for true, predicted in classes.tolist()
    )


def _correct_and_count(labels, logits):
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int64)
    correct = tf.cast(tf.equal(predictions, tf.cast(labels, tf.int64)), tf.float32)
    return {
        "correct": tf.reduce_sum(correct),
        "num_examples": tf.cast(tf.size(correct), tf.float32),
    }
