"""Ranking metrics that are exact on any replica count: Recall@K and NDCG@K against the whole
item corpus by brute-force top-K, and the area under the ROC curve.

`ranking_sums` runs on one replica's users (or on a whole batch on one
device): it ranks every item for each user with `tf.math.top_k`, items the
user saw in training excluded, and returns SUMS over its users (each user's
Recall@K and NDCG@K, and the users counted). The sums of all replicas and
batches, divided by the users counted, are the mean over users whatever the
replica count: `strategy.reduce(SUM)` of each, then `loops.Ratio(recall,
users)` in an eval step. A user's relevant items are their held-out items
that are not excluded; Recall@K is the hits in the top K over the relevant
count, NDCG@K the discounted gain of the hits (1 / log2(rank + 1)) over the
best possible for that count; a user with no relevant item is not counted.
Of equal scores the lower item index ranks first (`tf.math.top_k`'s order).

The AUC needs every example's score at once, so `ScoreCollector` gathers the
replicas' scores and labels to the host over an evaluation pass and `auc`
computes it exactly by ranks (ties count one half).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole


class RankingSums(NamedTuple):
    """Sums over a replica's users (float64 scalars): divide recall and ndcg by users."""

    recall: tf.Tensor
    ndcg: tf.Tensor
    users: tf.Tensor


def ranking_sums(
    scores: tf.Tensor, relevant: tf.Tensor, *, k: int, exclude: tf.Tensor | None = None
) -> RankingSums:
    """Recall@K and NDCG@K of each user's ranking of every item, summed over the users.

    Args:
        scores: [users, num_items]: each user's score of every item (e.g. the
            user embeddings times the transposed item embeddings).
        relevant: [users, num_items] bool (or 0/1): each user's held-out items.
        k: the list length, 1 <= k <= num_items.
        exclude: [users, num_items] bool (or 0/1), optional: items never
            ranked (those the user saw in training); they are not relevant either.

    Returns:
        `RankingSums` of float64 scalars.
    """
    scores = tf.convert_to_tensor(scores)
    _check(scores, k)
    relevant = tf.cast(relevant, tf.bool)
    if exclude is not None:
        exclude = tf.cast(exclude, tf.bool)
        scores = tf.where(exclude, tf.constant(-np.inf, scores.dtype), scores)
        relevant = relevant & ~exclude
    _, top = tf.math.top_k(scores, k=k)
    hits = tf.gather(tf.cast(relevant, tf.float64), top, batch_dims=1)  # [users, k]
    count = tf.reduce_sum(tf.cast(relevant, tf.int32), axis=1)
    counted = count > 0
    gains = 1.0 / np.log2(np.arange(2, k + 2, dtype=np.float64))
    ideal = tf.gather(tf.constant(np.cumsum(gains)), tf.clip_by_value(count, 1, k) - 1)
    recall = tf.math.divide_no_nan(tf.reduce_sum(hits, axis=1), tf.cast(count, tf.float64))
    ndcg = tf.linalg.matvec(hits, tf.constant(gains)) / ideal
    zero = tf.zeros_like(recall)
    return RankingSums(
        recall=tf.reduce_sum(tf.where(counted, recall, zero)),
        ndcg=tf.reduce_sum(tf.where(counted, ndcg, zero)),
        users=tf.reduce_sum(tf.cast(counted, tf.float64)),
    )


def _check(scores: tf.Tensor, k: int) -> None:
    check_whole("k", k, note=" (the length of each user's list)")
    if scores.shape.rank != 2:
        raise ValueError(
            f"scores must be [users, num_items], got shape {scores.shape}; score every item "
            "for each user (tf.matmul(users, items, transpose_b=True))."
        )
    items = scores.shape[1]
    if items is not None and k > items:
        raise ValueError(f"k={k} is more than the {items} items scored; pass k <= {items}.")


def items_mask(item_lists: tf.Tensor, num_items: int) -> tf.Tensor:
    """[users, num_items] bool from each user's item indices, padded with negative entries.

    E.g. `Interactions.items_by_user()` rows: [[3, 0, -1], [2, -1, -1]] -> users 0
    and 1's items; the padding is ignored, as are repeats.
    """
    item_lists = tf.convert_to_tensor(item_lists)
    if item_lists.shape.rank != 2:
        raise ValueError(
            f"item_lists must be [users, longest list], padded with -1, got shape "
            f"{item_lists.shape}."
        )
    where = tf.where(item_lists >= 0)  # [n, 2]: (user, position)
    indices = tf.stack([where[:, 0], tf.cast(tf.gather_nd(item_lists, where), tf.int64)], axis=1)
    shape = tf.stack([tf.cast(tf.shape(item_lists)[0], tf.int64), tf.constant(num_items, tf.int64)])
    counts = tf.scatter_nd(indices, tf.ones([tf.shape(indices)[0]], tf.int32), shape)
    return counts > 0


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The exact area under the ROC curve: P(a positive outscores a negative), ties one half.

    Computed from ranks (Mann-Whitney U) in float64. Labels > 0.5 are
    positive. NaN when the labels hold no positive or no negative.
    """
    scores = np.asarray(scores, np.float64).reshape(-1)
    positive = np.asarray(labels).reshape(-1) > 0.5
    if scores.shape != positive.shape:
        raise ValueError(
            f"auc got {scores.size} scores and {positive.size} labels; pass one label a score."
        )
    positives = int(positive.sum())
    negatives = len(positive) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, group, sizes = np.unique(scores, return_inverse=True, return_counts=True)
    # Each distinct score's rank is the mean of the ranks its ties take (1-based).
    mid_ranks = np.cumsum(sizes) - (sizes - 1) / 2.0
    rank_sum = float(mid_ranks[group.reshape(-1)][positive].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


class ScoreCollector:
    """Every example's score and label over an evaluation pass, from all replicas, on the host.

    Call `add` with the per-replica scores and labels of each eval step (the
    `strategy.run` results, outside the compiled step), then `auc()`. The
    gathered arrays are host memory: one float64 pair an example.
    """

    def __init__(self) -> None:
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def add(self, strategy: tf.distribute.Strategy, scores, labels) -> None:
        """Appends one step's examples of every replica (per-replica vectors, or plain tensors
        on one replica)."""
        for kept, value in ((self._scores, scores), (self._labels, labels)):
            if strategy.num_replicas_in_sync > 1:
                value = strategy.gather(value, axis=0)
            kept.append(np.asarray(value, np.float64).reshape(-1))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, labels) of every example added, float64."""
        if not self._scores:
            return np.zeros(0), np.zeros(0)
        return np.concatenate(self._scores), np.concatenate(self._labels)

    def auc(self) -> float:
        """`auc` of everything added (NaN before any positive and negative)."""
        return auc(*self.arrays())

    def reset(self) -> None:
        self._scores.clear()
        self._labels.clear()


class StreamingAUC:
    """The AUC of more scores than a host keeps, with a bound on its error that it computes
    itself: each (score, label) is counted in one of `bins` equal bins of [low, high] (a score
    outside falls in the first or last), and the AUC is read from the counts, pairs within one
    bin counting one half as ties do. Only those pairs can differ from `auc`'s count, each by
    one half, so |this - `auc`| <= `bound()` (exact: tested), and the bound shrinks as the
    bins get finer. 16 bytes a bin, whatever the rows.
    """

    def __init__(self, bins: int = 1 << 16, low: float = -16.0, high: float = 16.0):
        check_whole("bins", bins, 1)
        self.bins, self.low, self.high = bins, low, high
        self.positives = np.zeros(bins, np.int64)
        self.negatives = np.zeros(bins, np.int64)

    def update(self, scores: np.ndarray, labels: np.ndarray) -> None:
        scores = np.asarray(scores, np.float64).reshape(-1)
        positive = np.asarray(labels).reshape(-1) > 0.5
        place = (scores - self.low) * (self.bins / (self.high - self.low))
        index = np.clip(np.nan_to_num(place, nan=0.0), 0, self.bins - 1).astype(np.int64)
        self.positives += np.bincount(index[positive], minlength=self.bins)
        self.negatives += np.bincount(index[~positive], minlength=self.bins)

    def _pairs(self) -> float:
        return float(self.positives.sum()) * float(self.negatives.sum())

    def result(self) -> float:
        """The AUC of the counts (NaN with no positive or no negative)."""
        pairs = self._pairs()
        if not pairs:
            return float("nan")
        below = np.cumsum(self.negatives) - self.negatives  # negatives in lower bins
        wins = np.dot(self.positives.astype(np.float64), below)
        ties = np.dot(self.positives.astype(np.float64), self.negatives)
        return float((wins + 0.5 * ties) / pairs)

    def bound(self) -> float:
        """The most the result can differ from the exact AUC of the same scores."""
        pairs = self._pairs()
        same_bin = np.dot(self.positives.astype(np.float64), self.negatives)
        return float(0.5 * same_bin / pairs) if pairs else float("nan")
