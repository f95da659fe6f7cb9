"""The raw ids of a recommender's users and items (a log's own ids, the model's rows in order):
checked, written as `ids.json` (in MODEL_DIR and in the export), read back, and looked up in a
served model (a string as the log's reader reads one: `canonical_text`)."""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from loops.model_dir import canonical_text

ID_FILE = "ids.json"  # in MODEL_DIR (written as training starts) and in the export

_ID_TYPES = {"int64": tf.int64, "string": tf.string}


def checked_ids(name: str, ids) -> np.ndarray:
    """`ids` as a 1-D array of int64 (whole numbers) or str, each id once.

    Index i of a model's table is the row of `ids[i]`.

    Raises:
        ValueError: not 1-D, empty, of another type, or an id twice; naming `name`, the
            value and the fix.
    """
    array = np.asarray(ids)
    if array.dtype == object and all(isinstance(value, str) for value in array.ravel()):
        array = array.astype(str)
    if array.ndim != 1 or not len(array) or array.dtype.kind not in "iuU":
        raise ValueError(
            f"{name} must be a non-empty 1-D array of whole numbers or strings (the raw id of "
            f"each row, e.g. Interactions.user_ids), got {_describe(array)}."
        )
    if array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
        raise ValueError(
            f"{name} holds {array.max()}, beyond int64; pass the ids as strings instead."
        )
    if array.dtype.kind in "iu":
        array = array.astype(np.int64)
    distinct, counts = np.unique(array, return_counts=True)
    if len(distinct) != len(array):
        twice = np.flatnonzero(counts > 1)[0]
        raise ValueError(
            f"{name} holds the id {distinct[twice].item()!r} {counts[twice]} times; give each "
            "row its own "
            "id (one raw id, one index)."
        )
    if array.dtype.kind == "U":
        _check_told_apart(name, array)
    return array


def _check_told_apart(name: str, ids: np.ndarray) -> None:
    """Refuses two string ids a request cannot tell apart (`canonical_text.canonical_key`)."""
    seen: dict[str, str] = {}
    for value in ids.tolist():
        key = canonical_text.canonical_key(value)
        if key in seen:
            raise ValueError(
                f"{name} holds the ids {ascii(seen[key])} and {ascii(value)}, which a served "
                "request cannot tell apart (ids are compared without the blanks around them, in "
                "Unicode's canonical form, as the log reader merges them); give the two one "
                "row (one raw id, one index)."
            )
        seen[key] = value


def id_type(ids: np.ndarray) -> str:
    """ "int64" or "string": how `ids` (from `checked_ids`) are sent to and returned by a model."""
    return "string" if ids.dtype.kind == "U" else "int64"


def tensor_type(ids: np.ndarray) -> tf.DType:
    """tf.int64 or tf.string: the serving signature's dtype for `ids` (from `checked_ids`)."""
    return _ID_TYPES[id_type(ids)]


def lookup_table(ids: np.ndarray) -> tf.lookup.StaticHashTable:
    """raw id -> its index (int64), -1 for an id `ids` does not hold; saved with a SavedModel.
    A string id is keyed by its `canonical_text.canonical_key`: look requests up by `lookup`."""
    keys = ids
    if id_type(ids) == "string":
        keys = np.asarray([canonical_text.canonical_key(value) for value in ids.tolist()])
    initializer = tf.lookup.KeyValueTensorInitializer(
        tf.constant(keys, tensor_type(ids)), tf.range(len(ids), dtype=tf.int64)
    )
    return tf.lookup.StaticHashTable(initializer, default_value=-1)


def lookup(table: tf.lookup.StaticHashTable, requests: tf.Tensor) -> tf.Tensor:
    """Each requested id's index in a `lookup_table` (int64, -1 unknown). A string is read as
    the log's reader reads an id (blanks around it removed, accents composed or not alike:
    "cafe\u0301 " finds "café"), so a request of the log's own bytes finds its id."""
    if requests.dtype == tf.string:
        requests = canonical_text.canonical(requests)
    return table.lookup(requests)


def ids_json(users, items) -> str:
    """The text of `ids.json`: each kind's id type and its raw ids in index order.

    Raises:
        ValueError: bad ids (`checked_ids`).
    """
    users, items = checked_ids("user_ids", users), checked_ids("item_ids", items)
    payload = {
        "about": (
            "The raw id of each row of the model: users[i] and items[i] are the ids of the "
            "log's user and item with index i."
        ),
        "user_id_type": id_type(users),
        "item_id_type": id_type(items),
        "users": users.tolist(),
        "items": items.tolist(),
    }
    return json.dumps(payload, indent=1) + "\n"


def read_ids(directory: str) -> dict[str, np.ndarray]:
    """{"users": ..., "items": ...}: the raw ids of each index that `directory`'s `ids.json`
    holds (a run's MODEL_DIR or a recommender export), int64 or str.

    Raises:
        OSError: no `ids.json` there.
        ValueError: it does not read as one.
    """
    path = os.path.join(directory, ID_FILE)
    with open(path, encoding="utf-8") as stream:
        try:
            payload = json.load(stream)
            return {
                kind: np.asarray(payload[kind], _numpy_type(payload[f"{kind[:-1]}_id_type"]))
                for kind in ("users", "items")
            }
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path} is not an id vocabulary ({error!r}); the recommender binary writes it "
                "as training starts: rerun the run's command to write it again."
            ) from None


def _numpy_type(name: str):
    if name not in _ID_TYPES:
        raise ValueError(f"unknown id type {name!r}")
    return np.int64 if name == "int64" else str


def _describe(array: np.ndarray) -> str:
    if array.ndim != 1:
        return f"shape {array.shape}"
    if not len(array):
        return "no ids"
    return f"dtype {array.dtype.name}"
