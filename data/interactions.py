"""STUB until h-recparts lands: a generated interaction log with planted latent factors."""

from __future__ import annotations

import numpy as np

from loops.input.interaction_logs import Interactions


def generated_log(
    num_users: int = 2000, num_items: int = 1000, num_interactions: int = 200_000, seed: int = 0
) -> Interactions:
    rng = np.random.default_rng(seed)
    dim = 8
    user_factors = rng.normal(size=(num_users, dim))
    item_factors = rng.normal(size=(num_items, dim))
    popularity = -1.0 * np.log(np.arange(1, num_items + 1))
    logits = popularity[None, :] + 0.8 * user_factors @ item_factors.T
    per_user = num_interactions // num_users
    gumbel = rng.gumbel(size=logits.shape)
    items = np.argsort(-(logits + gumbel), axis=1)[:, :per_user]
    users = np.repeat(np.arange(num_users), per_user)
    items = items.reshape(-1)
    affinity = np.sum(user_factors[users] * item_factors[items], axis=1)
    ratings = np.clip(np.round(3.5 + 0.6 * affinity + 0.5 * rng.normal(size=len(users))), 1, 5)
    return Interactions(
        users=users.astype(np.int32),
        items=items.astype(np.int32),
        ratings=ratings.astype(np.float32),
        timestamps=rng.permutation(len(users)).astype(np.int64),
        num_users=num_users,
        num_items=num_items,
    )
