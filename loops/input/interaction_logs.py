"""STUB until h-recparts lands: interaction logs as numpy arrays, and their train/test split."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Interactions:
    """One row an interaction: dense user and item rows, a rating, a timestamp."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    num_users: int
    num_items: int

    def take(self, rows: np.ndarray) -> Interactions:
        return dataclasses.replace(
            self,
            users=self.users[rows],
            items=self.items[rows],
            ratings=self.ratings[rows],
            timestamps=self.timestamps[rows],
        )


def split(interactions: Interactions, how: str = "random", test_fraction: float = 0.2, seed=0):
    """(train, test): a random share of rows, or the latest ones, held out."""
    count = len(interactions.users)
    if how == "time":
        order = np.argsort(interactions.timestamps, kind="stable")
    else:
        order = np.random.default_rng(seed).permutation(count)
    cut = count - int(round(count * test_fraction))
    return interactions.take(np.sort(order[:cut])), interactions.take(np.sort(order[cut:]))


def read_interactions(path: str, format: str = "auto") -> Interactions:
    """user, item, rating, timestamp columns, tab separated, ids mapped to dense rows."""
    del format
    table = np.loadtxt(path, dtype=np.float64, ndmin=2, comments=("#", "user"))
    users, user_rows = np.unique(table[:, 0].astype(np.int64), return_inverse=True)
    items, item_rows = np.unique(table[:, 1].astype(np.int64), return_inverse=True)
    return Interactions(
        users=user_rows.astype(np.int32),
        items=item_rows.astype(np.int32),
        ratings=table[:, 2].astype(np.float32),
        timestamps=table[:, 3].astype(np.int64),
        num_users=len(users),
        num_items=len(items),
    )
