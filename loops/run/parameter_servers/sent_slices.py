"""What a slice's closure sends the chief in the exact parameter-server mode: its loss, count,
logs and gradients packed into one tensor per dtype and one vector of their shapes, unpacked
on the chief.

The chief copies each tensor a closure returns from its worker one round trip
at a time (`RemoteValue.fetch`), so a closure returns few: the parts of one
dtype flattened and concatenated, and every part's shape in one int64 vector.
A table's gradient is sent as three parts (its rows, their ids, the table's
shape). What the chief needs to cut them apart again and that is fixed when
the closure is traced (which part is which, their ranks, dtypes and static
shapes) is noted then, in a `SliceLayout`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import tensorflow as tf


class SliceResult(NamedTuple):
    """One slice's results, as the chief unpacks them."""

    loss: tf.Tensor
    count: tf.Tensor
    logs: dict[str, tf.Tensor]
    # Per gradient that is not None: a dense tensor, or a table's (rows, ids, shape).
    gradients: list[Any]


class SliceLayout:
    """How a closure's results are packed, noted when it is traced; `key` is its hashable
    summary, which the chief's traced unpacking takes."""

    def __init__(self) -> None:
        self.present: list[bool] = []  # which of the Update's variables have a gradient
        self.key: tuple = ()  # (log names, rows flags, dtypes, static shapes)

    def packed(
        self, loss, count, logs: Mapping[str, tf.Tensor], gradients: Sequence[Any]
    ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """{dtype name: its parts flattened and concatenated}, and the parts' shapes: what
        the closure returns on its worker (a remote function returns neither None nor an
        IndexedSlices)."""
        self.present = [gradient is not None for gradient in gradients]
        kept = [gradient for gradient in gradients if gradient is not None]
        names = tuple(sorted(logs))
        parts = [loss, count, *(logs[name] for name in names)]
        for gradient in kept:
            if isinstance(gradient, tf.IndexedSlices):
                parts += [gradient.values, gradient.indices, gradient.dense_shape]
            else:
                parts.append(gradient)
        dtypes = tuple(part.dtype.name for part in parts)
        shapes = tuple(tuple(part.shape.as_list()) for part in parts)
        rows = tuple(isinstance(gradient, tf.IndexedSlices) for gradient in kept)
        self.key = (names, rows, dtypes, shapes)
        packs = {
            name: tf.concat([tf.reshape(p, [-1]) for p in parts if p.dtype.name == name], 0)
            for name in sorted(set(dtypes))
        }
        return packs, tf.concat([tf.shape(part, out_type=tf.int64) for part in parts], 0)


def unpacked(packs: Mapping[str, tf.Tensor], shapes: tf.Tensor, key: tuple) -> SliceResult:
    """A closure's packed results cut apart as `SliceLayout.packed` joined them (`key`: the
    layout's); in a traced function on the chief."""
    names, rows, dtypes, static = key
    dims = tf.split(shapes, [len(shape) for shape in static], num=len(static))
    parts: list[Any] = [None] * len(static)
    for name in sorted(set(dtypes)):
        indices = [index for index, dtype in enumerate(dtypes) if dtype == name]
        sizes = tf.stack([tf.reduce_prod(dims[index]) for index in indices])
        pieces = tf.split(tf.convert_to_tensor(packs[name]), sizes, num=len(indices))
        for index, piece in zip(indices, pieces):
            parts[index] = tf.ensure_shape(tf.reshape(piece, dims[index]), static[index])
    loss, count, *rest = parts
    logs = dict(zip(names, rest[: len(names)]))
    remaining = rest[len(names) :]
    gradients: list[Any] = []
    for is_rows in rows:
        taken = 3 if is_rows else 1
        gradients.append(tuple(remaining[:taken]) if is_rows else remaining[0])
        remaining = remaining[taken:]
    return SliceResult(loss, count, logs, gradients)
