"""Interaction logs as users have them (MovieLens `u.data`, RecBole `.inter`, CSV), read into
dense user and item indices, and split into train and test.

`read_interactions` gives an `Interactions`: one row an interaction (user,
item, rating, timestamp, optional feature columns), users and items numbered
0..n-1 in the order of their raw ids (numerically when every id is a whole
number), the raw id of each index kept: any text but an empty one or one
with a control character, stripped and composed (NFC). An implicit log (no
rating or label column) rates every interaction 1.0; a log without timestamps
takes its row order as time (and a time split refuses it). Everything a file
gets wrong is refused before any work with a sentence naming the file, the
line, the value and the fix: the text within the bounds of
`loops.input.log_text`, each value as the dtype it trains in (a rating in
float32, a timestamp in int64).
"""

from __future__ import annotations

import array
import csv
import dataclasses
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from loops.input import log_text

FORMATS = ("auto", "movielens", "recbole", "csv")
SPLITS = ("random", "time")

# Header names each column may have, lower case (a RecBole header's `:type` suffix removed).
COLUMN_NAMES = {
    "user": ("user", "user_id", "userid"),
    "item": ("item", "item_id", "itemid", "movie_id", "movieid"),
    "rating": ("rating", "label", "click", "score"),
    "timestamp": ("timestamp", "time", "ts"),
}
# An id is any text a field holds (a quoted CSV field: spaces, commas, brackets...), the
# blanks around it removed and compared in Unicode's composed form (NFC), except an empty one
# and one holding a control character (a tab, a line end: `log_identity` hashes ids as lines).
# All whole numbers (ASCII digits, a sign) are read as int64 ids.
WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
ID_RULE = (
    "an id is any text but an empty one or one holding a control character, the blanks "
    "around it not part of it"
)


# eq=False: equality of numpy arrays is elementwise, so a generated __eq__ would raise.
@dataclasses.dataclass(frozen=True, eq=False)
class Interactions:
    """An interaction log with dense indices: one entry a row in every array.

    Attributes:
        users, items: int32 indices in [0, num_users) and [0, num_items).
        ratings: float32; 1.0 for every row of an implicit log.
        timestamps: int64; the row number where the log has no timestamps.
        num_users, num_items: the sizes of the index spaces (a split keeps them).
        user_ids, item_ids: the raw id of each index (int64 when every id is a
            whole number, else str).
        features: optional extra columns by name (float32, or str when not numeric).
        source: where the log came from (a path, or how it was generated).
        split: how this part was split off ("none" for a whole log).
        has_timestamps: whether the timestamps are the log's own (False: each row's
            number stands in, and a time split is refused).
    """

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    num_users: int
    num_items: int
    user_ids: np.ndarray
    item_ids: np.ndarray
    features: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    source: str = ""
    split: str = "none"
    has_timestamps: bool = True

    def __post_init__(self):
        rows = len(self.users)
        for name, dtype in _DTYPES.items():
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != 1:
                raise ValueError(
                    f"Interactions.{name} must be a 1-D numpy array of {np.dtype(dtype).name}, "
                    f"got {getattr(array, 'dtype', type(array).__name__)}; convert it with "
                    f"np.asarray(..., np.{np.dtype(dtype).name})."
                )
            if len(array) != rows:
                raise ValueError(
                    f"Interactions.{name} holds {len(array)} rows and users {rows}; give every "
                    "array one entry an interaction."
                )
        for name, size, ids in (
            ("users", self.num_users, self.user_ids),
            ("items", self.num_items, self.item_ids),
        ):
            _check_indices(name, getattr(self, name), size, len(ids))
        for name, column in self.features.items():
            if len(column) != rows:
                raise ValueError(
                    f"feature {name!r} holds {len(column)} rows and the log {rows}; give every "
                    "feature one entry an interaction."
                )

    def __len__(self) -> int:
        return len(self.users)

    @property
    def implicit(self) -> bool:
        """Whether every rating is 1.0 (a log of clicks or views, not of ratings)."""
        return bool(np.all(self.ratings == 1.0))

    def item_counts(self) -> np.ndarray:
        """How many rows name each item, int64 [num_items] (popularity, sampling frequencies)."""
        return np.bincount(self.items, minlength=self.num_items)

    def items_by_user(self) -> np.ndarray:
        """Each user's items in row order, int32 [num_users, most rows a user has], padded
        with -1 (for `loops.kinds.library.ranking_metrics.items_mask`)."""
        order = np.argsort(self.users, kind="stable")
        counts = np.bincount(self.users, minlength=self.num_users)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        table = np.full((self.num_users, max(int(counts.max(initial=0)), 1)), -1, np.int32)
        users = self.users[order]
        table[users, np.arange(len(order)) - starts[users]] = self.items[order]
        return table

    def take(self, rows: np.ndarray, *, split: str | None = None) -> Interactions:
        """The rows `rows` (indices or a boolean mask), indices and id maps kept."""
        return dataclasses.replace(
            self,
            users=self.users[rows],
            items=self.items[rows],
            ratings=self.ratings[rows],
            timestamps=self.timestamps[rows],
            features={name: column[rows] for name, column in self.features.items()},
            split=self.split if split is None else split,
        )

    def describe(self) -> dict[str, object]:
        """Counts and provenance for results.json."""
        return {
            "source": self.source,
            "interactions": len(self),
            "users": self.num_users,
            "items": self.num_items,
            "ratings": "implicit (1.0)" if self.implicit else "explicit",
            "features": sorted(self.features),
            "split": self.split,
        }


_DTYPES = {
    "users": np.int32,
    "items": np.int32,
    "ratings": np.float32,
    "timestamps": np.int64,
}


def _check_indices(name: str, indices: np.ndarray, size: int, known_ids: int) -> None:
    if known_ids != size:
        raise ValueError(
            f"Interactions has num_{name}={size} and {known_ids} raw {name[:-1]} ids; give one "
            "raw id an index."
        )
    if len(indices) and (indices.min() < 0 or indices.max() >= size):
        raise ValueError(
            f"Interactions.{name} holds indices in [{indices.min()}, {indices.max()}], outside "
            f"[0, {size}); number them 0..num_{name}-1."
        )


def read_interactions(
    path: str | os.PathLike, *, format: str = "auto", memory: int | None = None
) -> Interactions:
    """Reads an interaction log into dense indices.

    Args:
        path: the file.
        format: "movielens" (`u.data`: user, item, rating, timestamp separated
            by tabs, no header), "recbole" (`.inter`: tab-separated with a
            typed header, `user_id:token item_id:token rating:float
            timestamp:float`), "csv" (comma-separated, a header naming user,
            item and optionally rating or label, timestamp and feature
            columns), or "auto": by the file's name (`.data`, `.inter`, `.csv`).
        memory: the bytes reading may hold (default: this machine's memory; 0
            checks nothing): a larger log is refused unread
            (`log_text.check_fits_memory`).

    Raises:
        ValueError: an unknown format, an empty file, a missing column, an id
            that is empty or holds a control character (`ID_RULE`), a rating or
            timestamp that is not a number or does not fit its dtype, text out
            of `log_text`'s bounds; each naming the file, its line and the fix.
        FileNotFoundError: no file at `path`.
    """
    path = os.fspath(path)
    chosen = _format_of(path, format)
    with open(path, "rb") as stream:
        log_text.check_fits_memory(path, os.fstat(stream.fileno()).st_size, memory)
        rows, lines = _rows(path, log_text.text_lines(path, stream), chosen)
    if not rows:
        raise ValueError(
            f"{path} holds no interactions (it is empty); pass a log with one interaction a line."
        )
    if chosen == "movielens":
        header = ["user", "item", "rating", "timestamp"]
    else:
        header, rows, lines = [column_name(n) for n in rows[0]], rows[1:], lines[1:]
    if not rows:
        raise ValueError(
            f"{path} holds a header and no interactions; pass a log with one interaction a "
            "line below its header."
        )
    columns = _columns(path, header, rows, lines, chosen)
    return _interactions(path, columns, lines)


def _rows(path: str, text: Iterator[str], format: str) -> tuple[list[list[str]], np.ndarray]:
    """The rows that hold a field (blank lines left out), and the line each starts on."""
    rows: list[list[str]] = []
    lines = array.array("q")
    if format != "csv":
        for number, line in enumerate(text, 1):
            if line.strip():  # a line of blanks and tabs holds no field
                rows.append(line.rstrip("\r\n").split("\t"))
                lines.append(number)
        return rows, np.frombuffer(lines, np.int64)
    reader = csv.reader(text)
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return rows, np.frombuffer(lines, np.int64)
        except csv.Error as error:
            raise ValueError(
                f"{path} line {start} does not read as CSV ({error}); write one interaction "
                'a line, with no carriage return inside it, and close each field quoted with " '
                "on its line (one left open runs on over the lines below)."
            ) from None
        if any(field.strip() for field in row):
            rows.append(row)
            lines.append(start)


def _format_of(path: str, format: str) -> str:
    if format not in FORMATS:
        raise ValueError(
            f"format={format!r} is not a log format loops reads; pass one of {', '.join(FORMATS)}."
        )
    if format != "auto":
        return format
    name = os.path.basename(path).lower()
    for suffix, found in ((".data", "movielens"), (".inter", "recbole"), (".csv", "csv")):
        if name.endswith(suffix):
            return found
    raise ValueError(
        f"format='auto' cannot tell the format of {path} from its name (known: .data, .inter, "
        ".csv); pass format='movielens' (u.data: user item rating timestamp, tab-separated), "
        "'recbole' (.inter, a typed header) or 'csv' (a header naming user,item,...)."
    )


def column_name(field: str) -> str:
    """A header field's plain name: lower case, a RecBole `:type` suffix removed."""
    return field.strip().split(":", 1)[0].strip().lower()


def _columns(
    path: str, header: list[str], rows: list[list[str]], lines: np.ndarray, format: str
) -> dict[str, list[str]]:
    """Each column's fields by its role (user, item, ...) or, for a feature, its own name."""
    roles: dict[str, int] = {}
    for index, name in enumerate(header):
        role = next((r for r, names in COLUMN_NAMES.items() if name in names), name)
        if role in roles:
            raise ValueError(
                f"{path}'s header names two {role} columns ({header[roles[role]]} and {name}); "
                "keep one, or rename the other to a feature name."
            )
        roles[role] = index
    for needed in ("user", "item"):
        if needed not in roles:
            raise ValueError(
                f"{path}'s header names no {needed} column (it names {', '.join(header)}); "
                f"name the columns user,item[,rating|label][,timestamp] in the first line "
                f"({needed} may also be called {' or '.join(COLUMN_NAMES[needed][1:])})."
            )
    for offset, row in enumerate(rows):
        if len(row) != len(header):
            layout = "\t".join(header) if format != "csv" else ",".join(header)
            raise ValueError(
                f"{path} line {lines[offset]} has {len(row)} fields and the log "
                f"{len(header)} ({layout}); give every line one field a column"
                + (", separated by tabs." if format != "csv" else ".")
            )
    return {role: [row[index].strip() for row in rows] for role, index in roles.items()}


def _interactions(path: str, columns: dict[str, list[str]], lines: np.ndarray) -> Interactions:
    users, user_ids = _indices(path, "user", columns.pop("user"), lines)
    items, item_ids = _indices(path, "item", columns.pop("item"), lines)
    rows = len(users)
    if "rating" in columns:
        ratings = _ratings(path, columns.pop("rating"), lines)
    else:
        ratings = np.ones(rows, np.float32)
    has_timestamps = "timestamp" in columns
    if has_timestamps:
        timestamps = _timestamps(path, columns.pop("timestamp"), lines)
    else:
        timestamps = np.arange(rows, dtype=np.int64)
    return Interactions(
        users=users,
        items=items,
        ratings=ratings,
        timestamps=timestamps,
        num_users=len(user_ids),
        num_items=len(item_ids),
        user_ids=user_ids,
        item_ids=item_ids,
        features={name: _feature(values) for name, values in columns.items()},
        source=path,
        has_timestamps=has_timestamps,
    )


def _indices(
    path: str, role: str, fields: Sequence[str], lines: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Dense int32 indices of the raw ids, and the raw id of each index (sorted)."""
    distinct, inverse = np.unique(np.asarray(fields, dtype=str), return_inverse=True)
    inverse = inverse.reshape(-1)
    composed = [unicodedata.normalize("NFC", value) for value in distinct.tolist()]
    if composed != distinct.tolist():  # "café" typed as e + a combining accent is "café"
        distinct, again = np.unique(np.asarray(composed, dtype=str), return_inverse=True)
        inverse = again.reshape(-1)[inverse]
    for position, value in enumerate(distinct.tolist()):
        control = next((c for c in value if unicodedata.category(c) == "Cc"), None)
        if not value or control is not None:
            what, fix = "is empty", f"give every interaction its {role}'s id"
            if value:
                what, fix = f"{value!r} holds the control character {ascii(control)}", "remove it"
            raise ValueError(
                f"{path} line {_line_of(lines, inverse == position)}: the {role} id {what} "
                f"({ID_RULE}); {fix}."
            )
    if all(WHOLE_NUMBER.fullmatch(value) for value in distinct.tolist()):
        try:
            numbers = distinct.astype(np.int64)
        except OverflowError:
            position, value = next(
                (i, v) for i, v in enumerate(distinct.tolist()) if not fits_int64(v)
            )
            raise ValueError(
                f"{path} line {_line_of(lines, inverse == position)}: the {role} id {value!r} "
                f"is a whole number beyond 64 bits (|id| < 2^63); number the {role}s within "
                f"64 bits, or give every {role} id a letter first (e.g. "
                f"{role[0]}{value.lstrip('+-')})."
            ) from None
        # "7" and "07" are one id once read as numbers.
        distinct, again = np.unique(numbers, return_inverse=True)
        inverse = again.reshape(-1)[inverse]
    return inverse.astype(np.int32), distinct


def fits_int64(whole_number: str) -> bool:
    return -(2**63) <= int(whole_number) < 2**63


def _line_of(lines: np.ndarray, rows: np.ndarray) -> int:
    """The line of the first row of a boolean mask over the rows."""
    return int(lines[np.flatnonzero(rows)[0]])


def _ratings(path: str, fields: Sequence[str], lines: np.ndarray) -> np.ndarray:
    """The fields as float32, the dtype ratings train in: a finite number beyond it refused."""
    values = _numbers(path, "rating", fields, lines)
    with np.errstate(over="ignore"):
        ratings = values.astype(np.float32)
    beyond = ~np.isfinite(ratings)
    if beyond.any():
        offset = int(np.flatnonzero(beyond)[0])
        raise ValueError(
            f"{path} line {lines[offset]}: the rating {fields[offset]!r} is beyond float32 "
            f"(|rating| <= {float(np.finfo(np.float32).max):.4g}), the numbers ratings train "
            "in; write each rating on its scale (e.g. 1 to 5 stars, or 1 or 0 for a label)."
        )
    return ratings


def _timestamps(path: str, fields: Sequence[str], lines: np.ndarray) -> np.ndarray:
    """The fields as int64 (whole numbers exactly, others rounded down): one beyond refused."""
    try:
        return np.asarray(fields, dtype=np.int64)
    except (ValueError, OverflowError):
        pass  # a fraction, a number written with an exponent, or one beyond int64
    times = _numbers(path, "timestamp", fields, lines)
    whole = np.fromiter((WHOLE_NUMBER.fullmatch(field) is not None for field in fields), bool)
    # As a float64, 2^63 - 1 is 2^63: a whole number that large is told by its digits.
    for offset in np.flatnonzero(np.abs(times) >= 2.0**63).tolist():
        if not (whole[offset] and fits_int64(fields[offset])):
            raise ValueError(
                f"{path} line {lines[offset]}: the timestamp {fields[offset]!r} is beyond "
                "int64 (|timestamp| < 2^63, about 9.2e18), the numbers timestamps are kept "
                "in; write each timestamp in seconds (e.g. 881250949), or check the column "
                "order."
            )
    stamps = np.floor(np.where(whole, 0.0, times)).astype(np.int64)
    stamps[whole] = np.asarray([fields[i] for i in np.flatnonzero(whole).tolist()], np.int64)
    return stamps


def _numbers(path: str, role: str, fields: Sequence[str], lines: np.ndarray) -> np.ndarray:
    """The fields as finite float64 numbers."""
    try:
        values = np.asarray(fields, dtype=np.float64)
    except ValueError:
        values = np.full(len(fields), np.nan)  # the slow path below finds the field
    if np.all(np.isfinite(values)):
        return values
    for offset, field in enumerate(fields):
        try:
            values[offset] = float(field)
        except ValueError:
            values[offset] = np.nan
        if not np.isfinite(values[offset]):
            raise ValueError(
                f"{path} line {lines[offset]}: the {role} {field!r} is not a number; "
                f"write each {role} as a finite number (e.g. 4 or 3.5)"
                + (", 1 or 0 for a label." if role == "rating" else ".")
            )
    return values


def _feature(values: Sequence[str]) -> np.ndarray:
    try:
        numbers = np.asarray(values, dtype=np.float32)
    except ValueError:
        return np.asarray(values, dtype=str)
    return numbers if np.all(np.isfinite(numbers)) else np.asarray(values, dtype=str)


def grown(interactions: Interactions, user_ids: np.ndarray, item_ids: np.ndarray) -> Interactions:
    """`interactions` re-indexed over grown vocabularies: `user_ids` and `item_ids` (another
    run's ids, e.g. its ids.json) keep their indices, and the log's ids they lack follow in
    the order of `read_interactions` (a continued run's tables keep each old id's row, and
    yesterday's users and items stay in the model on a day they do not appear).

    A vocabulary of strings takes a log of whole numbers as their decimal text; a vocabulary
    of whole numbers refuses a log of other ids.

    Raises:
        ValueError: a log id of text where the vocabulary holds whole numbers.
    """
    parts = {}
    for role, base, log_ids, indices in (
        ("user", user_ids, interactions.user_ids, interactions.users),
        ("item", item_ids, interactions.item_ids, interactions.items),
    ):
        if base.dtype.kind == "U" and log_ids.dtype.kind != "U":
            log_ids = log_ids.astype(str)
        elif base.dtype.kind != "U" and log_ids.dtype.kind == "U":
            raise ValueError(
                f"{interactions.source} names {role}s by text (e.g. {str(log_ids[0])!r}) and the "
                f"run it grows from by whole numbers (e.g. {int(base[0])}): an id keeps its "
                f"row only where both name it alike; give every {role} id as a whole number, "
                "or start a new run from the initial values."
            )
        known = {value: row for row, value in enumerate(base.tolist())}
        added = [value for value in log_ids.tolist() if value not in known]
        kind = str if base.dtype.kind == "U" else np.int64  # text of any length
        vocabulary = np.concatenate([base, np.asarray(added, dtype=kind)])
        rows = np.array([known.get(value, -1) for value in log_ids.tolist()], np.int64)
        rows[rows < 0] = len(base) + np.arange(len(added))
        parts[role] = (rows[indices].astype(np.int32), vocabulary)
    (users, user_vocabulary), (items, item_vocabulary) = parts["user"], parts["item"]
    return dataclasses.replace(
        interactions,
        users=users,
        items=items,
        num_users=len(user_vocabulary),
        num_items=len(item_vocabulary),
        user_ids=user_vocabulary,
        item_ids=item_vocabulary,
    )


def split(
    interactions: Interactions, *, how: str = "random", test_fraction: float = 0.2, seed: int = 0
) -> tuple[Interactions, Interactions]:
    """Splits a log into (train, test), each stating how in its `split`.

    Args:
        how: "random": a random `test_fraction` of all rows (rounded) go to test,
            drawn with `seed`. "time": each user's last `test_fraction` of their
            interactions (rounded down: a user with few keeps them all in train),
            by timestamp and, among equal timestamps, by row; `seed` is unused.
        test_fraction: in (0, 1).

    Raises:
        ValueError: an unknown `how`, a fraction outside (0, 1), a time split of a
            log without timestamps, or a split that leaves test or train empty.
    """
    if how not in SPLITS:
        raise ValueError(f"how={how!r} is not a split; pass one of {', '.join(SPLITS)}.")
    if isinstance(test_fraction, bool) or not 0.0 < test_fraction < 1.0:
        raise ValueError(
            f"test_fraction must lie in (0, 1), got {test_fraction!r}; e.g. 0.2 keeps 80% "
            "for training."
        )
    if how == "random":
        test = _random_test_rows(len(interactions), test_fraction, seed)
    elif not interactions.has_timestamps:
        raise ValueError(
            f"{interactions.source} has no timestamp column, so a time split has no time to "
            "split by; pass how='random' (--split=random), or add a timestamp column "
            "(timestamp, time or ts) to the log."
        )
    else:
        test = _last_rows_of_each_user(interactions, test_fraction)
    note = describe_split(how, test_fraction, seed)
    _check_both_parts(interactions, int(test.sum()), note)
    return interactions.take(~test, split=note), interactions.take(test, split=note)


def split_validation(
    train: Interactions, *, how: str, validation_fraction: float, seed: int
) -> tuple[Interactions, Interactions]:
    """Carves a validation part from the training rows of `split` by the same rule: (train
    left, validation). "random": a random `validation_fraction` of them (rounded), drawn with
    `seed`; "time": each user's latest `validation_fraction` of their training rows (rounded
    down), so validation lies between each user's train and test in time.

    Raises:
        ValueError: a fraction outside (0, 1), or one that leaves validation or train empty.
    """
    if isinstance(validation_fraction, bool) or not 0.0 < validation_fraction < 1.0:
        raise ValueError(
            f"validation_fraction must lie in (0, 1), got {validation_fraction!r}; e.g. 0.1 "
            "evaluates on a tenth of the training rows (0 on the command line: none)."
        )
    if how == "random":
        held = _random_test_rows(len(train), validation_fraction, seed)
    else:
        held = _last_rows_of_each_user(train, validation_fraction)
    rows, count = len(train), int(held.sum())
    if not 0 < count < rows:
        raise ValueError(
            f"{train.source or 'the log'}: --validation_fraction={validation_fraction} holds "
            f"{'none' if count == 0 else 'all'} of the {rows} training interactions for "
            f"validation; pass a {'larger' if count == 0 else 'smaller'} --validation_fraction"
            + (
                " or --split=random (a time split rounds each user's share down)"
                if how == "time" and count == 0
                else ""
            )
            + ", or --validation_fraction=0 to evaluate on the test rows."
        )
    note = f"{train.split}; validation: {describe_validation(how, validation_fraction)}"
    return train.take(~held, split=note), train.take(held, split=note)


def describe_validation(how: str, validation_fraction: float) -> str:
    """The validation part in words: "a random 10% of the training rows"."""
    share = round(100 * validation_fraction)
    if how == "random":
        return f"a random {share}% of the training rows"
    return f"each user's latest {share}% of their training rows (rounded down)"


def _check_both_parts(interactions: Interactions, held_out: int, note: str) -> None:
    """Refuses a split that holds out none of the log (nothing to evaluate) or all of it."""
    rows = len(interactions)
    if 0 < held_out < rows:
        return
    if held_out == 0:
        what, fix = "none of its", "a larger test_fraction (--test_fraction)"
        if note.startswith("time"):
            fix += " or how='random' (--split=random): a time split rounds each user's share down"
        ending = "leaving nothing to evaluate on"
    else:
        what, fix = "all of its", "a smaller test_fraction (--test_fraction)"
        ending = "leaving nothing to train on"
    raise ValueError(
        f"{interactions.source or 'the log'}: the split ({note}) holds out {what} {rows} "
        f"interactions, {ending}; pass {fix}, or a log with more interactions."
    )


def describe_split(how: str, test_fraction: float, seed: int) -> str:
    """The split in words for results.json: "random 80/20, seed 0"."""
    test = round(100 * test_fraction)
    if how == "random":
        return f"random {100 - test}/{test}, seed {seed}"
    return f"time: each user's last {test}% by timestamp (rounded down) to test"


def _random_test_rows(rows: int, test_fraction: float, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(rows)
    test = np.zeros(rows, bool)
    test[order[: round(rows * test_fraction)]] = True
    return test


def _last_rows_of_each_user(interactions: Interactions, test_fraction: float) -> np.ndarray:
    # By user, then time, then row: each user's rows are one run in time order.
    order = np.lexsort((np.arange(len(interactions)), interactions.timestamps, interactions.users))
    users = interactions.users[order]
    counts = np.bincount(users, minlength=interactions.num_users)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(len(order)) - starts[users]  # 0 for each user's first row
    kept = counts - np.floor(counts * test_fraction).astype(np.int64)
    test = np.zeros(len(order), bool)
    test[order] = position >= kept[users]
    return test
