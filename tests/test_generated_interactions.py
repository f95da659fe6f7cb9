"""The generated interaction log: its planted structure, learnable beyond popularity and the
bias baseline, and the numpy baselines that measure it."""

import dataclasses
import time

import numpy as np
import pytest

from loops.input import interaction_baselines as baselines
from loops.input.interaction_logs import Interactions, split
from loops_data.interactions import generated_log

SMALL = {"num_users": 1500, "num_items": 400, "num_interactions": 40_000}


def test_the_default_log_is_quick_deterministic_and_shaped_like_a_real_one():
    start = time.perf_counter()
    log = generated_log()
    seconds = time.perf_counter() - start
    assert seconds < 10  # about 1.5 s alone on one core; the machine is shared
    assert (log.num_users, log.num_items) == (3000, 1500)
    assert 190_000 <= len(log) <= 200_000
    assert len(np.unique(log.users.astype(np.int64) * 1500 + log.items)) == len(log)  # no repeats
    assert np.bincount(log.users).min() >= 5
    counts = np.sort(log.item_counts())[::-1]
    # Zipf: the top 1% of items hold a share like MovieLens-100K's (5.6%), the top item
    # is picked ten times as often as the median one, and every item by someone.
    assert counts[:15].sum() / len(log) > 0.05 and counts[0] > 10 * np.median(counts)
    assert counts[-1] > 0
    assert set(np.unique(log.ratings).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert 3.2 < log.ratings.mean() < 3.6
    again = generated_log()
    for name in ("users", "items", "ratings", "timestamps"):
        np.testing.assert_array_equal(getattr(again, name), getattr(log, name))
    other = generated_log(seed=1)
    assert not np.array_equal(other.items, log.items)
    assert "seed=0" in log.describe()["source"]


def low_rank_scores(train: Interactions, rank: int):
    """PureSVD: the training matrix projected on its top `rank` item factors."""
    matrix = np.zeros((train.num_users, train.num_items))
    matrix[train.users, train.items] = 1.0
    _, vectors = np.linalg.eigh(matrix.T @ matrix)
    top = vectors[:, -rank:]
    return lambda users: matrix[users] @ top @ top.T


def alternating_least_squares(train: Interactions, bias, *, rank=8, regularization=5.0, rounds=6):
    """Factors of the ratings the bias baseline leaves, each side by ridge regression in turn."""
    residual = train.ratings - bias.predict(train.users, train.items)
    factors = {
        "users": np.zeros((train.num_users, rank)),
        "items": np.zeros((train.num_items, rank)),
    }
    factors["items"] = np.random.default_rng(0).normal(0.0, 0.1, factors["items"].shape)
    for _ in range(rounds):
        for side, other in (("users", "items"), ("items", "users")):
            mine, theirs = getattr(train, side), getattr(train, other)
            for index in range(len(factors[side])):
                rows = mine == index
                known = factors[other][theirs[rows]]
                factors[side][index] = np.linalg.solve(
                    known.T @ known + regularization * np.eye(rank), known.T @ residual[rows]
                )
    return lambda users, items: (
        bias.predict(users, items)
        + np.einsum("nd,nd->n", factors["users"][users], factors["items"][items])
    )


def test_low_rank_models_beat_popularity_and_the_bias_baseline():
    log = generated_log(**SMALL)  # dim 8: users pick by 4 factors and rate by 8
    train, test = split(log, how="random", test_fraction=0.2, seed=0)
    popular = baselines.ranking_metrics(baselines.popularity_scores(train), train, test, k=10)
    learned = baselines.ranking_metrics(low_rank_scores(train, 4), train, test, k=10)
    assert popular["users"] == learned["users"] > 1300  # the users with a test item
    assert learned["recall@10"] > 2 * popular["recall@10"]
    assert learned["ndcg@10"] > 2 * popular["ndcg@10"]
    bias = baselines.fit_bias_baseline(train)
    mean_only = np.sqrt(np.mean((train.ratings.mean() - test.ratings) ** 2))
    assert bias.rmse(test) < mean_only - 0.05
    factors = alternating_least_squares(train, bias)
    rmse = np.sqrt(np.mean((factors(test.users, test.items) - test.ratings) ** 2))
    assert rmse < 0.9 * bias.rmse(test)


def test_ranking_metrics_count_hits_below_the_training_items():
    # Popularity: item 2 (3 rows), 3 (2), 0 (1), 1 (0). User 0 trained on item 3 and tests
    # items 0 and 3 (3 is no longer relevant); user 1 trained on 3, 2, 0 and tests item 1;
    # users 2 and 3 test nothing and are not counted.
    train = _log(users=[0, 1, 1, 1, 2, 3], items=[3, 3, 2, 0, 2, 2])
    test = _log(users=[0, 0, 1], items=[0, 3, 1])
    popular = baselines.popularity_scores(train)
    np.testing.assert_array_equal(popular, [1, 0, 3, 2])
    # k=2: user 0's list is [2, 0] (a hit at rank 2), user 1's [1, 0] (a hit at rank 1).
    at2 = baselines.ranking_metrics(popular, train, test, k=2)
    assert at2 == pytest.approx({"recall@2": 1.0, "ndcg@2": (1 / np.log2(3) + 1) / 2, "users": 2})
    at1 = baselines.ranking_metrics(popular, train, test, k=1)
    assert at1 == pytest.approx({"recall@1": 0.5, "ndcg@1": 0.5, "users": 2})
    with pytest.raises(ValueError, match=r"^k=5 is more than the 4 items; pass k <= it\.$"):
        baselines.ranking_metrics(popular, train, test, k=5)


def _log(users, items, num_users=4, num_items=4):
    return Interactions(
        users=np.asarray(users, np.int32),
        items=np.asarray(items, np.int32),
        ratings=np.ones(len(users), np.float32),
        timestamps=np.arange(len(users), dtype=np.int64),
        num_users=num_users,
        num_items=num_items,
        user_ids=np.arange(num_users),
        item_ids=np.arange(num_items),
    )


def test_the_bias_baseline_is_the_regularized_least_squares_fit():
    train = dataclasses.replace(
        _log(users=[0, 0, 1], items=[0, 1, 0], num_users=2),
        ratings=np.asarray([5, 3, 1], np.float32),
    )
    fitted = baselines.fit_bias_baseline(train, regularization=0.0, iterations=200)
    # Unregularized, 3 ratings and 4 free parameters (with the mean fixed at 3) fit exactly.
    np.testing.assert_allclose(fitted.predict(train.users, train.items), [5, 3, 1], atol=1e-6)
    assert fitted.rmse(train) == pytest.approx(0.0, abs=1e-6)
    shrunk = baselines.fit_bias_baseline(train, regularization=1.0)
    assert abs(shrunk.user_bias).max() < abs(fitted.user_bias).max()


def test_impossible_logs_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"^num_items must be a whole number >= 10, got 5\.$"):
        generated_log(num_items=5)
    with pytest.raises(
        ValueError,
        match=r"^num_interactions=1000 is more than 10 users picking at most half of 100 items "
        r"each can make \(500\); ask for fewer interactions or more users or items\.$",
    ):
        generated_log(num_users=10, num_items=100, num_interactions=1000)
