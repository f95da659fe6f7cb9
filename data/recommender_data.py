"""The recommender binary's data: the interaction log read and split, the train and eval
batches of its split, the baselines a model has to beat (popularity for ranking, the biases for
ratings) and its notes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.input import interaction_baselines, interaction_logs
from loops.input.interaction_logs import Interactions
from loops_data.in_memory import batches_in_memory, endless_batches_in_memory


@dataclasses.dataclass(frozen=True)
class SplitLog:
    """An interaction log and its split: train, validation (None without one) and test."""

    interactions: Interactions
    train: Interactions
    validation: Interactions | None
    test: Interactions

    @property
    def evaluated(self) -> Interactions:
        """The rows evaluated during training: validation, or test without one."""
        return self.test if self.validation is None else self.validation

    def mean_rating(self) -> float:
        return float(self.train.ratings.mean())

    def baselines(self, model: str, top_k: int) -> dict[str, float]:
        """The model's baseline on the evaluated rows: popularity (retrieval) or the biases
        (rating), fitted to the training rows."""
        if model == "retrieval":
            return popularity_baseline(self.train, self.evaluated, top_k)
        return bias_baseline(self.train, self.evaluated)

    def trainer_data(self, model: str, *, global_batch_size: int, seed: int) -> dict[str, Any]:
        """The Trainer's `train_data` and `eval_data` (`trainer_data`)."""
        return trainer_data(
            model, self.train, self.evaluated, global_batch_size=global_batch_size, seed=seed
        )

    def test_figures(self, model: str, definition: Any, *, top_k: int) -> dict[str, Any]:
        """`test_figures` on the test rows, each user's train and validation items known."""
        known = self.train if self.validation is None else joined(self.train, self.validation)
        return test_figures(model, definition, self.train, known, self.test, top_k=top_k)

    def notes(self) -> dict[str, Any]:
        return notes(self.interactions, self.train, self.test, self.validation)


def read_split(
    data: Mapping[str, Any], *, seed: int, grown_from: Mapping[str, Any] | None = None
) -> SplitLog:
    """The log `data` names, split as it says: `loops_data.settings.INTERACTIONS`' values
    (data: the log's file, None for the generated log of `seed`; split; test_fraction;
    validation_fraction, 0 for no validation rows), the split's draws of `seed`; with
    `grown_from` (another run's ids, `loops.model_dir.id_vocabulary.read_ids`), its users
    and items numbered after that run's (`interaction_logs.grown`).

    Raises:
        ValueError: a log that does not read (`interaction_logs.read_interactions`), ids
            that cannot grow `grown_from`'s (`interaction_logs.grown`), or a
            split that leaves a part empty (`interaction_logs.split`).
    """
    from loops_data import interactions as generated

    if data["data"] is None:
        interactions = generated.generated_log(seed=seed)
    else:
        interactions = interaction_logs.read_interactions(data["data"])
    if grown_from is not None:
        interactions = interaction_logs.grown(
            interactions, grown_from["users"], grown_from["items"]
        )
    train, test = interaction_logs.split(
        interactions, how=data["split"], test_fraction=data["test_fraction"], seed=seed
    )
    validation = None
    if data["validation_fraction"]:
        train, validation = interaction_logs.split_validation(
            train, how=data["split"], validation_fraction=data["validation_fraction"], seed=seed
        )
    return SplitLog(interactions, train, validation, test)


def ranking_eval_arrays(train: Interactions, test: Interactions):
    """(users, seen, held_out) of the users with a held-out item: the eval batches' rows, the
    item lists padded with -1 (`Interactions.items_by_user`)."""
    users = np.flatnonzero(np.bincount(test.users, minlength=train.num_users) > 0)
    seen, held_out = train.items_by_user(), test.items_by_user()
    return users.astype(np.int32), seen[users], held_out[users]


def popularity_baseline(train: Interactions, test: Interactions, k: int) -> dict[str, float]:
    """Recall@k and NDCG@k of recommending every user the most-trained items it has not seen,
    named as `loops.RetrievalLoop` names its own beside them."""
    metrics = interaction_baselines.ranking_metrics(
        interaction_baselines.popularity_scores(train), train, test, k=k
    )
    return {
        f"popularity_recall_at_{k}": metrics[f"recall@{k}"],
        f"popularity_ndcg_at_{k}": metrics[f"ndcg@{k}"],
    }


def bias_baseline(train: Interactions, test: Interactions) -> dict[str, float]:
    """The test RMSE of the mean rating plus the users' and items' biases fitted to `train`."""
    return {"bias_baseline_rmse": interaction_baselines.fit_bias_baseline(train).rmse(test)}


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


def notes(
    interactions: Interactions,
    train: Interactions,
    test: Interactions,
    validation: Interactions | None = None,
) -> dict[str, Any]:
    """What results.json says of the data: its counts, how it was split, each split's size."""
    return {
        **interactions.describe(),
        "split": train.split,
        "train_interactions": len(train),
        **({} if validation is None else {"validation_interactions": len(validation)}),
        "test_interactions": len(test),
    }


def test_figures(
    model: str,
    definition: Any,
    train: Interactions,
    known: Interactions,
    test: Interactions,
    *,
    top_k: int,
) -> dict[str, Any]:
    """The test figures of the trained `definition`, in numpy, with its baseline beside:
    rating: rmse over the test pairs; retrieval: recall_at_K and ndcg_at_K over every item,
    each user's `known` items (train and validation) excluded (`interaction_baselines`).
    The baselines are fitted to `train`, the rows the model trained on."""
    import tensorflow as tf

    if model != "retrieval":
        scores = np.concatenate(
            [
                definition.score_pairs(tf.constant(users), tf.constant(items)).numpy()
                for users, items in _chunks(test.users, test.items)
            ]
        )
        error = scores.astype(np.float64) - test.ratings.astype(np.float64)
        return {
            "rmse": float(np.sqrt(np.mean(error**2))),
            "pairs": len(test),
            **bias_baseline(train, test),
        }
    figures = interaction_baselines.ranking_metrics(
        lambda users: definition.score_all_items(tf.constant(users, tf.int32)).numpy(),
        known,
        test,
        k=top_k,
    )
    popular = interaction_baselines.ranking_metrics(
        interaction_baselines.popularity_scores(train), known, test, k=top_k
    )
    return {
        f"recall_at_{top_k}": figures[f"recall@{top_k}"],
        f"ndcg_at_{top_k}": figures[f"ndcg@{top_k}"],
        "users": figures["users"],
        f"popularity_recall_at_{top_k}": popular[f"recall@{top_k}"],
        f"popularity_ndcg_at_{top_k}": popular[f"ndcg@{top_k}"],
    }


def _chunks(users: np.ndarray, items: np.ndarray, rows: int = 65536):
    for first in range(0, len(users), rows):
        yield users[first : first + rows], items[first : first + rows]


def joined(first: Interactions, second: Interactions) -> Interactions:
    """The rows of both parts of one log (e.g. train and validation: a user's known items)."""
    return dataclasses.replace(
        first,
        users=np.concatenate([first.users, second.users]),
        items=np.concatenate([first.items, second.items]),
        ratings=np.concatenate([first.ratings, second.ratings]),
        timestamps=np.concatenate([first.timestamps, second.timestamps]),
        features={
            name: np.concatenate([column, second.features[name]])
            for name, column in first.features.items()
        },
    )
