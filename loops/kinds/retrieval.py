"""The two-tower retrieval step: an in-batch softmax over the whole global batch's items,
corrected for how often each item is sampled, or the full softmax over every item of the
catalogue; evaluated by top-K over the whole corpus."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops.core import reduction
from loops.core.update import check_clip_norm
from loops.definition.eval_reduce import reduced_eval
from loops.definition.loop import Loop, RunContext
from loops.definition.one_update import one_update_train_step
from loops.kinds.library import ranking_metrics, retrieval_loss
from loops.vocabulary.whole_numbers import check_whole, is_whole

NEGATIVES = ("in_batch", "catalogue")


def ranking_sums_at(
    scores: tf.Tensor, seen: tf.Tensor, held_out: tf.Tensor, ks: Sequence[int]
) -> dict[str, tf.Tensor]:
    """`loops.kinds.library.ranking_metrics.ranking_sums` at each cut-off, by name (float64 sums).

    Args:
        scores: [rows, num_items], one score an item of the corpus.
        seen: int [rows, n] the items each row saw in training (-1 pads): never ranked.
        held_out: int [rows, m] the items to find (-1 pads).
        ks: the cut-offs.

    Returns:
        "users" (rows with a held-out item not seen), and for each k "recall_at_k" and
        "ndcg_at_k", summed over those rows.
    """
    num_items = scores.shape[-1]
    exclude = ranking_metrics.items_mask(seen, num_items)
    relevant = ranking_metrics.items_mask(held_out, num_items)
    sums = {}
    for k in ks:
        at_k = ranking_metrics.ranking_sums(scores, relevant, k=k, exclude=exclude)
        sums[f"recall_at_{k}"], sums[f"ndcg_at_{k}"] = at_k.recall, at_k.ndcg
        sums["users"] = at_k.users
    return sums


class RetrievalLoop(Loop):
    """Trains a user tower and an item tower so that a user's embedding scores its items highest.

    A train batch is (users, items) int32, one interaction a row. Each replica
    scores its users against the items of the WHOLE global batch
    (`loops.gather_global_rows`), so the negatives are the same on any replica
    count (the in-batch negatives of one replica alone would make N replicas
    learn from N times fewer). Each logit is the dot product over
    `temperature`, minus log q(item), q the item's share of the training
    interactions (`item_frequencies`): an in-batch softmax samples popular
    items as negatives more often, and the correction makes it estimate the
    full softmax. A candidate that is the row's own item at another row (an
    accidental hit) is left out. With `negatives="catalogue"` each row's
    softmax is over every item of the corpus instead (the item tower run on
    all `num_items` ids each step: no sampling, no correction; for a catalogue
    that fits). The loss is the mean over the global batch's rows. Under
    `--strategy=parameter_server` (exact mode) one worker computes each
    in-batch step whole, since every row's negatives are the whole batch.

    An eval batch is (users, seen, held_out): each user's training items and
    the items to find, int [rows, n] padded with -1. The user is scored
    against every item of the corpus, its training items left out, and
    Recall@K and NDCG@K of the top K are summed over users with a held-out
    item and divided by their count: exact on any replica count.
    `baselines` (e.g. popularity's recall) are reported beside them.
    """

    name = "retrieval"
    throughput_unit = ("interactions", "interactions")
    supports_parameter_server = True  # exact mode: one worker computes the whole step

    def __init__(
        self,
        *,
        user_model_fn: Callable[[], keras.Model],
        item_model_fn: Callable[[], keras.Model],
        optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        table_optimizer_fn: Callable[[], keras.optimizers.Optimizer] | None = None,
        num_items: int,
        global_batch_size: int,
        item_frequencies: np.ndarray | None = None,
        temperature: float = 0.1,
        negatives: str = "in_batch",
        l2: float = 0.0,
        top_k: Sequence[int] = (10,),
        clip_norm: float | None = None,
        baselines: Mapping[str, float] | None = None,
        data_notes: Mapping[str, Any] | None = None,
    ):
        """
        Args:
            user_model_fn: builds the user tower (in scope): int32 ids [batch] -> [batch, dim].
            item_model_fn: builds the item tower: int32 ids [batch] -> [batch, dim].
            optimizer_fn: builds the optimizer (in scope).
            table_optimizer_fn: builds the optimizer of the embedding tables (e.g.
                keras.optimizers.Adagrad: a sparse, exact row update, `loops.Update`);
                None: optimizer_fn's trains them too.
            num_items: the items of the corpus (ids 0..num_items - 1).
            global_batch_size: the most rows a train batch holds (>= 2: the other rows
                are each row's negatives).
            item_frequencies: [num_items] how often each item occurs in training
                (counts); None: no sampling correction.
            temperature: the dot products are divided by it (> 0).
            negatives: "in_batch" (the global batch's other items, logQ-corrected) or
                "catalogue" (every item of the corpus, the full softmax).
            l2: each row's loss adds l2 times the squared lengths of its user's and its
                item's embeddings (the towers' outputs; a constant for unit-length towers).
            top_k: the cut-offs of the eval metrics (each in 1..num_items).
            clip_norm: clip the summed gradient to this global norm; None: no clip.
            baselines: metric name -> value, reported with each evaluation.
            data_notes: what the data is (its split, its sizes), in results.json under "data".

        Raises:
            ValueError: a bad argument, with the fix.
        """
        check_whole("num_items", num_items)
        # One example a batch has no other row to be its negative: the loss is 0 at every step.
        check_whole(
            "global_batch_size",
            global_batch_size,
            2,
            " (retrieval needs at least 2 examples a batch for in-batch negatives)",
        )
        check_clip_norm(clip_norm)
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {NEGATIVES}, got {negatives!r}.")
        if not (isinstance(l2, int | float) and math.isfinite(l2) and l2 >= 0):
            raise ValueError(f"l2 must be a number >= 0, e.g. 0.01; got {l2!r}.")
        if not (isinstance(temperature, int | float) and math.isfinite(temperature)) or not (
            temperature > 0
        ):
            raise ValueError(f"temperature must be a number > 0, e.g. 0.1; got {temperature!r}.")
        self.top_k = _checked_top_k(top_k, num_items)
        self.log_q = _log_sampling_probabilities(item_frequencies, num_items)
        self.user_model_fn, self.item_model_fn = user_model_fn, item_model_fn
        self.optimizer_fn = optimizer_fn
        self.table_optimizer_fn = table_optimizer_fn
        self.num_items = num_items
        self.global_batch_size = global_batch_size
        self.temperature = float(temperature)
        self.negatives = negatives
        self.l2 = float(l2)
        self.clip_norm = clip_norm
        self.baselines = {name: float(value) for name, value in (baselines or {}).items()}
        self.data_notes = dict(data_notes or {})

    def build(self) -> None:
        self.user_model, self.item_model = self.user_model_fn(), self.item_model_fn()
        # Names of their own: a tower's layers may be called "users" or "items".
        users = keras.Input((), dtype="int32", name="retrieval_user_ids")
        items = keras.Input((), dtype="int32", name="retrieval_item_ids")
        # One model holding both towers: one checkpoint entry, one Update, one export.
        two_towers = keras.Model(
            [users, items], [self.user_model(users), self.item_model(items)], name="two_towers"
        )
        self.build_one_update(
            two_towers,
            self.optimizer_fn,
            clip_norm=self.clip_norm,
            table_optimizer_fn=self.table_optimizer_fn,
            whole_batch_loss=self.negatives == "in_batch",
        )

    def checkpoint_items(self):
        return self.one_update_checkpoint_items()

    def replica_losses(self, users, items):
        """Each of this replica's rows' softmax loss over the global batch's items (or every
        item of the catalogue), plus its embeddings' l2 penalty [rows]."""
        queries = self.user_model(users, training=True)
        candidates = self.item_model(items, training=True)
        if self.negatives == "catalogue":
            losses = retrieval_loss.catalogue_softmax(
                queries,
                self.item_model(tf.range(self.num_items), training=True),
                items,
                temperature=self.temperature,
            )
        else:
            losses = retrieval_loss.in_batch_softmax(
                queries,
                candidates,
                items,
                global_batch_size=self.global_batch_size,
                log_q=None if self.log_q is None else tf.gather(self.log_q, items),
                temperature=self.temperature,
            )
        if not self.l2:
            return losses
        squares = tf.reduce_sum(tf.square(tf.cast(queries, tf.float32)), axis=1) + tf.reduce_sum(
            tf.square(tf.cast(candidates, tf.float32)), axis=1
        )
        return losses + self.l2 * squares

    def _replica_loss(self, users, items):
        count = reduction.global_count(tf.shape(users)[0])
        losses = self.replica_losses(users, items)
        rows = tf.cast(tf.shape(users)[0], tf.float32)
        return reduction.scale_to_global_batch(losses, count), {"rows": rows}

    def train_step(self, iterator):
        return one_update_train_step(
            self, self._replica_loss, iterator, count="rows", reported_as="interactions"
        )

    def score_all_items(self, users: tf.Tensor) -> tf.Tensor:
        """float32 [users, num_items]: each user's score of every item of the corpus."""
        user_vectors = tf.cast(self.user_model(users, training=False), tf.float32)
        item_vectors = tf.cast(
            self.item_model(tf.range(self.num_items), training=False), tf.float32
        )
        return tf.matmul(user_vectors, item_vectors, transpose_b=True) / self.temperature

    def score_pairs(self, users: tf.Tensor, items: tf.Tensor) -> tf.Tensor:
        """float32 [pairs]: each (user, item) pair's score, as `score_all_items` gives it."""
        user_vectors = tf.cast(self.user_model(users, training=False), tf.float32)
        item_vectors = tf.cast(self.item_model(items, training=False), tf.float32)
        return tf.reduce_sum(user_vectors * item_vectors, axis=1) / self.temperature

    def _replica_eval_sums(self, users, seen, held_out):
        return ranking_sums_at(self.score_all_items(users), seen, held_out, self.top_k)

    def eval_step(self, batch):
        replica_sums = self.strategy.run(self._replica_eval_sums, args=batch)
        return reduced_eval(self.strategy, replica_sums, count="users")

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        metrics = dict(super().run_evaluation(run))
        # The baselines beside the model's figures; no eval data, no figures.
        return {**metrics, **self.baselines} if metrics else metrics

    def eval_metric_names(self, run: RunContext) -> set[str] | None:
        names = run.eval_step_output_names()
        return None if names is None else names | set(self.baselines)

    def evaluates_eval_data_only(self) -> bool:
        # run_evaluation is the one eval_step pass, the baselines added beside.
        return True

    def results_extra(self) -> dict[str, Any]:
        return {"data": self.data_notes} if self.data_notes else {}


def _checked_top_k(top_k: Sequence[int], num_items: int) -> tuple[int, ...]:
    if is_whole(top_k) or not top_k:
        raise ValueError(f"top_k must be a list of cut-offs, e.g. (10,); got {top_k!r}.")
    for k in top_k:
        check_whole("top_k", k, note=" (each cut-off)")
        if k > num_items:
            raise ValueError(
                f"top_k holds {k}, more than the {num_items} items of the corpus; pass "
                f"cut-offs <= {num_items}."
            )
    return tuple(sorted(set(top_k)))


def _log_sampling_probabilities(frequencies, num_items: int) -> tf.Tensor | None:
    """log q(item) as a table (`retrieval_loss.item_log_probabilities`), checked."""
    if frequencies is None:
        return None
    counts = np.asarray(frequencies)
    if counts.shape != (num_items,):
        raise ValueError(
            f"item_frequencies must hold one count an item ({num_items} numbers), got shape "
            f"{counts.shape}; pass np.bincount(train_items, minlength=num_items)."
        )
    return tf.constant(retrieval_loss.item_log_probabilities(counts))
