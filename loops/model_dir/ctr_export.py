"""The click-through model's export: a SavedModel that scores a feature table's raw rows (or
its prepared ones), flagging a row it cannot score (`export_ctr`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from loops.input.feature_tables import DYNAMIC_BUCKETS, FittedFeatures
from loops.model_dir import export, signature_names
from loops.model_dir.prepared_rows import PreparedRows
from loops.model_dir.raw_features import RawFeatures


def export_ctr(
    model: keras.Model,
    export_dir: str,
    *,
    files: dict[str, str] | None = None,
    fitted: FittedFeatures | None = None,
    cardinalities: Mapping[str, int] | None = None,
    known_ids: Mapping[str, Any] | None = None,
) -> str:
    """Saves a click-through model with a `serve` signature: its columns in, the click
    probability out.

    With `fitted` (the vocabularies, hash buckets and scales of a feature table's training
    rows), the default signature takes the raw columns (`RawFeatures`: numbers
    float64 [n], categories string [n], multi-hot values string [n] joined by the column's
    separator; a value training did not keep goes to its out-of-vocabulary row) and
    `serve_prepared` the prepared ones; a crossed column is no input of it, the columns it
    crosses are (`RawFeatures` joins them). Without `fitted`, the default
    signature takes the model's inputs, prepared as in training
    (`loops.input.feature_tables`: numeric float32 [n] normalized, categorical int32 [n]
    rows, multi-hot int32 [n, length] rows padded with -1). Each input is named
    `signature_names.served_name` of its column (native-country -> native_country).

    Each signature gives `logits` and `probabilities`, float32 [n], and `valid_row`, bool
    [n]: False for a row the model cannot score, whose logit and probability are NaN (never
    a number that reads as a prediction): a raw number training refuses (NaN, inf, a negative
    in a `normalize=log` column) or one beyond float32 once scaled, a prepared number that is
    not finite, a categorical row outside [0, rows) (-1 included) or a multi-hot one outside
    it but the padding -1. Keras and placed tables answer alike. `files` (name -> text) are
    saved beside the SavedModel, e.g. `FittedFeatures.to_json`.

    A dynamic column (`fitted.dynamic_columns()`) takes any raw value: its 64-bit
    fingerprint is looked up in its `loops.DynamicTable`'s map, and an id without a row
    reads zeros; `known_ids` (column -> its table) adds `<column>_known` to each signature,
    bool of the column's shape: whether each id holds a row (False for padding).

    Args:
        cardinalities: each id column's table rows (CTRFeatures'); needed without `fitted`
            (which holds them) when the model has an id column.
        known_ids: each dynamic column's `loops.DynamicTable`, whose map says which ids it
            knows.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory; an id column of
            no known rows; two columns served under one name (`signature_names`).
    """
    tables = dict(fitted.cardinalities() if fitted is not None else cardinalities or {})
    if fitted is not None:
        # A dynamic column's ids are raw fingerprints: any below the reserved one is its own.
        tables.update(dict.fromkeys(fitted.dynamic_columns(), DYNAMIC_BUCKETS))
    rows = PreparedRows(model, tables)
    known_ids = dict(known_ids or {})
    dtypes = {column.name: column.dtype for column in model.inputs}
    served = signature_names.served_names(list(dtypes), "serve_prepared")
    raw_features = RawFeatures(fitted) if fitted is not None else None
    raw_signature = raw_features.signature() if raw_features is not None else None
    nan = tf.constant(np.nan, tf.float32)

    def scored(columns, takes=None):
        columns = {name: tf.cast(values, dtypes[name]) for name, values in columns.items()}
        safe, valid = rows.checked(columns)
        valid = valid if takes is None else valid & takes
        logits = tf.reshape(tf.cast(model(safe, training=False), tf.float32), [-1])
        logits = tf.where(valid, logits, nan)
        scores = {"logits": logits, "probabilities": tf.sigmoid(logits), "valid_row": valid}
        for name, table in known_ids.items():
            ids = columns[name]
            scores[f"{name}_known"] = table.known(tf.maximum(ids, 0)) & (ids >= 0)
        return scores

    signature = {
        column.name: tf.TensorSpec(column.shape, column.dtype, name=served[column.name])
        for column in model.inputs
    }
    server = export.Server(model, lambda columns: scored(columns), signature)
    if raw_features is None:
        return export.save(server, export_dir, files=files)
    server.raw_features = raw_features
    server.serve_raw = tf.function(
        lambda columns: scored(raw_features(columns), raw_features.takes(columns)),
        input_signature=[raw_signature],
        autograph=False,  # no control flow on tensors to convert
    )
    signatures = {"serving_default": server.serve_raw, "serve_prepared": server.serve}
    return export.save(server, export_dir, signatures=signatures, files=files)
