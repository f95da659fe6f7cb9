"""A block of a feature log (a pyarrow table) turned into a click-through model's arrays, and
into its statistics, by vectorized pyarrow and numpy operations: the same arrays and figures as
`feature_tables`' row-by-row reading, without a Python step a value. Where a block holds
something that reading decides value by value (an empty categorical field of a number column,
a float category, a field that is no number, a value past float32's range, bytes that are not
UTF-8), these functions answer None and the caller reads the block row by row, whose sentence
names the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.input.feature_tables import (
    PAD_ID,
    Column,
    FeatureSpec,
    FittedFeatures,
    bucket_ids,
    bucket_name,
)

# pyarrow is installed with tensorflow-datasets; these functions run only on sharded logs.


def _pa():
    import pyarrow
    import pyarrow.compute

    return pyarrow, pyarrow.compute


def texts(array: Any) -> Any | None:
    """A column's values as the text `feature_tables` reads them ("3" for 3 and 3.0), nulls
    kept; None where that text needs a value-by-value reading (floats that are not whole,
    booleans, lists, binary)."""
    pa, pc = _pa()
    array = array.combine_chunks() if hasattr(array, "combine_chunks") else array
    kind = array.type
    if pa.types.is_dictionary(kind):
        return texts(array.dictionary_decode())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.cast(pa.string())
    if pa.types.is_integer(kind):
        return array.cast(pa.string())
    if pa.types.is_floating(kind):
        valid = array.drop_null()
        whole = pc.all(pc.equal(pc.floor(valid), valid)).as_py() if len(valid) else True
        if not whole or (len(valid) and pc.max(pc.abs(valid)).as_py() >= 2.0**53):
            return None
        return array.cast(pa.int64()).cast(pa.string())
    return None


def numbers(column: Column, array: Any) -> np.ndarray | None:
    """A numeric column's values as float64 (log1p'd for normalize=log), as `numbers_of`
    reads them; None where a field is empty without a fill, no number, not finite, or
    negative under normalize=log."""
    pa, pc = _pa()
    array = array.combine_chunks() if hasattr(array, "combine_chunks") else array
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        stripped = pc.utf8_trim_whitespace(array)
        array = pc.if_else(pc.equal(stripped, ""), pa.scalar(None, pa.string()), stripped)
    elif not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
        return None
    try:
        values = array.cast(pa.float64())
    except (pa.ArrowException, ValueError):
        return None
    if values.null_count:
        if column.option("fill") is None:
            return None
        values = values.fill_null(float(column.option("fill")))
    found = values.to_numpy(zero_copy_only=False)
    if not np.isfinite(found).all():
        return None
    if column.option("normalize") == "log":
        if (found < 0).any():
            return None
        return np.log1p(found)
    return found


def bags(column: Column, array: Any) -> tuple[Any, np.ndarray] | None:
    """A categorical or multi-hot column's values: (their texts, flat; each row's count), as
    `bags_of` reads them; None where that needs a value-by-value reading."""
    pa, pc = _pa()
    array = array.combine_chunks() if hasattr(array, "combine_chunks") else array
    if column.kind == "categorical":
        if pa.types.is_dictionary(array.type):
            values = texts(array.dictionary)
            if values is None:
                return None
            # The dictionary's values as text, each row's index kept (null: an empty field).
            return pa.DictionaryArray.from_arrays(array.indices, values), np.ones(
                len(array), np.int64
            )
        found = texts(array)
        if found is None:
            return None
        return found.fill_null(""), np.ones(len(found), np.int64)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        flat = texts(pc.list_flatten(array))
        if flat is None or flat.null_count:
            return None
        counts = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        return flat, counts.astype(np.int64)
    found = texts(array)
    if found is None:
        return None
    found = pc.if_else(pc.equal(found, ""), pa.scalar(None, pa.string()), found)
    split = pc.split_pattern(found, pattern=column.option("separator"))
    counts = pc.list_value_length(split).fill_null(0).to_numpy(zero_copy_only=False)
    return pc.list_flatten(split), counts.astype(np.int64)


def crossed(column: Column, table: Any) -> Any | None:
    """A crossed column's joined texts, as `feature_tables` joins them; None where a value is
    a list or holds the separator (refused, with its row, by the row-by-row reading)."""
    pa, pc = _pa()
    separator = column.option("separator")
    parts = []
    for source in column.crosses():
        found = texts(table[source])
        if found is None:
            return None
        found = found.fill_null("")
        if pc.any(pc.match_substring(found, separator)).as_py():
            return None
        parts.append(found)
    return pc.binary_join_element_wise(*parts, separator)


def _values(column: Column, table: Any) -> tuple[Any, np.ndarray] | None:
    if column.crosses():
        joined = crossed(column, table)
        return None if joined is None else (joined, np.ones(len(joined), np.int64))
    return bags(column, table[column.name])


def labels(spec: FeatureSpec, table: Any) -> tuple[np.ndarray, set[str]] | None:
    """The labels as 0/1 float32 and the label texts seen (with `positive`); None where a
    label needs a value-by-value reading."""
    _, pc = _pa()
    array = table[spec.label]
    if spec.positive is not None:
        found = texts(array)
        if found is None or found.null_count:
            return None
        seen = set(pc.unique(found).to_pylist())
        return pc.equal(found, spec.positive).to_numpy(zero_copy_only=False).astype(
            np.float32
        ), seen
    try:
        values = numbers(Column(spec.label, "numeric", {"normalize": "none"}), array)
    except Exception:  # noqa: BLE001 - any surprise is read row by row
        return None
    if values is None or not np.isin(values, (0.0, 1.0)).all():
        return None
    return values.astype(np.float32), set()


class Prepared:
    """A fitted spec's vectorized preparation of blocks (`arrays`), each vocabulary's value set
    built once."""

    def __init__(self, fitted: FittedFeatures):
        pa, _ = _pa()
        self.fitted = fitted
        self._empty_ids: dict[str, int] = {}  # the row of an empty field, by column
        self._vocabularies = {
            name: pa.array(values, pa.string()) for name, values in fitted.vocabularies.items()
        }

    def arrays(self, table: Any) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
        """(column -> array, labels) as `FittedFeatures.arrays` gives them, or None (above)."""
        found = labels(self.fitted.spec, table)
        if found is None or any(
            n not in table.column_names for n in read_columns(self.fitted.spec)
        ):
            return None
        columns = {}
        for column in self.fitted.spec.columns:
            if column.kind == "numeric":
                values = numbers(column, table[column.name])
                if values is None:
                    return None
                normalized = self._normalized(column, values)
                if normalized is None:
                    return None
                columns[column.name] = normalized
                if column.name in self.fitted.boundaries:
                    bounds = self.fitted.boundaries[column.name]
                    columns[bucket_name(column.name)] = bucket_ids(values, bounds)
                continue
            read = _values(column, table)
            if read is None:
                return None
            columns[column.name] = self._ids(column, *read)
        return columns, found[0]

    def _normalized(self, column: Column, values: np.ndarray) -> np.ndarray | None:
        center, deviation = self.fitted.scales[column.name]
        with np.errstate(over="ignore", invalid="ignore"):
            normalized = (values - center) / deviation
            prepared = normalized.astype(np.float32)
        return prepared if np.isfinite(prepared).all() else None

    def _ids(self, column: Column, flat: Any, counts: np.ndarray) -> np.ndarray:
        pa, pc = _pa()
        if pa.types.is_dictionary(flat.type):
            # Each distinct value mapped once, then taken by each row's index; a null is "".
            dictionary = pc.if_else(pc.is_null(flat.dictionary), "", flat.dictionary)
            values = np.append(self._ids(column, dictionary, np.ones(len(dictionary))), 0)
            values[-1] = self._empty_ids.setdefault(
                column.name, int(self._ids(column, pa.array([""]), np.ones(1))[0])
            )
            index = flat.indices.fill_null(len(dictionary)).to_numpy(zero_copy_only=False)
            return values[index]  # a categorical column's (bags are never dictionaries)
        buckets = column.hash_buckets()
        if buckets:
            import tensorflow as tf

            values = flat.to_numpy(zero_copy_only=False).astype(object)
            if len(values):
                ids = tf.strings.to_hash_bucket_fast(values, buckets).numpy().astype(np.int64)
            else:
                ids = np.zeros(0, np.int64)
        else:
            index = pc.index_in(flat, value_set=self._vocabularies[column.name])
            ids = index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
        if column.kind == "categorical":
            return ids
        return self._padded(ids, counts)

    @staticmethod
    def _padded(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Each row's bag of ids, padded with `PAD_ID` to the longest of the rows."""
        width = max(1, int(counts.max()) if len(counts) else 1)
        padded = np.full((len(counts), width), PAD_ID, np.int64)
        padded[np.arange(width)[None, :] < counts[:, None]] = ids
        return padded


def read_columns(spec: FeatureSpec) -> list[str]:
    """The columns of a table a spec reads."""
    names = [spec.label]
    for column in spec.columns:
        names += list(column.crosses()) or [column.name]
    return names


def value_counts(column: Column, table: Any) -> Mapping[str, int] | None:
    """Each value's count in a vocabulary column of a block, or None (above)."""
    _, pc = _pa()
    read = _values(column, table)
    if read is None:
        return None
    pa = _pa()[0]
    flat = read[0]
    if pa.types.is_dictionary(flat.type):
        # Counted by index, then named: a null row is the value "".
        index = flat.indices.fill_null(len(flat.dictionary)).to_numpy(zero_copy_only=False)
        tally = np.bincount(index, minlength=len(flat.dictionary) + 1)
        names = [*pc.if_else(pc.is_null(flat.dictionary), "", flat.dictionary).to_pylist(), ""]
        counts: dict[str, int] = {}
        for name, count in zip(names, tally.tolist()):
            if count:
                counts[name] = counts.get(name, 0) + count
        return counts
    counted = pc.value_counts(flat)
    return dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()))
