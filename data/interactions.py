"""A generated interaction log with planted structure: the bundled data of the recommender kinds.

Users and items get latent factors; each user picks items with probability
proportional to the item's popularity (Zipf over a random order of the items,
as real logs have) times exp(taste * affinity), the affinity being the dot
product of the first half of the factors; a rating is the dot product of all
the factors plus user and item biases and noise, rounded to 1..5 stars. So
popularity explains part of who picks what, and the factors the rest: a model
that learns them beats popularity, and one that learns the biases and factors
beats the bias baseline's RMSE. The log is the same for the same arguments and
seed.
"""

from __future__ import annotations

import math

import numpy as np

from loops.input.interaction_logs import Interactions
from loops.vocabulary.whole_numbers import check_whole

# Seconds: 1997-11-19 (MovieLens-100K's first day), and the span of every user's interactions.
_START, _SPAN = 879_897_600, 60 * 86_400


def generated_log(
    *,
    num_users: int = 3_000,
    num_items: int = 1_500,
    num_interactions: int = 200_000,
    dim: int = 8,
    taste: float = 3.0,
    zipf_exponent: float = 1.0,
    seed: int = 0,
) -> Interactions:
    """A log of about `num_interactions` (user, item, 1..5 stars, timestamp) rows, no repeats.

    Args:
        num_users, num_items: the index spaces.
        num_interactions: the rows wanted; each user gets at least 5 and at
            most half the items, so the log can hold a few fewer.
        dim: the latent factors' size; users pick items by the first half of
            them (scaled to variance 1) and rate them by all.
        taste: how strongly affinity steers a user's picks (0: popularity alone).
        zipf_exponent: item popularity falls as rank ** -zipf_exponent.
        seed: the whole log follows from it.

    Raises:
        ValueError: a count that is not a whole number, fewer than 10 items,
            or more interactions than half of every user's items allow.
    """
    _check(num_users, num_items, num_interactions, dim)
    rng = np.random.default_rng(seed)
    scale = dim**-0.25  # affinities (dot products of two factors) of variance 1
    user_factors = rng.normal(0.0, scale, (num_users, dim))
    item_factors = rng.normal(0.0, scale, (num_items, dim))
    ranks = rng.permutation(num_items) + 1.0
    log_popularity = -zipf_exponent * np.log(ranks)
    counts = _activity(rng, num_users, num_items, num_interactions)
    # Users pick by the first half of the factors and rate by all of them: along the second
    # half their picks are unselected, so a rating model can learn it from the ratings.
    half = max(dim // 2, 1)
    picking = (user_factors[:, :half] * math.sqrt(dim / half), item_factors[:, :half])
    users, items = _picks(rng, *picking, log_popularity, taste, counts)
    affinity = np.einsum("nd,nd->n", user_factors[users], item_factors[items])
    user_bias = rng.normal(0.0, 0.3, num_users)
    item_bias = rng.normal(0.0, 0.3, num_items) + 0.1 * log_popularity / math.log(num_items)
    # Centred on the picks' mean affinity: users pick what they like, so it is well above 0.
    liking = affinity - affinity.mean()
    stars = 3.5 + liking + user_bias[users] + item_bias[items] + rng.normal(0.0, 0.5, len(users))
    starts = _START + rng.integers(0, _SPAN, num_users)
    return Interactions(
        users=users.astype(np.int32),
        items=items.astype(np.int32),
        ratings=np.clip(np.round(stars), 1, 5).astype(np.float32),
        timestamps=(starts[users] + rng.integers(0, _SPAN, len(users))).astype(np.int64),
        num_users=num_users,
        num_items=num_items,
        user_ids=np.arange(num_users, dtype=np.int64),
        item_ids=np.arange(num_items, dtype=np.int64),
        source=(
            f"loops_data.interactions.generated_log(num_users={num_users}, "
            f"num_items={num_items}, num_interactions={num_interactions}, dim={dim}, "
            f"taste={taste}, zipf_exponent={zipf_exponent}, seed={seed})"
        ),
    )


def _check(num_users: int, num_items: int, num_interactions: int, dim: int) -> None:
    for name, value in (
        ("num_users", num_users),
        ("num_interactions", num_interactions),
        ("dim", dim),
    ):
        check_whole(name, value)
    check_whole("num_items", num_items, least=10)
    most = num_users * (num_items // 2)
    if num_interactions > most:
        raise ValueError(
            f"num_interactions={num_interactions} is more than {num_users} users picking "
            f"at most half of {num_items} items each can make ({most}); ask for fewer "
            "interactions or more users or items."
        )


def _activity(rng: np.random.Generator, users: int, items: int, interactions: int) -> np.ndarray:
    """Interactions per user: log-normal like real logs, at least 5, at most half the items."""
    weights = rng.lognormal(0.0, 0.8, users)
    counts = np.floor(interactions * weights / weights.sum()).astype(np.int64)
    return np.clip(counts, min(5, items // 2), items // 2)


def _picks(
    rng: np.random.Generator,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    log_popularity: np.ndarray,
    taste: float,
    counts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each user's `counts[u]` distinct items, drawn without replacement (Gumbel top-k)."""
    users, items = [], []
    for first in range(0, len(counts), 512):
        rows = slice(first, first + 512)
        logits = log_popularity + taste * (user_factors[rows] @ item_factors.T)
        keys = logits + rng.gumbel(size=logits.shape)
        most = int(counts[rows].max())
        top = np.argpartition(-keys, most - 1, axis=1)[:, :most]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(keys, top, 1), 1), 1)
        for offset, row in enumerate(top):
            user = first + offset
            users.append(np.full(counts[user], user))
            items.append(row[: counts[user]])
    return np.concatenate(users), np.concatenate(items)
