"""The recommender binary's data: the train and eval batches of a split interaction log, and the
baselines a model has to beat (popularity for ranking, user and item biases for ratings)."""

from __future__ import annotations

from typing import Any

import numpy as np

from loops.input.interaction_logs import Interactions
from loops_data.image_classification import batches_in_memory, endless_batches_in_memory


def padded_item_lists(users: np.ndarray, items: np.ndarray, num_users: int) -> np.ndarray:
    """int32 [num_users, longest]: each user's items in row order, -1 after them."""
    order = np.argsort(users, kind="stable")
    counts = np.bincount(users, minlength=num_users)
    lists = np.full((num_users, max(int(counts.max(initial=0)), 1)), -1, np.int32)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sorted_users = users[order]
    columns = np.arange(len(users)) - starts[sorted_users]
    lists[sorted_users, columns] = items[order]
    return lists


def ranking_eval_arrays(train: Interactions, test: Interactions):
    """(users, seen, held_out) of the users with a held-out item: the eval batches' rows."""
    seen = padded_item_lists(train.users, train.items, train.num_users)
    held_out = padded_item_lists(test.users, test.items, train.num_users)
    users = np.flatnonzero(np.bincount(test.users, minlength=train.num_users) > 0)
    return users.astype(np.int32), seen[users], held_out[users]


def ranking_metrics(scores: np.ndarray, seen: np.ndarray, held_out: np.ndarray, k: int):
    """Mean Recall@k and NDCG@k of each row's top k (seen items left out), float64, in NumPy."""
    scores = np.array(scores, np.float64)
    rows = np.arange(len(scores))[:, None]
    scores[np.broadcast_to(rows, seen.shape)[seen >= 0], seen[seen >= 0]] = -np.inf
    relevant = np.zeros(scores.shape, bool)
    relevant[np.broadcast_to(rows, held_out.shape)[held_out >= 0], held_out[held_out >= 0]] = True
    wanted = relevant.sum(axis=1)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    hits = relevant[rows, top]
    discounts = 1.0 / np.log2(np.arange(k) + 2.0)
    best = np.concatenate([[0.0], np.cumsum(discounts)])[np.minimum(wanted, k)]
    keep = wanted > 0
    recall = hits.sum(axis=1)[keep] / wanted[keep]
    ndcg = (hits * discounts).sum(axis=1)[keep] / best[keep]
    return {f"recall_at_{k}": float(recall.mean()), f"ndcg_at_{k}": float(ndcg.mean())}


def popularity_baseline(train: Interactions, test: Interactions, k: int) -> dict[str, float]:
    """Recall@k and NDCG@k of recommending every user the most-trained items it has not seen."""
    users, seen, held_out = ranking_eval_arrays(train, test)
    counts = np.bincount(train.items, minlength=train.num_items).astype(np.float64)
    # Ties broken by item row, as a stable sort of the counts would.
    scores = np.broadcast_to(counts - np.arange(train.num_items) * 1e-9, (len(users), len(counts)))
    metrics = ranking_metrics(scores, seen, held_out, k)
    return {f"popularity_{name}": value for name, value in metrics.items()}


def bias_baseline_rmse(
    train: Interactions, test: Interactions, *, epochs: int = 10, user_reg=15.0, item_reg=10.0
) -> float:
    """The RMSE on `test` of the mean rating plus regularized user and item biases, fitted to
    `train` by alternating least squares (Koren's baseline estimates)."""
    mean = float(train.ratings.mean())
    user_bias = np.zeros(train.num_users)
    item_bias = np.zeros(train.num_items)
    residual = train.ratings.astype(np.float64) - mean
    for _ in range(epochs):
        item_bias = np.bincount(
            train.items, residual - user_bias[train.users], minlength=train.num_items
        ) / (item_reg + np.bincount(train.items, minlength=train.num_items))
        user_bias = np.bincount(
            train.users, residual - item_bias[train.items], minlength=train.num_users
        ) / (user_reg + np.bincount(train.users, minlength=train.num_users))
    predicted = mean + user_bias[test.users] + item_bias[test.items]
    return float(np.sqrt(np.mean((predicted - test.ratings) ** 2)))


def trainer_data(
    model: str, train: Interactions, test: Interactions, *, global_batch_size: int, seed: int
) -> dict[str, Any]:
    """The Trainer's `train_data` and `eval_data` for --model: endless shuffled interactions;
    one pass over the users with a held-out item (retrieval) or the held-out pairs (rating)."""
    if model == "retrieval":
        rows: tuple = (train.users, train.items)
        eval_rows: tuple = ranking_eval_arrays(train, test)
    else:
        rows = (train.users, train.items, train.ratings)
        eval_rows = (test.users, test.items, test.ratings)
    return dict(
        train_data=lambda: endless_batches_in_memory(rows, global_batch_size, seed),
        eval_data=lambda: batches_in_memory(eval_rows, global_batch_size),
    )


def notes(interactions: Interactions, train: Interactions, test: Interactions, **split: Any):
    """What results.json says of the data: its sizes and how it was split."""
    return {
        "users": interactions.num_users,
        "items": interactions.num_items,
        "interactions": len(interactions.users),
        "train_interactions": len(train.users),
        "test_interactions": len(test.users),
        **split,
    }
