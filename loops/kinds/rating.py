"""The rating or click step: one score a (user, item) pair, squared error (RMSE) for ratings or
log loss (and AUC) for clicks, normalized by the global count of pairs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops.core import reduction
from loops.core.update import check_clip_norm
from loops.definition.eval_reduce import reduced_eval
from loops.definition.loop import Loop, RunContext
from loops.definition.one_update import one_update_train_step
from loops.vocabulary.whole_numbers import check_whole

TASKS = ("rating", "click")


def area_under_curve(positives: np.ndarray, negatives: np.ndarray) -> float:
    """ROC AUC from histograms of the positives' and the negatives' scores over the same bins
    (ascending): the chance a positive scores above a negative, a tie in a bin counting half."""
    positives, negatives = (np.asarray(h, np.float64) for h in (positives, negatives))
    pairs = positives.sum() * negatives.sum()
    if pairs == 0:
        return math.nan
    below = np.cumsum(negatives) - negatives  # negatives in lower bins
    return float(np.sum(positives * (below + 0.5 * negatives)) / pairs)


def _scores_and_penalties(outputs) -> tuple[tf.Tensor, tf.Tensor]:
    """A model's scores [pairs] and per-pair penalties (0 for a model that gives scores alone)."""
    if isinstance(outputs, list | tuple):
        scores, penalties = outputs
    else:
        scores, penalties = outputs, tf.zeros([])
    return tf.cast(tf.reshape(scores, [-1]), tf.float32), tf.cast(penalties, tf.float32)


class RatingLoop(Loop):
    """Trains a model of (user ids, item ids) -> one score a pair on (users, items, targets).

    The model may give (scores, penalties) instead: a regularization term of
    each pair (e.g. L2 on the rows it looked up) added to the pair's training
    loss, not to its eval metrics.

    task "rating": the score is the rating, the loss its squared error, and
    evaluation reports `rmse` over the eval pairs. task "click": the score is
    a logit, targets are 0 or 1, the loss is the log loss, and evaluation
    reports `log_loss` and `auc`. A replica sums its pairs' losses and
    divides by the pairs of the whole step (all replicas), so any replica
    count gives the single-device gradient. The AUC is counted from
    histograms of the predicted probability in `auc_bins` equal bins, one for
    positives and one for negatives, summed over replicas as integers:
    exact on any replica count; it differs from the AUC of the raw scores
    only by pairs of a positive and a negative that fall in one bin (counted
    as ties). `baselines` (e.g. the bias baseline's RMSE) are reported beside.
    """

    name = "rating"
    throughput_unit = ("pairs", "pairs")
    supports_parameter_server = True  # its steps are sums over pairs, by loops.Update

    def __init__(
        self,
        *,
        model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        table_optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        task: str = "rating",
        num_items: int | None = None,
        clip_norm: float | None = None,
        auc_bins: int = 10_000,
        baselines: Mapping[str, float] | None = None,
        data_notes: Mapping[str, Any] | None = None,
    ):
        """
        Args:
            model_fn: builds the model (in scope): (users [batch], items [batch]) int32 ->
                float scores [batch]; e.g. loops_models.recommender.rating_model.
            optimizer_fn: builds the optimizer (in scope).
            table_optimizer_fn: builds the optimizer of the embedding tables (e.g.
                keras.optimizers.Adagrad: a sparse, exact row update, `loops.Update`);
                None: optimizer_fn's trains them too.
            task: "rating" (squared error, RMSE) or "click" (log loss, AUC).
            num_items: the items of the corpus (ids 0..num_items - 1), which
                `score_all_items` scores; None: it is not used.
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            auc_bins: the histograms' bins of the click probability (task "click").
            baselines: metric name -> value, reported with each evaluation.
            data_notes: what the data is (its split, its sizes), in results.json under "data".

        Raises:
            ValueError: a bad argument, with the fix.
        """
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
        check_clip_norm(clip_norm)
        check_whole("auc_bins", auc_bins)
        if num_items is not None:
            check_whole("num_items", num_items)
        self.num_items = num_items
        self.model_fn, self.optimizer_fn = model_fn, optimizer_fn
        self.table_optimizer_fn = table_optimizer_fn
        self.task = task
        self.clip_norm = clip_norm
        self.auc_bins = auc_bins
        self.baselines = {name: float(value) for name, value in (baselines or {}).items()}
        self.data_notes = dict(data_notes or {})

    def build(self) -> None:
        self.build_one_update(
            self.model_fn(),
            self.optimizer_fn,
            clip_norm=self.clip_norm,
            table_optimizer_fn=self.table_optimizer_fn,
        )

    def checkpoint_items(self):
        return self.one_update_checkpoint_items()

    def pair_losses(self, scores: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        """Each pair's loss: squared error (rating) or log loss of the logit (click)."""
        scores, targets = tf.cast(scores, tf.float32), tf.cast(targets, tf.float32)
        if self.task == "rating":
            return tf.square(scores - targets)
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=scores)

    def score_pairs(self, users: tf.Tensor, items: tf.Tensor) -> tf.Tensor:
        """float32 [pairs]: the model's score of each (user, item) pair."""
        return _scores_and_penalties(self.model([users, items], training=False))[0]

    def score_all_items(self, users: tf.Tensor) -> tf.Tensor:
        """float32 [users, num_items]: each user's score of every item, pair by pair."""
        num_items = self.num_items
        if num_items is None:
            raise ValueError(
                "score_all_items scores every item of the corpus; build the RatingLoop with "
                "num_items=<the items' count>."
            )
        rows = tf.shape(users)[0]
        pair_users = tf.repeat(users, num_items)
        pair_items = tf.tile(tf.range(num_items, dtype=users.dtype), [rows])
        return tf.reshape(self.score_pairs(pair_users, pair_items), [rows, num_items])

    def _replica_loss(self, users, items, targets):
        count = reduction.global_count(tf.shape(users)[0])
        scores, penalties = _scores_and_penalties(self.model([users, items], training=True))
        losses = self.pair_losses(scores, targets) + penalties
        loss = reduction.scale_to_global_batch(losses, count)
        return loss, {"pairs": tf.cast(tf.shape(users)[0], tf.float32)}

    def train_step(self, iterator):
        return one_update_train_step(
            self, self._replica_loss, iterator, count="pairs", reported_as="pairs"
        )

    def _replica_eval_sums(self, users, items, targets):
        scores = self.score_pairs(users, items)
        sums = {
            "loss": tf.reduce_sum(self.pair_losses(scores, targets)),
            "pairs": tf.cast(tf.shape(users)[0], tf.float32),
        }
        if self.task == "click":
            bins = tf.cast(tf.sigmoid(scores) * self.auc_bins, tf.int32)
            bins = tf.clip_by_value(bins, 0, self.auc_bins - 1)
            positive = tf.cast(targets, tf.float32) > 0.5
            for name, rows in (("positives", positive), ("negatives", ~positive)):
                # Float counts: summed over replicas, exact below 2**24 a bin and batch.
                sums[name] = tf.math.unsorted_segment_sum(
                    tf.cast(rows, tf.float32), bins, self.auc_bins
                )
        return sums

    def eval_step(self, batch):
        replica_sums = self.strategy.run(self._replica_eval_sums, args=batch)
        name = "mse" if self.task == "rating" else "log_loss"
        return reduced_eval(
            self.strategy,
            replica_sums,
            count="pairs",
            ratios={name: "loss"},
            totals=("positives", "negatives"),  # the click task's AUC histograms
        )

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        metrics: dict[str, Any] = dict(super().run_evaluation(run))
        if "mse" in metrics:
            metrics["rmse"] = math.sqrt(metrics["mse"])
        if "positives" in metrics:
            positives, negatives = metrics.pop("positives"), metrics.pop("negatives")
            metrics["auc"] = area_under_curve(positives, negatives)
        # The baselines beside the model's figures; no eval data, no figures.
        return {**metrics, **self.baselines} if metrics else metrics

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        names = run.eval_step_output_names()
        if names is None:
            return None
        added = {"rmse"} if "mse" in names else set()
        if "positives" in names:
            names = (names - {"positives", "negatives"}) | {"auc"}
        return names | added | set(self.baselines)

    def evaluates_eval_data_only(self) -> bool:
        # run_evaluation only turns the one eval_step pass's sums into metrics.
        return True

    def results_extra(self) -> dict[str, Any]:
        return {"data": self.data_notes} if self.data_notes else {}
