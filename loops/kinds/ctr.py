"""The click-through step: a model of a dict of feature columns -> one logit an example, log loss,
and an exact AUC and calibration over the eval examples."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops.core import outputs, reduction
from loops.core.global_rows import gather_global_rows
from loops.core.update import check_clip_norm
from loops.definition.eval_reduce import reduced_eval
from loops.definition.loop import Loop, RunContext
from loops.definition.one_update import one_update_train_step
from loops.kinds.library import ranking_metrics
from loops.vocabulary.whole_numbers import check_whole

# The eval step's output holding every example's (logit, label), turned into the AUC.
_SCORED = "scored"
_SUMS = ("log_loss", "accuracy", "mean_prediction", "positive_rate")


def example_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Each example's log loss: sigmoid cross-entropy of its logit against its 0/1 label."""
    return tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.float32), logits=tf.cast(logits, tf.float32)
    )


class CTRLoop(Loop):
    """Trains a click-through model on (features, labels) batches: binary labels, log loss.

    `features` is a dict of column name -> tensor with one row an example (the
    model's inputs, e.g. `loops_models.ctr.dlrm`), `labels` 0 or 1, and the
    model gives one logit an example. A replica sums its examples' log losses
    and divides by the examples of the whole step (all replicas), so any
    replica count gives the single-device gradient.

    Evaluation reports `log_loss`, `accuracy` (the logit's sign against the
    label), `mean_prediction` (the mean click probability), `positive_rate`
    (the share of clicks), their ratio `calibration` (1 is calibrated) and
    `auc`: exact, from every eval example's logit and label gathered over
    replicas (`loops.kinds.library.ranking_metrics.auc`, ties one half), so equal on any
    replica count and to scikit-learn's `roc_auc_score` on the same logits.
    The gathered pairs are kept in `last_eval_scores`; an evaluation of more
    than `auc_examples` examples is refused (raise it, at 8 bytes an example).
    On several synchronous workers every worker gathers every replica's pairs
    (give `eval_batch_size`), so each computes the same AUC. Under parameter
    servers it trains in both modes (its step is one `loops.Update` of a sum over
    examples) and the chief evaluates. A multi-hot column may come ragged (a
    `tf.RaggedTensor` of each bag's ids): the model gets it padded with
    `BAG_PADDING` (`padded_bags`).
    """

    name = "ctr"
    throughput_unit = ("examples", "examples")
    supports_parameter_server = True  # its steps are sums over examples, by loops.Update

    def __init__(
        self,
        *,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        table_optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        clip_norm: float | None = None,
        auc_examples: int = 1 << 16,
        eval_batch_size: int | None = None,
        data_notes: Mapping[str, Any] | None = None,
    ):
        """
        Args:
            model_fn: builds the model (in scope): dict of feature tensors -> logits [batch]
                (or [batch, 1]); e.g. loops_models.ctr.wide_and_deep.
            optimizer_fn: builds the optimizer (in scope), e.g. keras.optimizers.Adam.
            table_optimizer_fn: builds the optimizer of the model's `keras.layers.Embedding`
                tables (e.g. keras.optimizers.Adagrad: a sparse, exact row update); None:
                optimizer_fn's trains them too.
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            auc_examples: the most eval examples one evaluation holds (the AUC keeps them all).
            eval_batch_size: the most examples an eval batch holds over all replicas. On
                several workers each replica sums its (logit, label) rows into a tensor of
                this many rows over all workers (a collective's shape is fixed), so every
                worker holds them all for the exact AUC; needed there, unused in one process.
            data_notes: what the data is (its split, its sizes), in results.json under "data".

        Raises:
            ValueError: a bad argument, with the fix.
        """
        check_clip_norm(clip_norm)
        check_whole("auc_examples", auc_examples, note=" (the most eval examples an evaluation)")
        self.model_fn, self.optimizer_fn = model_fn, optimizer_fn
        self.table_optimizer_fn = table_optimizer_fn
        self.clip_norm = clip_norm
        self.auc_examples = auc_examples
        if eval_batch_size is not None:
            check_whole("eval_batch_size", eval_batch_size, note=" (the eval global batch size)")
        self.eval_batch_size = eval_batch_size
        self._rows_over_workers = False  # several synchronous workers: set by build
        self.data_notes = dict(data_notes or {})
        # The last evaluation's (logit, label) of each example, float32 [examples, 2].
        self.last_eval_scores = np.zeros([0, 2], np.float32)

    def build(self) -> None:
        placement = self.placement
        # Synchronous workers each evaluate their replicas' share; under parameter servers
        # the chief evaluates alone.
        self._rows_over_workers = not placement.variables_on_servers and placement.num_workers > 1
        if self._rows_over_workers and self.eval_batch_size is None:
            raise ValueError(
                "CTRLoop's exact AUC needs every eval row on the worker that computes it, and "
                f"this run's replicas are on {placement.num_workers} workers; pass "
                "eval_batch_size= (the eval data's global batch size) so each worker gathers "
                "every replica's rows, or evaluate on one worker."
            )
        self.build_one_update(
            self.model_fn(),
            self.optimizer_fn,
            clip_norm=self.clip_norm,
            table_optimizer_fn=self.table_optimizer_fn,
        )

    def checkpoint_items(self):
        return self.one_update_checkpoint_items()

    def logits(self, features: Mapping[str, tf.Tensor], *, training: bool = False) -> tf.Tensor:
        """float32 [examples]: the model's logit of each example; a ragged column given to the
        model padded (`padded_bags`)."""
        logits = self.model(padded_bags(features), training=training)
        return tf.cast(tf.reshape(logits, [-1]), tf.float32)

    def _replica_loss(self, features, labels):
        count = reduction.global_count(tf.shape(labels)[0])
        losses = example_losses(self.logits(features, training=True), tf.reshape(labels, [-1]))
        loss = reduction.scale_to_global_batch(losses, count)
        return loss, {"examples": tf.cast(tf.shape(labels)[0], tf.float32)}

    def train_step(self, iterator):
        return one_update_train_step(
            self, self._replica_loss, iterator, count="examples", reported_as="examples"
        )

    def _replica_eval(self, features, labels):
        labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
        logits = self.logits(features)
        positive = labels > 0.5
        sums = {
            "log_loss": tf.reduce_sum(example_losses(logits, labels)),
            "accuracy": tf.reduce_sum(tf.cast(tf.equal(logits > 0, positive), tf.float32)),
            "mean_prediction": tf.reduce_sum(tf.sigmoid(logits)),
            "positive_rate": tf.reduce_sum(tf.cast(positive, tf.float32)),
            "examples": tf.cast(tf.shape(labels)[0], tf.float32),
        }
        scored = tf.stack([logits, labels], axis=1)
        if self._rows_over_workers:
            assert self.eval_batch_size is not None  # build refused it
            scored = gather_global_rows(scored, global_batch_size=self.eval_batch_size)
        return sums, scored

    def eval_step(self, batch):
        replica_sums, replica_scored = self.strategy.run(self._replica_eval, args=batch)
        results = reduced_eval(self.strategy, replica_sums, count="examples", ratios=_SUMS)
        # Every row in global order; equal scores keep the earlier rows, so the pass keeps all.
        if self._rows_over_workers:  # every replica holds every row (`_replica_eval`)
            scored = self.strategy.experimental_local_results(replica_scored)[0]
        else:
            scored = _local_rows(self.strategy, replica_scored)
        results[_SCORED] = outputs.Highest(
            tf.zeros([tf.shape(scored)[0]]), scored, self.auc_examples
        )
        return results

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        metrics: dict[str, Any] = dict(super().run_evaluation(run))
        if not metrics:
            return metrics  # no eval data
        scored = np.asarray(metrics.pop(_SCORED), np.float32).reshape(-1, 2)
        if metrics["examples"] > self.auc_examples:
            raise ValueError(
                f"The evaluation held {metrics['examples']} examples, more than "
                f"auc_examples={self.auc_examples} that the exact AUC keeps; build the CTRLoop "
                f"with auc_examples >= {metrics['examples']} or evaluate on fewer examples."
            )
        self.last_eval_scores = scored
        metrics["auc"] = ranking_metrics.auc(scored[:, 0], scored[:, 1])
        metrics["calibration"] = (
            metrics["mean_prediction"] / metrics["positive_rate"]
            if metrics["positive_rate"] > 0
            else float("nan")
        )
        return metrics

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        names = run.eval_step_output_names()
        if names is None:
            return None
        return (names - {_SCORED}) | {"auc", "calibration"}

    def evaluates_eval_data_only(self) -> bool:
        # run_evaluation only turns the one eval_step pass's outputs into metrics.
        return True

    def results_extra(self) -> dict[str, Any]:
        return {"data": self.data_notes} if self.data_notes else {}


# What a ragged column's rows are padded with: the models' padding id (loops_models.ctr.PAD_ID).
BAG_PADDING = -1


def padded_bags(features: Mapping[str, Any]) -> dict[str, Any]:
    """`features` with each ragged column (a `tf.RaggedTensor` of bags of ids) as a dense
    [examples, longest] tensor padded with `BAG_PADDING`, the form the models read; an empty
    bag is all padding. Each replica pads to its own examples' longest bag."""
    return {
        name: column.to_tensor(default_value=BAG_PADDING)
        if isinstance(column, tf.RaggedTensor)
        else column
        for name, column in features.items()
    }


def _local_rows(strategy: tf.distribute.Strategy, per_replica) -> tf.Tensor:
    """Every replica's rows in replica order (global row order), concatenated.

    Not `strategy.gather`: its collective needs equal shapes on every replica,
    and a partial batch gives replicas different row counts (or none).

    Raises:
        ValueError: replicas on other workers, whose rows this cannot reach.
    """
    local = strategy.experimental_local_results(per_replica)
    if len(local) != strategy.num_replicas_in_sync:
        raise ValueError(
            f"CTRLoop's exact AUC gathers the eval rows of this worker's replicas, and "
            f"{strategy.num_replicas_in_sync - len(local)} replicas are on other workers; "
            "evaluate on one worker (e.g. an evaluator task, loops.evaluate_checkpoints)."
        )
    return tf.concat(list(local), axis=0)
