"""The recommender's export: a SavedModel that serves the log's own user and item ids, a user's
top K items and the score of a pair, never another id's row for an unknown one
(`export_recommender`)."""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from loops.model_dir import export, id_vocabulary
from loops.vocabulary.whole_numbers import check_whole


class _RecommenderServer(tf.Module):
    """Holds a recommender's model, its id tables and its two traced serving functions."""

    def __init__(self, model: keras.Model, vocabulary: _Vocabulary, top_items, pairs):
        super().__init__()
        self.model = model
        # Attributes of the module, so the tables are saved (and initialized on load).
        self.user_table, self.item_table = vocabulary.user_table, vocabulary.item_table
        users = tf.TensorSpec([None], vocabulary.user_type, name="users")
        items = tf.TensorSpec([None], vocabulary.item_type, name="items")
        # No AutoGraph (nothing to convert): in a long process its cache of converted
        # functions was seen to hand a definition's bound method another method's
        # conversion ("tf__train_step() takes 2 positional arguments but 3 were given").
        self.serve = tf.function(top_items, input_signature=[users], autograph=False)
        self.score_pairs = tf.function(pairs, input_signature=[users, items], autograph=False)


class _Vocabulary:
    """The raw ids of the model's rows, their lookup tables and the popularity fallback."""

    def __init__(self, user_ids, item_ids, item_counts, top_k: int):
        self.user_ids = id_vocabulary.checked_ids("user_ids", user_ids)
        self.item_ids = id_vocabulary.checked_ids("item_ids", item_ids)
        counts = np.asarray(item_counts)
        if counts.shape != self.item_ids.shape or counts.dtype.kind not in "iu" or counts.min() < 0:
            raise ValueError(
                f"item_counts must hold a whole count >= 0 for each of the {len(self.item_ids)} "
                f"items, got {counts.dtype.name} of shape {counts.shape}"
                + (f" holding {counts.min()}" if counts.shape == self.item_ids.shape else "")
                + "; pass Interactions.item_counts() of the training log."
            )
        check_whole("top_k", top_k)
        if top_k > len(self.item_ids):
            raise ValueError(
                f"top_k={top_k} is more than the {len(self.item_ids)} items of the corpus; "
                f"pass top_k <= {len(self.item_ids)}."
            )
        # The most trained items first; among equal counts the lower index.
        self.popular = tf.constant(np.argsort(-counts, kind="stable")[:top_k], tf.int32)
        self.user_type = id_vocabulary.tensor_type(self.user_ids)
        self.item_type = id_vocabulary.tensor_type(self.item_ids)
        self.user_table = id_vocabulary.lookup_table(self.user_ids)
        self.item_table = id_vocabulary.lookup_table(self.item_ids)
        self.item_values = tf.constant(self.item_ids, self.item_type)

    def user_rows(self, users: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return _rows(self.user_table, users)

    def item_rows(self, items: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return _rows(self.item_table, items)


def _rows(table: tf.lookup.StaticHashTable, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(int32 rows, bool known): each id's row of the model, row 0 where the id is unknown
    (its result is then replaced: an unknown id never reads another id's row)."""
    index = id_vocabulary.lookup(table, ids)
    return tf.cast(tf.maximum(index, 0), tf.int32), index >= 0


def export_recommender(
    model: keras.Model,
    export_dir: str,
    *,
    score_all_items: Callable[[tf.Tensor], tf.Tensor],
    score_pairs: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    top_k: int,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    item_counts: np.ndarray,
) -> str:
    """Saves a recommender that serves the log's own ids, with two signatures.

    Ids are sent and returned as the log has them (`Interactions.user_ids`,
    `item_ids`): int64 when they are whole numbers, else strings. Index i of
    the model's tables is `user_ids[i]` (`item_ids[i]`); the export and
    `ids.json` in it (`loops.model_dir.id_vocabulary.read_ids`) hold that map.
    A string id sent is read as the log's reader reads one (`id_vocabulary.lookup`):
    the blanks around it dropped, its accents composed or not alike, so the log's
    own bytes find their id.

    `serving_default`: `users` [n] -> `items` [n, top_k] (the item ids, highest
    score first, over the whole corpus: a client drops the items a user has),
    `scores` float32 [n, top_k], and `known_user` bool [n]. A user id the log
    does not hold (-1 included, unless the log has it) gets the `top_k` items
    with the most training interactions (`item_counts`; ties: the lower
    index), NaN scores and `known_user` False: never another user's list.
    `score_pairs`: `users` [n], `items` [n] -> `scores` float32 [n],
    `known_user` and `known_item` bool [n]; a pair with an unknown id scores
    NaN. Lists of unequal length are refused (InvalidArgumentError: "score_pairs
    takes one item a user ..."); an empty batch gives empty outputs.

    Args:
        model: the model holding every weight the scores read (saved with them).
        score_all_items: int32 user rows [n] -> float32 scores [n, num_items].
        score_pairs: (int32 user rows [n], int32 item rows [n]) -> float32 scores [n].
        top_k: the items returned a user (at most the corpus).
        user_ids, item_ids: the raw id of each user and item row, int or str, each once.
        item_counts: [num_items] each item's training interactions (the fallback's order).

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory; bad ids (two a
            request cannot tell apart among them), counts or top_k; a score_all_items that
            scores another number of items than item_ids.
    """
    vocabulary = _Vocabulary(user_ids, item_ids, item_counts, top_k)
    _check_scores_every_item(score_all_items, len(vocabulary.item_ids))
    nan = tf.constant(np.nan, tf.float32)

    def top_items(users):
        rows, known = vocabulary.user_rows(users)
        best = tf.math.top_k(score_all_items(rows), k=top_k)
        items = tf.where(known[:, None], best.indices, vocabulary.popular[None, :])
        return {
            "items": tf.gather(vocabulary.item_values, items),
            "scores": tf.where(known[:, None], best.values, nan),
            "known_user": known,
        }

    def pairs(users, items):
        same_length = tf.debugging.assert_equal(
            tf.size(users),
            tf.size(items),
            message="score_pairs takes one item a user: send users and items of one length "
            "(pair i is users[i], items[i])",
        )
        with tf.control_dependencies([same_length]):
            user_rows, known_user = vocabulary.user_rows(users)
            item_rows, known_item = vocabulary.item_rows(items)
        scores = score_pairs(user_rows, item_rows)
        return {
            "scores": tf.where(known_user & known_item, scores, nan),
            "known_user": known_user,
            "known_item": known_item,
        }

    server = _RecommenderServer(model, vocabulary, top_items, pairs)
    signatures = {"serving_default": server.serve, "score_pairs": server.score_pairs}
    ids = id_vocabulary.ids_json(vocabulary.user_ids, vocabulary.item_ids)
    return export.save(
        server, export_dir, signatures=signatures, files={id_vocabulary.ID_FILE: ids}
    )


def _check_scores_every_item(score_all_items: Callable, num_items: int) -> None:
    scored = int(score_all_items(tf.zeros([1], tf.int32)).shape[-1])
    if scored != num_items:
        raise ValueError(
            f"score_all_items scores {scored} items and item_ids names {num_items}; pass the "
            "raw id of each item row of the model (Interactions.item_ids of its log)."
        )
