"""The two-tower retrieval losses: a sampled softmax whose negatives are every other row of the
WHOLE global batch, corrected for how often each item is sampled (logQ), accidental hits
removed; or, for a catalogue that fits, the full softmax over every item (`catalogue_softmax`).

Each replica scores its own queries against the candidate (item) embeddings
of every replica, gathered in global row order by `loops.gather_global_rows`,
so the loss is that of the whole global batch on one device on any replica
count, replicas left empty by a partial final batch included (per-replica
in-batch negatives, as TF Recommenders gives under a strategy, see fewer
negatives the more replicas there are: tensorflow/recommenders#710). A
popular item turns up as an in-batch negative more often than a rare one; subtracting
log q(item), its sampling probability, from every candidate's logit (Yi et al.
2019, "Sampling-bias-corrected neural modeling") makes the sampled softmax
estimate the full one. A candidate that is the row's own item in another row
(an accidental hit) is no negative and is left out. Call in replica context,
e.g. in the loss function of a `loops.Update(..., whole_batch_loss=True)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from loops.core.global_rows import gather_global_rows, global_row_offset
from loops.core.reduction import global_count, scale_to_global_batch


def item_log_probabilities(item_counts: np.ndarray) -> np.ndarray:
    """log q(item): the log of each item's share of the training rows, float32 [num_items].

    The probability that a row drawn from the training log names the item:
    the sampling probability of an in-batch candidate. An item with no rows
    is never a candidate; its entry is log(0.5 / total) so it stays finite.
    """
    counts = np.asarray(item_counts, np.float64)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 0) or counts.sum() <= 0:
        raise ValueError(
            "item_counts must be a non-empty vector of counts >= 0 with a positive sum (one "
            f"count an item, e.g. Interactions.item_counts()), got shape {counts.shape} and "
            f"sum {counts.sum() if counts.size else 0}."
        )
    return np.log(np.maximum(counts, 0.5) / counts.sum()).astype(np.float32)


def in_batch_softmax(
    queries: tf.Tensor,
    candidates: tf.Tensor,
    item_ids: tf.Tensor,
    *,
    global_batch_size: int,
    log_q: tf.Tensor | None = None,
    temperature: float = 1.0,
    remove_accidental_hits: bool = True,
) -> tf.Tensor:
    """The loss of each of this replica's rows against the whole global batch's candidates.

    Row i's logits are its query's dot products with every row's candidate
    embedding, divided by `temperature`, minus each candidate's `log_q`; its
    positive is its own candidate; its loss logsumexp(logits) - positive logit.

    Args:
        queries: this replica's query (user) embeddings, [rows, dim].
        candidates: this replica's positive candidate (item) embeddings, [rows, dim].
        item_ids: this replica's positive item ids, [rows] integers (to find
            accidental hits).
        global_batch_size: the most rows a step's global batch holds.
        log_q: [rows] log sampling probability of each row's item
            (`item_log_probabilities(counts)` gathered at `item_ids`); None: no correction.
        temperature: > 0; the logits are divided by it.
        remove_accidental_hits: leave out another row's candidate whose item is
            this row's item.

    Returns:
        float32 [rows]: one loss a row (sum it and divide by the global row
        count, as `retrieval_loss` does).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}; 1.0 leaves logits as is.")
    queries, candidates = tf.cast(queries, tf.float32), tf.cast(candidates, tf.float32)
    item_ids = tf.convert_to_tensor(item_ids)
    _check_shapes(queries, candidates, item_ids, log_q)
    rows = tf.shape(queries)[0]
    everyone = gather_global_rows(candidates, global_batch_size=global_batch_size)
    logits = tf.matmul(queries, everyone, transpose_b=True) / temperature
    if log_q is not None:
        all_log_q = gather_global_rows(
            tf.cast(log_q, tf.float32), global_batch_size=global_batch_size
        )
        logits -= all_log_q[tf.newaxis, :]
    mine = global_row_offset(rows) + tf.range(rows)  # each row's own column
    if remove_accidental_hits:
        all_ids = gather_global_rows(
            tf.cast(item_ids, tf.int64), global_batch_size=global_batch_size
        )
        same_item = tf.equal(tf.cast(item_ids, tf.int64)[:, tf.newaxis], all_ids[tf.newaxis, :])
        itself = tf.cast(tf.one_hot(mine, tf.shape(everyone)[0]), tf.bool)
        logits = tf.where(same_item & ~itself, tf.constant(-np.inf, tf.float32), logits)
    positive = tf.gather(logits, mine, batch_dims=1)
    return tf.reduce_logsumexp(logits, axis=1) - positive


def catalogue_softmax(
    queries: tf.Tensor,
    catalogue: tf.Tensor,
    item_ids: tf.Tensor,
    *,
    temperature: float = 1.0,
) -> tf.Tensor:
    """Each row's loss of the full softmax over every item of the catalogue: no sampling.

    Row i's logits are its query's dot products with every item's embedding
    (`catalogue`, row j the embedding of item j), divided by `temperature`;
    its loss logsumexp(logits) - the logit of its own item. Every item is a
    negative of every row, so no sampling correction is needed, and a row's
    loss reads no other row: the same on any replica count.

    Args:
        queries: this replica's query (user) embeddings, [rows, dim].
        catalogue: every item's embedding, [num_items, dim].
        item_ids: this replica's positive item ids, [rows] integers in 0..num_items - 1.
        temperature: > 0; the logits are divided by it.

    Returns:
        float32 [rows]: one loss a row.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}; 1.0 leaves logits as is.")
    queries, catalogue = tf.cast(queries, tf.float32), tf.cast(catalogue, tf.float32)
    item_ids = tf.convert_to_tensor(item_ids)
    _check_shapes(queries, catalogue, item_ids, None)
    logits = tf.matmul(queries, catalogue, transpose_b=True) / temperature
    positive = tf.gather(logits, tf.cast(item_ids, tf.int32), batch_dims=1)
    return tf.reduce_logsumexp(logits, axis=1) - positive


def retrieval_loss(
    queries: tf.Tensor, candidates: tf.Tensor, item_ids: tf.Tensor, **options: Any
) -> tf.Tensor:
    """`in_batch_softmax` summed and divided by the global row count: this replica's share.

    Summed over replicas (as `loops.Update` does) it is the mean loss of the
    whole global batch. Arguments as `in_batch_softmax`, its keyword
    arguments (`global_batch_size` among them) passed on as they are.
    """
    per_row = in_batch_softmax(queries, candidates, item_ids, **options)
    return scale_to_global_batch(per_row, global_count(tf.shape(queries)[0]))


def _check_shapes(
    queries: tf.Tensor, candidates: tf.Tensor, item_ids: tf.Tensor, log_q: tf.Tensor | None
) -> None:
    """Refuses, while tracing, shapes that cannot be one row a query."""
    if queries.shape.rank != 2 or candidates.shape.rank != 2:
        raise ValueError(
            f"queries and candidates must be [rows, dim] embeddings, got shapes {queries.shape} "
            f"and {candidates.shape}; reshape them to one row an example."
        )
    if not queries.shape[1:].is_compatible_with(candidates.shape[1:]):
        raise ValueError(
            f"queries are {queries.shape[1]} wide and candidates {candidates.shape[1]}; make "
            "both towers end in embeddings of one size."
        )
    shaped = {"item_ids": item_ids, **({} if log_q is None else {"log_q": log_q})}
    for name, value in shaped.items():
        if value.shape.rank != 1:
            raise ValueError(
                f"{name} must be a vector, one entry a row, got shape {value.shape}; "
                f"flatten it (tf.reshape({name}, [-1]))."
            )
