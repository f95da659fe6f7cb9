"""The numbers a recommender must beat on a split interaction log, in numpy: the bias
baseline's RMSE, and Recall@K and NDCG@K of popularity (or of any scores) over the whole
item corpus, each user's training items excluded.

The ranking definitions are those of `loops.kinds.library.ranking_metrics`: a user's
relevant items are their test items that are not among their training
items; Recall@K is the relevant items in the top K over the relevant count,
NDCG@K the discounted gain of those hits over the best possible; both are
averaged over the users with at least one relevant item. Of equal scores the
lower item index ranks first (as `tf.math.top_k` ranks them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np

from loops.input.interaction_logs import Interactions
from loops.vocabulary.whole_numbers import check_whole


@dataclasses.dataclass(frozen=True)
class BiasBaseline:
    """A rating predicted as mean + user bias + item bias (0 for one not seen in training)."""

    mean: float
    user_bias: np.ndarray
    item_bias: np.ndarray

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        return self.mean + self.user_bias[users] + self.item_bias[items]

    def rmse(self, test: Interactions) -> float:
        """The root mean squared error of its predictions on `test`'s ratings (float64)."""
        error = self.predict(test.users, test.items) - test.ratings.astype(np.float64)
        return float(np.sqrt(np.mean(error**2)))


def fit_bias_baseline(
    train: Interactions, *, regularization: float = 10.0, iterations: int = 15
) -> BiasBaseline:
    """Least squares of the ratings on user and item biases, each shrunk by `regularization`.

    Alternates the two closed forms (each bias the regularized mean of its
    rows' residuals: sum / (count + regularization)), starting from item
    biases 0; 15 rounds settle to the fourth decimal of the RMSE.
    """
    return fit_bias_baseline_over(
        lambda: [(train.users, train.items, train.ratings)],
        num_users=train.num_users,
        num_items=train.num_items,
        regularization=regularization,
        iterations=iterations,
    )


# (users, items, ratings) of some rows: a pass over a log yields them chunk by chunk.
Chunks = Callable[[], Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]]


def fit_bias_baseline_over(
    chunks: Chunks,
    *,
    num_users: int,
    num_items: int,
    regularization: float = 10.0,
    iterations: int = 15,
) -> BiasBaseline:
    """`fit_bias_baseline` over rows too many to hold: `chunks()` passes over them (one pass for
    the counts and mean, then one a round); its sums add chunk by chunk in float64, so the
    biases equal the in-memory fit's to rounding."""
    check_whole("iterations", iterations)
    if not regularization >= 0:
        raise ValueError(f"regularization must be >= 0, got {regularization!r}.")
    user_rows, item_rows = np.zeros(num_users), np.zeros(num_items)
    total, rows = 0.0, 0
    for users, items, ratings in chunks():
        user_rows += np.bincount(users, minlength=num_users)
        item_rows += np.bincount(items, minlength=num_items)
        total, rows = total + float(ratings.astype(np.float64).sum()), rows + len(ratings)
    mean = total / max(rows, 1)
    user_rows, item_rows = user_rows + regularization, item_rows + regularization
    item_bias, user_bias = np.zeros(num_items), np.zeros(num_users)

    def sums(by_users: bool) -> np.ndarray:
        found = np.zeros(num_users if by_users else num_items)
        for users, items, ratings in chunks():
            ratings = ratings.astype(np.float64)
            if by_users:
                found += np.bincount(users, ratings - mean - item_bias[items], num_users)
            else:
                found += np.bincount(items, ratings - mean - user_bias[users], num_items)
        return found

    for _ in range(iterations):
        user_bias = sums(True) / np.maximum(user_rows, 1)
        item_bias = sums(False) / np.maximum(item_rows, 1)
    return BiasBaseline(mean, user_bias, item_bias)


def bias_rmse(baseline: BiasBaseline, chunks: Iterable[tuple]) -> float:
    """The baseline's RMSE on rows given chunk by chunk (users, items, ratings)."""
    squares, rows = 0.0, 0
    for users, items, ratings in chunks:
        error = baseline.predict(users, items) - ratings.astype(np.float64)
        squares, rows = squares + float(np.sum(error**2)), rows + len(error)
    return float(np.sqrt(squares / max(rows, 1)))


def popularity_scores(train: Interactions) -> np.ndarray:
    """Each item's training rows, float64 [num_items]: the score of every user for it."""
    return train.item_counts().astype(np.float64)


def ranking_metrics(
    scores: Callable[[np.ndarray], np.ndarray] | np.ndarray,
    train: Interactions,
    test: Interactions,
    *,
    k: int = 10,
    users_a_chunk: int = 1024,
) -> dict[str, float]:
    """Recall@K and NDCG@K of `scores` over every item, training items excluded.

    Args:
        scores: the users' scores of every item: a function of user indices
            [n] -> [n, num_items], or a vector [num_items] that scores every
            user alike (`popularity_scores(train)`).
        train, test: a split of one log.
        k: the list length, at most num_items.

    Returns:
        {"recall@k": ..., "ndcg@k": ..., "users": the users averaged over}.
    """
    check_whole("k", k)
    if k > train.num_items:
        raise ValueError(f"k={k} is more than the {train.num_items} items; pass k <= it.")
    score_of = scores if callable(scores) else (lambda users: np.tile(scores, (len(users), 1)))
    gains = 1.0 / np.log2(np.arange(2, k + 2))
    totals = np.zeros(3)
    for first in range(0, train.num_users, users_a_chunk):
        users = np.arange(first, min(first + users_a_chunk, train.num_users))
        seen = _matrix(train, users)
        relevant = _matrix(test, users) & ~seen
        chunk = np.where(seen, -np.inf, np.asarray(score_of(users), np.float64))
        top = np.argsort(-chunk, axis=1, kind="stable")[:, :k]
        hits = np.take_along_axis(relevant, top, axis=1)
        count = relevant.sum(axis=1)
        has = count > 0
        ideal = np.cumsum(gains)[np.minimum(count, k) - 1]
        totals += [
            np.sum(hits.sum(axis=1)[has] / count[has]),
            np.sum((hits @ gains)[has] / ideal[has]),
            np.sum(has),
        ]
    users_counted = max(totals[2], 1.0)
    return {
        f"recall@{k}": float(totals[0] / users_counted),
        f"ndcg@{k}": float(totals[1] / users_counted),
        "users": int(totals[2]),
    }


def _matrix(log: Interactions, users: np.ndarray) -> np.ndarray:
    """Which items each of `users` (consecutive indices) has in `log`: bool [users, items]."""
    rows = (log.users >= users[0]) & (log.users <= users[-1])
    matrix = np.zeros((len(users), log.num_items), bool)
    matrix[log.users[rows] - users[0], log.items[rows]] = True
    return matrix
