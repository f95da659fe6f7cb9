"""Text in one canonical form, in Python and as TensorFlow ops: the blanks around it removed,
then decomposed as Unicode's NFD, so that an export finds a log's id (which the reader keeps
stripped and composed, NFC) however a client spaced it or composed its accents.

Two texts have one NFC form exactly when they have one NFD form (both are forms of canonical
equivalence), and NFD needs no composition, which is sequential: a served graph decomposes
each code point by a table, then sorts each run of combining marks by their combining class.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import NamedTuple

import numpy as np
import tensorflow as tf

# Hangul syllables decompose by arithmetic, not by a table (Unicode's chapter 3.12).
_HANGUL_FIRST, _HANGUL_COUNT = 0xAC00, 11172
_LEADING, _VOWEL, _TRAILING = 0x1100, 0x1161, 0x11A7
_VOWELS_TIMES_TRAILING, _TRAILING_COUNT = 588, 28


def canonical_key(text: str) -> str:
    """`text` as `canonical` gives it: `str.strip()`, then NFD."""
    return unicodedata.normalize("NFD", text.strip())


class _Tables(NamedTuple):
    spaces: str  # a regular expression of what str.strip() removes, at either end
    decomposed: np.ndarray  # the code points with a canonical decomposition, sorted
    parts: np.ndarray  # [len(decomposed), width] their NFD, padded with -1
    marks: np.ndarray  # the code points of a combining class above 0, sorted
    classes: np.ndarray  # their classes


@functools.lru_cache(maxsize=1)
def _tables() -> _Tables:
    spaces = "".join(f"\\x{{{point:x}}}" for point in range(0x3001) if chr(point).isspace())
    decomposed, parts, marks, classes = [], [], [], []
    for point in range(0x110000):
        character = chr(point)
        if unicodedata.combining(character):
            marks.append(point)
            classes.append(unicodedata.combining(character))
        hangul = 0 <= point - _HANGUL_FIRST < _HANGUL_COUNT
        if unicodedata.decomposition(character) and not hangul:
            text = unicodedata.normalize("NFD", character)
            if text != character:
                decomposed.append(point)
                parts.append([ord(part) for part in text])
    width = max(3, max(map(len, parts)))  # 3: a Hangul syllable's jamo
    padded = np.full((len(parts), width), -1, np.int32)
    for row, part in enumerate(parts):
        padded[row, : len(part)] = part
    return _Tables(
        f"^[{spaces}]+|[{spaces}]+$",
        np.asarray(decomposed, np.int32),
        padded,
        np.asarray(marks, np.int32),
        np.asarray(classes, np.int32),
    )


def canonical(texts: tf.Tensor) -> tf.Tensor:
    """string [n] -> string [n]: each text's `canonical_key`, as TensorFlow ops. Bytes that are
    not UTF-8 become NUL, which no log's id holds."""
    tables = _tables()
    stripped = tf.strings.regex_replace(texts, tables.spaces, "")
    points = tf.strings.unicode_decode(stripped, "UTF-8", errors="replace", replacement_char=0)
    parts = _decomposed(points.flat_values, tables)
    kept = parts >= 0
    flat = tf.boolean_mask(parts, kept)
    rows = tf.boolean_mask(tf.broadcast_to(points.value_rowids()[:, None], tf.shape(parts)), kept)
    classes = _looked_up(tables.marks, tables.classes, flat, tf.zeros_like(flat))
    # A run of marks starts after each starter (class 0) and at each text's start; sorting by
    # (run, class), stably, is Unicode's canonical ordering.
    first = tf.not_equal(rows, tf.concat([tf.constant([-1], rows.dtype), rows], 0)[:-1])
    runs = tf.cumsum(tf.cast((classes == 0) | first, tf.int64))
    order = tf.argsort(runs * 256 + tf.cast(classes, tf.int64), stable=True)
    ordered = tf.RaggedTensor.from_value_rowids(
        tf.gather(flat, order), tf.gather(rows, order), nrows=tf.shape(texts, tf.int64)[0]
    )
    return tf.strings.unicode_encode(ordered, "UTF-8")


def _decomposed(points: tf.Tensor, tables: _Tables) -> tf.Tensor:
    """int32 [m] -> int32 [m, width]: each code point's canonical decomposition, padded
    with -1 (itself where it has none)."""
    width = tables.parts.shape[1]
    itself = tf.concat([points[:, None], tf.fill([tf.size(points), width - 1], -1)], 1)
    parts = _looked_up(tables.decomposed, tables.parts, points, itself)
    syllable = points - _HANGUL_FIRST
    trailing = syllable % _TRAILING_COUNT
    jamo = tf.stack(
        [
            _LEADING + syllable // _VOWELS_TIMES_TRAILING,
            _VOWEL + syllable % _VOWELS_TIMES_TRAILING // _TRAILING_COUNT,
            tf.where(trailing > 0, _TRAILING + trailing, -1),
            *([tf.fill(tf.shape(points), -1)] * (width - 3)),
        ],
        1,
    )
    hangul = (syllable >= 0) & (syllable < _HANGUL_COUNT)
    return tf.where(hangul[:, None], jamo, parts)


def _looked_up(keys: np.ndarray, values: np.ndarray, points: tf.Tensor, default: tf.Tensor):
    """Each point's row of `values` where `keys` (sorted) holds it, else its `default` row."""
    at = tf.minimum(tf.searchsorted(tf.constant(keys), points), len(keys) - 1)
    found = tf.gather(tf.constant(keys), at) == points
    if default.shape.rank == 2:
        found = found[:, None]
    return tf.where(found, tf.gather(tf.constant(values), at), default)
