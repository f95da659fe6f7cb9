"""Maps a table's ids (row numbers, strings, int64 hashes, a vocabulary's words) to its rows.

Collision policy of the hashed kinds: ids that hash to the same row share it
(and its optimizer state); nothing is detected or refused. Hashing is FarmHash's
fingerprint64 (`tf.strings.to_hash_bucket_fast`) modulo the row count, the same
on every task, run and platform. With `n` distinct ids over `R` rows,
`expected_collisions(n, R)` ids on average find their row already taken:
about n**2 / (2 R) while n is much below R (1M ids in 100M rows: ~5,000).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import tensorflow as tf

from loops.vocabulary.whole_numbers import is_whole

ID_KINDS = ("rows", "strings", "hashes")


def check_id_kind(ids: str, rows: int, vocabulary: Sequence[str] | None, oov_buckets: int) -> None:
    """Refuses an unknown id kind or a vocabulary that does not fit `rows`.

    Raises:
        ValueError: naming the value and the fix.
    """
    if ids not in ID_KINDS:
        raise ValueError(f"EmbeddingTable(ids={ids!r}): choose one of {', '.join(ID_KINDS)}.")
    if vocabulary is None:
        return
    if ids != "strings":
        raise ValueError(
            f"EmbeddingTable(ids={ids!r}) with a vocabulary: a vocabulary maps strings; "
            "pass ids='strings'."
        )
    if not is_whole(oov_buckets, 1):
        raise ValueError(
            f"EmbeddingTable(oov_buckets={oov_buckets!r}) needs a whole number >= 1: the rows "
            "that words outside the vocabulary hash to."
        )
    if len(vocabulary) + oov_buckets != rows or len(set(vocabulary)) != len(vocabulary):
        raise ValueError(
            f"EmbeddingTable(rows={rows}) with a vocabulary of {len(vocabulary)} words "
            f"({len(set(vocabulary))} distinct) and oov_buckets={oov_buckets}: the rows are "
            f"the distinct words then the buckets; pass rows={len(vocabulary) + oov_buckets} "
            "and words without repeats."
        )


def checked_vocabulary(vocabulary: object) -> list[str]:
    """`vocabulary` as a list of words, or a ValueError naming what is wrong with it.

    A vocabulary is a non-empty sequence of strings (bytes are decoded as
    UTF-8); a bare string is refused, since it would be read as its letters.
    """
    if isinstance(vocabulary, (str, bytes)) or not isinstance(vocabulary, Iterable):
        raise ValueError(
            f"EmbeddingTable(vocabulary={vocabulary!r}) needs a list of words, e.g. "
            "vocabulary=['cat', 'dog']."
        )
    words = list(vocabulary)
    if not words:
        raise ValueError(
            "EmbeddingTable(vocabulary=[]) holds no word: pass the words that get rows of "
            "their own, or no vocabulary to hash every string (ids='strings')."
        )
    for index, word in enumerate(words):
        if isinstance(word, bytes):
            words[index] = word.decode("utf-8")
        elif not isinstance(word, str):
            raise ValueError(
                f"EmbeddingTable(vocabulary=...): word {index} is {word!r} "
                f"({type(word).__name__}); a vocabulary holds strings (str(word) for numbers)."
            )
    return words


def hashed_rows(ids: tf.Tensor, rows: int) -> tf.Tensor:
    """The row of each string or integer id: fingerprint64 of its text modulo `rows`."""
    if ids.dtype != tf.string:
        ids = tf.strings.as_string(ids)
    return tf.strings.to_hash_bucket_fast(ids, rows)


def vocabulary_lookup(
    vocabulary: Sequence[str], oov_buckets: int
) -> tf.lookup.StaticVocabularyTable:
    """Word i of `vocabulary` to row i; any other string to one of the `oov_buckets` rows after."""
    words = tf.constant(list(vocabulary), tf.string)
    initializer = tf.lookup.KeyValueTensorInitializer(
        words, tf.range(len(vocabulary), dtype=tf.int64), tf.string, tf.int64
    )
    return tf.lookup.StaticVocabularyTable(initializer, oov_buckets)


def expected_collisions(distinct_ids: int, rows: int) -> float:
    """The mean count of ids whose hashed row another of `distinct_ids` ids already took.

    Ids minus the rows expected to be used: n - R (1 - (1 - 1/R)**n).
    """
    return distinct_ids - rows * (1.0 - (1.0 - 1.0 / rows) ** distinct_ids)
