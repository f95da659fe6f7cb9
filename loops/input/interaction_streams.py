"""An interaction log kept as shards (`sharded_logs`: Parquet, TFRecord, CSV or TSV): its user,
item and rating columns found by their names, its raw ids numbered by one streaming pass over
every row as `interaction_logs.read_interactions` numbers a file's, split by each row's place in
its shard (`streaming_fit.Split`, the click log's rule) or by a global time cut, and read as a
recommender's global batches in bounded memory (`log_streams`).

What the pass holds: each distinct user and item id with its training rows, and the training
ratings' sum (memory grows with the ids, never with the rows). A block is prepared for the step
by a binary search of its raw ids in the sorted ids, so a row's indices are the ones the
in-memory reader gives the same log. A time split of a stream is global, not each user's
latest rows: the test rows are those at or after a cut in time that a first pass over the
timestamps places at the test fraction's quantile (`time_cuts`), as a log of days is split
into the days trained on and the latest ones.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterator
from typing import Any

import numpy as np

from loops.input import interaction_logs, log_streams
from loops.input.interaction_logs import COLUMN_NAMES, ID_RULE, WHOLE_NUMBER, Interactions
from loops.input.sharded_logs import BlockTable, LogPart, ShardedLog, row_fractions
from loops.input.streaming_fit import Split
from loops.vocabulary.whole_numbers import is_whole

PARTS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Roles:
    """The log's column for each role: user and item, rating (None: an implicit log) and
    timestamp (None: a log a time split refuses)."""

    user: str
    item: str
    rating: str | None
    timestamp: str | None = None


def roles_of(log: ShardedLog) -> Roles:
    """The columns of `log` named as `interaction_logs.COLUMN_NAMES` names each role (lower
    case, a RecBole `:type` suffix left out).

    Raises:
        ValueError: no user or item column, or two columns of one role, naming the columns.
    """
    found: dict[str, str] = {}
    for column in log.columns:
        plain = interaction_logs.column_name(column)
        role = next((r for r, names in COLUMN_NAMES.items() if plain in names), None)
        if role is None:
            continue
        if role in found:
            raise ValueError(
                f"{log.root} has two {role} columns ({found[role]} and {column}); keep one, "
                "or rename the other."
            )
        found[role] = column
    for needed in ("user", "item"):
        if needed not in found:
            raise ValueError(
                f"{log.root} has no {needed} column (its columns: {', '.join(log.columns)}); "
                f"name it {' or '.join(COLUMN_NAMES[needed])}."
            )
    return Roles(found["user"], found["item"], found.get("rating"), found.get("timestamp"))


def _raw_ids(block: BlockTable, column: str, role: str) -> np.ndarray:
    """A block's ids of `column` as they are stored: int64 for an integer column, else text;
    a missing one refused naming its shard and row."""
    values = block.arrow[column]
    missing = values.null_count
    if missing:
        row = next(r for r, v in enumerate(values.is_null().to_pylist()) if v)
        raise ValueError(
            f"{block.path} {block.row_word} {block.first_row + _row_in(block, row)}: the {role} "
            f"id is empty ({ID_RULE}); give every interaction its {role}'s id."
        )
    array = values.to_numpy(zero_copy_only=False)
    if array.dtype.kind in "iu":
        return array.astype(np.int64)
    return np.asarray([str(v.decode() if isinstance(v, bytes) else v) for v in array], str)


def _row_in(block: BlockTable, row: int) -> int:
    return int(row if block.rows is None else np.asarray(block.rows)[row])


def _composed(text: str) -> str:
    return unicodedata.normalize("NFC", text.strip())


@dataclasses.dataclass(frozen=True, eq=False)
class FittedIds:
    """What the pass found: the raw ids (sorted, int64 when all are whole numbers, else text),
    each id's training rows, the training ratings' sum and each part's rows."""

    user_ids: np.ndarray
    item_ids: np.ndarray
    user_rows: np.ndarray
    item_rows: np.ndarray
    rating_sum: float
    rows: dict[str, int]
    source: str = ""
    block_rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def item_counts(self) -> np.ndarray:
        """Each item's training rows, int64 (popularity, sampling frequencies)."""
        return self.item_rows

    def mean_rating(self) -> float:
        return self.rating_sum / max(self.rows["train"], 1)

    def to_json(self) -> dict[str, Any]:
        """Every figure as JSON (ids as their values), for a resume to read back."""
        return {
            "user_ids": self.user_ids.tolist(),
            "item_ids": self.item_ids.tolist(),
            "user_rows": self.user_rows.tolist(),
            "item_rows": self.item_rows.tolist(),
            "rating_sum": self.rating_sum,
            "rows": self.rows,
            "source": self.source,
            "block_rows": {part: counts.tolist() for part, counts in self.block_rows.items()},
        }

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> FittedIds:
        def ids(values: list) -> np.ndarray:
            whole = all(is_whole(v) for v in values)
            return np.asarray(values, np.int64 if whole else str)

        return cls(
            ids(saved["user_ids"]),
            ids(saved["item_ids"]),
            np.asarray(saved["user_rows"], np.int64),
            np.asarray(saved["item_rows"], np.int64),
            float(saved["rating_sum"]),
            {part: int(count) for part, count in saved["rows"].items()},
            str(saved["source"]),
            {p: np.asarray(c, np.int64) for p, c in saved["block_rows"].items()},
        )


def _numbered(texts: dict[str, int], role: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ids of `texts` (raw text -> training rows) as `read_interactions` numbers
    them (composed, whole numbers as int64), and the training rows of each."""
    raw = list(texts)
    composed = np.asarray([_composed(t) for t in raw] or [""], str)[: len(raw)]
    for value in set(composed.tolist()):
        control = next((c for c in value if unicodedata.category(c) == "Cc"), None)
        if not value or control is not None:
            what = "is empty" if not value else f"{value!r} holds {ascii(control)}"
            raise ValueError(f"{where}: a {role} id {what} ({ID_RULE}); mend it.")
    keys: np.ndarray = composed
    if all(WHOLE_NUMBER.fullmatch(v) for v in composed.tolist()):
        beyond = next((v for v in composed.tolist() if not interaction_logs.fits_int64(v)), None)
        if beyond is not None:
            raise ValueError(
                f"{where}: the {role} id {beyond!r} is a whole number beyond 64 bits; number "
                f"the {role}s within 64 bits, or give every id a letter first."
            )
        keys = composed.astype(np.int64)
    distinct, inverse = np.unique(keys, return_inverse=True)
    rows = np.bincount(inverse.reshape(-1), np.asarray(list(texts.values()), np.float64))
    return distinct, np.rint(rows).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class TimeCuts:
    """A time split of a stream: the test rows are those at or after `test_from`, the
    validation rows those at or after `validation_from` before it (equal: no validation)."""

    column: str
    test_from: int
    validation_from: int

    def ranges(self) -> dict[str, tuple[int | None, int | None]]:
        return {
            "test": (self.test_from, None),
            "validation": (self.validation_from, self.test_from),
            "train": (None, self.validation_from),
        }


def time_cuts(log: ShardedLog, column: str, split: Split) -> TimeCuts:
    """The cuts of a global time split by one pass over the timestamps (a quantile sketch
    merged in block order, `streaming_fit.Sketch`): about `test_fraction` of the rows at or
    after the test cut, and `validation_fraction` of the rest after the validation cut, each
    within about rows / 2048 rows of it (exact for a log of fewer rows)."""
    from loops.input.streaming_fit import Sketch

    sketch = Sketch()
    for block in range(len(log.blocks)):
        sketch = sketch.merged(Sketch.of(timestamps(log.read(block), column).astype(np.float64)))
    cumulative = np.cumsum(sketch.weights)

    def at(share: float) -> int:
        rank = np.searchsorted(cumulative, share * cumulative[-1], side="right")
        return int(sketch.values[min(int(rank), len(sketch.values) - 1)])

    kept = 1.0 - split.test_fraction
    test_from = at(kept)
    validation_from = at(kept * (1.0 - split.validation_fraction))
    if not split.validation_fraction:
        validation_from = test_from
    return TimeCuts(column, test_from, min(validation_from, test_from))


def _in_range(values: np.ndarray, low: int | None, high: int | None) -> np.ndarray:
    keep = np.ones(len(values), bool)
    if low is not None:
        keep &= values >= low
    if high is not None:
        keep &= values < high
    return keep


def part_masks(
    log: ShardedLog, block: int, table: BlockTable, split: Split, cuts: TimeCuts | None
) -> dict[str, np.ndarray]:
    """Which rows of block `block` (read as `table`) each part holds: by the hash of each
    row's shard and row (`cuts` None), else by its timestamp."""
    if cuts is None:
        fractions = row_fractions(log, block)
        return {p: (fractions >= lo) & (fractions < hi) for p, (lo, hi) in split.bands().items()}
    times = timestamps(table, cuts.column)
    return {part: _in_range(times, *bounds) for part, bounds in cuts.ranges().items()}


@dataclasses.dataclass(frozen=True)
class TimePart:
    """The rows of a log whose timestamps lie in [low, high) (None: unbounded), with each
    block's count from the id pass: a time split's part, read as a `sharded_logs.LogPart` is."""

    log: ShardedLog
    column: str
    low: int | None
    high: int | None
    block_counts: np.ndarray

    def counts(self) -> np.ndarray:
        return self.block_counts

    def keep(self, table: BlockTable) -> np.ndarray:
        """Which rows of a block (read as `table`) the part holds (a boolean mask)."""
        return _in_range(timestamps(table, self.column), self.low, self.high)

    def read(self, block: int) -> BlockTable:
        table = self.log.read(block)
        keep = self.keep(table)
        return table if keep.all() else table.taken(np.flatnonzero(keep))

    def __repr__(self) -> str:
        return f"{self.log!r}'s rows with {self.column} in [{self.low}, {self.high})"


@dataclasses.dataclass(frozen=True)
class MaskedRows(log_streams.Rows):
    """A part's rows read as whole blocks, prepared, then masked in numpy: cheaper than taking
    the part's rows out of the block's arrow table (every row of the block was checked by the
    id pass, so preparing the others refuses nothing)."""

    def block(self, block: int, stats: log_streams.StreamStats | None = None) -> Any:
        if stats is not None:
            stats.blocks_read += 1
        table = self.part.log.read(block)
        part = self.part
        keep = part.keep(table) if isinstance(part, TimePart) else part.keep(block)  # type: ignore[attr-defined]
        prepared = self.prepare(table)
        return prepared if keep.all() else tuple(array[keep] for array in prepared)


def fit_ids(log: ShardedLog, roles: Roles, split: Split, cuts: TimeCuts | None = None) -> FittedIds:
    """One pass over every block of `log`: the ids of every row numbered, and the training
    rows' counts and ratings, and each part's rows a block (`FittedIds`); the parts by the
    hash split, or by `cuts`.

    Raises:
        ValueError: an empty or control-character id, or a rating that is not a finite
            float32 number, naming the shard, the row and the fix.
    """
    users: dict[str, int] = {}
    items: dict[str, int] = {}
    rating_sum = 0.0
    block_rows = {part: np.zeros(len(log.blocks), np.int64) for part in PARTS}
    for block in range(len(log.blocks)):
        table = log.read(block)
        parts = part_masks(log, block, table, split, cuts)
        train = parts["train"]
        for part, keep in parts.items():
            block_rows[part][block] = int(keep.sum())
        for role, column, seen in (("user", roles.user, users), ("item", roles.item, items)):
            distinct, inverse = np.unique(_raw_ids(table, column, role), return_inverse=True)
            counts = np.bincount(inverse.reshape(-1)[train], minlength=len(distinct))
            for value, count in zip(distinct.astype(str).tolist(), counts.tolist(), strict=True):
                seen[value] = seen.get(value, 0) + count
        if roles.rating is not None:
            rating_sum += float(_ratings(table, roles.rating)[train].astype(np.float64).sum())
        else:
            rating_sum += float(train.sum())
    user_ids, user_rows = _numbered(users, "user", log.root)
    item_ids, item_rows = _numbered(items, "item", log.root)
    rows = {part: int(counts.sum()) for part, counts in block_rows.items()}
    return FittedIds(
        user_ids, item_ids, user_rows, item_rows, rating_sum, rows, log.root, block_rows
    )


def _numbers(block: BlockTable, column: str, role: str) -> np.ndarray:
    """A block's `column` as finite float64 numbers (text read as numbers); a missing one or
    one that is not a number refused naming its shard and row."""
    import pyarrow

    stored = block.arrow[column]
    values = stored.to_numpy(zero_copy_only=False)
    if stored.null_count == 0 and (
        pyarrow.types.is_floating(stored.type) or pyarrow.types.is_integer(stored.type)
    ):
        numbers = values.astype(np.float64)
    else:
        numbers = np.asarray([_number_or_nan(v) for v in values.tolist()], np.float64)
    bad = np.flatnonzero(~np.isfinite(numbers))
    if len(bad):
        row = _row_in(block, int(bad[0]))
        raise ValueError(
            f"{block.path} {block.row_word} {block.first_row + row}: the {role} "
            f"{values.tolist()[int(bad[0])]!r} is not a finite number; write each {role} as "
            + (
                "a number on its scale (e.g. 1 to 5 stars, or 1 or 0 for a label)."
                if role == "rating"
                else "a whole number of seconds (e.g. 881250949)."
            )
        )
    return numbers


def _ratings(block: BlockTable, column: str) -> np.ndarray:
    """A block's ratings as float32; one beyond float32 refused naming its shard and row."""
    numbers = _numbers(block, column, "rating")
    with np.errstate(over="ignore"):
        ratings = numbers.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(ratings))
    if len(bad):
        raise ValueError(
            f"{block.path} {block.row_word} {block.first_row + _row_in(block, int(bad[0]))}: "
            f"the rating {numbers[int(bad[0])]!r} is beyond float32, the numbers ratings train "
            "in; write each rating on its scale (e.g. 1 to 5 stars)."
        )
    return ratings


def timestamps(block: BlockTable, column: str) -> np.ndarray:
    """A block's timestamps as int64 (whole numbers exactly, others rounded down); one beyond
    int64 refused naming its shard and row."""
    import pyarrow

    values = block.arrow[column]
    if not values.null_count and pyarrow.types.is_integer(values.type):
        return values.to_numpy(zero_copy_only=False).astype(np.int64)
    numbers = _numbers(block, column, "timestamp")
    bad = np.flatnonzero(np.abs(numbers) >= 2.0**63)
    if len(bad):
        raise ValueError(
            f"{block.path} {block.row_word} {block.first_row + _row_in(block, int(bad[0]))}: "
            f"the timestamp {numbers[int(bad[0])]!r} is beyond int64; write each timestamp in "
            "seconds (e.g. 881250949)."
        )
    return np.floor(numbers).astype(np.int64)


def _number_or_nan(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


class InteractionLog:
    """A sharded interaction log, its roles, its split and its fitted ids: the prepared rows
    of each part, as streamed global batches or (for a ranking evaluation) pairs in memory."""

    def __init__(
        self,
        log: ShardedLog,
        split: Split,
        *,
        how: str = "random",
        roles: Roles | None = None,
        fitted: tuple[FittedIds, TimeCuts | None] | None = None,
    ):
        """`how`: "random" (a hash of each row's shard and row) or "time" (`time_cuts`);
        `fitted`: the ids and cuts an earlier pass over the same log and split found (a
        resume's), which no pass recomputes.

        Raises:
            ValueError: a time split of a log without a timestamp column, or what `fit_ids`
                refuses.
        """
        self.log, self.split = log, split
        self.roles = roles or roles_of(log)
        self.cuts: TimeCuts | None = None
        if fitted is not None:
            self.fitted, self.cuts = fitted
            return
        if how == "time":
            if self.roles.timestamp is None:
                raise ValueError(
                    f"{log.root} has no timestamp column (its columns: {', '.join(log.columns)}), "
                    "so a time split has no time to split by; pass --split=random, or add a "
                    "timestamp column (timestamp, time or ts)."
                )
            self.cuts = time_cuts(log, self.roles.timestamp, split)
        self.fitted = fit_ids(log, self.roles, split, self.cuts)

    def part(self, part: str) -> LogPart | TimePart:
        """The rows of `part`, read block by block."""
        if self.cuts is None:
            return LogPart(self.log, *self.split.bands()[part])
        low, high = self.cuts.ranges()[part]
        return TimePart(self.log, self.cuts.column, low, high, self.fitted.block_rows[part])

    @property
    def implicit(self) -> bool:
        return self.roles.rating is None

    def _indices(self, block: BlockTable, column: str, ids: np.ndarray, role: str) -> np.ndarray:
        raw = _raw_ids(block, column, role)
        if raw.dtype.kind == "i" and ids.dtype.kind == "i":
            # Integers on both sides: searched as they are, no text made of them.
            keys, inverse = raw, np.arange(len(raw))
        else:
            distinct, inverse = np.unique(raw.astype(str), return_inverse=True)
            keys = np.asarray([_composed(t) for t in distinct.tolist()] or [""], str)
            keys = keys[: len(distinct)]
            if ids.dtype.kind == "i":
                keys = keys.astype(np.int64)
        found = np.searchsorted(ids, keys)
        inside = np.minimum(found, len(ids) - 1)
        if len(keys) and (np.any(found >= len(ids)) or np.any(ids[inside] != keys)):
            raise ValueError(
                f"{block.path} holds a {role} id the pass over {self.log.root} did not see: the "
                "shard changed since; start a new run on the log as it is now."
            )
        return found.astype(np.int32)[inverse.reshape(-1)]

    def prepare(self, block: BlockTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A block's rows -> (users int32, items int32, ratings float32)."""
        users = self._indices(block, self.roles.user, self.fitted.user_ids, "user")
        items = self._indices(block, self.roles.item, self.fitted.item_ids, "item")
        if self.roles.rating is None:
            return users, items, np.ones(len(users), np.float32)
        return users, items, _ratings(block, self.roles.rating)

    def rows(self, part: str, *, with_ratings: bool = True) -> log_streams.Rows:
        """The rows of `part`, prepared as (users, items[, ratings])."""
        prepare = self.prepare if with_ratings else (lambda block: self.prepare(block)[:2])
        return MaskedRows(self.part(part), prepare)

    def train_batches(
        self, *, with_ratings: bool, global_batch_size: int, seed: int, window_blocks: int = 8
    ) -> Any:
        """Endless shuffled global batches of the training rows (`log_streams`)."""
        return log_streams.shuffled_log_batches(
            self.rows("train", with_ratings=with_ratings),
            global_batch_size=global_batch_size,
            seed=seed,
            signature=signature(with_ratings),
            window_blocks=window_blocks,
        )

    def eval_batches(self, part: str, *, global_batch_size: int) -> Any:
        """One pass over the (users, items, ratings) of `part` in the log's order."""
        return log_streams.ordered_log_batches(
            self.rows(part), global_batch_size=global_batch_size, signature=signature(True)
        )

    def blocks(self, part: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each block's prepared rows of `part`, in the log's order."""
        rows = self.rows(part)
        for block in range(len(self.log.blocks)):
            yield rows.block(block)

    def pairs(self, part: str) -> Interactions:
        """The (user, item) pairs of `part` in memory, 8 bytes a row (its ratings and
        timestamps not held): what a ranking evaluation excludes and finds."""
        found = list(self.blocks(part))
        users = np.concatenate([b[0] for b in found] or [np.zeros(0, np.int32)])
        items = np.concatenate([b[1] for b in found] or [np.zeros(0, np.int32)])
        return Interactions(
            users=users,
            items=items,
            ratings=np.broadcast_to(np.float32(1.0), users.shape),
            timestamps=np.broadcast_to(np.int64(0), users.shape),
            num_users=self.fitted.num_users,
            num_items=self.fitted.num_items,
            user_ids=self.fitted.user_ids,
            item_ids=self.fitted.item_ids,
            source=self.log.root,
            split=part,
        )


def signature(with_ratings: bool) -> tuple:
    """The `tf.TensorSpec`s of a batch of prepared rows."""
    import tensorflow as tf

    ids = (tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32))
    return (*ids, tf.TensorSpec([None], tf.float32)) if with_ratings else ids
