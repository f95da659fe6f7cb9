"""A table of feature columns (a CSV or Parquet file) read by a small spec into the arrays a
click-through model trains on: numbers normalized, categories and multi-hot bags as table rows
by a vocabulary of the training rows or by hashing, labels as 0/1; each refusal names the
column, the row and the value.

The spec is JSON (`FeatureSpec.from_json`), e.g.

    {"label": "income", "positive": ">50K",
     "columns": [{"name": "age", "kind": "numeric"},
                 {"name": "occupation", "kind": "categorical"},
                 {"name": "zip", "kind": "categorical", "hash_buckets": 1000},
                 {"name": "genres", "kind": "multi_hot", "separator": "|", "pooling": "sum"},
                 {"name": "education_x_occupation", "kind": "categorical",
                  "cross": ["education", "occupation"], "min_count": 3}]}

`fit` learns what the training rows decide (vocabularies, means and deviations) as
`FittedFeatures`, plain JSON that a checkpoint or an export can carry; `FittedFeatures.arrays`
turns any rows of the same header (validation, test, serving) into the same arrays. Row 0 of
each vocabulary table is its out-of-vocabulary row: values unseen in training, or seen fewer
than `min_count` times, land there. A bag is padded with -1 (`PAD_ID`) to the longest bag of
the rows read; an empty bag is all padding. A "standard" column's mean and deviation are
finite for any finite values (1e308 included), and every normalized value is finite in float32
(else the row is refused), so `FittedFeatures.to_json` is strict JSON.

A crossed column (`cross`: 2 or more columns of the table, by name) is a categorical column
that the table does not have: its value on a row is the text of each crossed column's value
(as a categorical column reads it: "3" for 3 and 3.0, "" for an empty field), in the listed
order, joined by the column's `separator` ("|" unless given), e.g. "Bachelors|Sales" above.
No crossed value may hold the separator (such a row is refused), so two different rows of
values never join to the same text. It then takes a vocabulary (`min_count`, the
out-of-vocabulary row 0) or `hash_buckets` as any categorical column. It crosses categorical
columns of the spec, or columns of the table the spec does not list (`education` above, read
as text); never a numeric or multi-hot column, the label or another crossed column.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import difflib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from loops.input import log_text
from loops.vocabulary.whole_numbers import is_whole

PAD_ID = -1
KINDS = ("numeric", "categorical", "multi_hot")
NORMALIZATIONS = ("standard", "log", "none")
POOLINGS = ("mean", "sum")
# The options each kind takes besides its name and kind, with their defaults.
_OPTIONS: dict[str, dict[str, Any]] = {
    "numeric": {"normalize": "standard", "fill": None, "buckets": None},
    "categorical": {
        "hash_buckets": None,
        "min_count": 1,
        "max_vocabulary": None,
        "cross": None,
        "separator": "|",
        "dynamic": None,
    },
    "multi_hot": {
        "hash_buckets": None,
        "min_count": 1,
        "max_vocabulary": None,
        "separator": "|",
        "pooling": "mean",
        "dynamic": None,
    },
}
_EXAMPLE = '{"label": "clicked", "columns": [{"name": "age", "kind": "numeric"}]}'
# A dynamic column's values hash to int64 ids below this (TensorFlow's 64-bit fingerprint, as
# `hash_buckets` hashes), which a `loops.DynamicTable` admits within its capacity: every id
# but its reserved 2**63 - 1.
DYNAMIC_BUCKETS = 2**63 - 1
# A dynamic column's keys: its table's capacity, then the rest of `loops.AdmissionPolicy`.
DYNAMIC_KEYS = ("capacity", "admit_after", "decay", "ttl", "waiting")


@dataclasses.dataclass(frozen=True)
class Column:
    """One feature column: its name, kind (`KINDS`) and the options of that kind (`_OPTIONS`):
    numeric `normalize` (`NORMALIZATIONS`) and `fill` (the value of an empty field; None
    refuses one); categorical and multi-hot `hash_buckets` (None: a vocabulary of the training
    rows) and `min_count`; categorical `cross` (a tuple of the table's columns whose values
    it joins; None: the table's own column of its name) and `separator` (between the values
    a crossed column joins); multi-hot `separator` (between a text field's values) and
    `pooling` (`POOLINGS`)."""

    name: str
    kind: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def option(self, key: str) -> Any:
        return self.options.get(key, _OPTIONS[self.kind][key])

    def hash_buckets(self) -> int | None:
        """The buckets its values hash to: its `hash_buckets`, `DYNAMIC_BUCKETS` for a
        dynamic column (raw ids for its table's map), None for a vocabulary."""
        return DYNAMIC_BUCKETS if self.options.get("dynamic") else self.option("hash_buckets")

    def crosses(self) -> tuple[str, ...]:
        """The columns a crossed column joins, in order; () for a column of the table."""
        return tuple(self.options.get("cross") or ())


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """The label column and the feature columns of a table. A label is 0/1 read as a number, in
    a CSV file and a Parquet file alike ("1", "1.0", 1.0 and a boolean True are 1), or, with
    `positive`, 1 where it equals that value and 0 for the one other value the column holds."""

    label: str
    columns: tuple[Column, ...]
    positive: str | None = None

    @classmethod
    def from_json(cls, spec: str | Mapping[str, Any]) -> FeatureSpec:
        """The spec of a JSON text or an already parsed mapping (see the module's docstring).

        Raises:
            ValueError: naming the entry and the fix: not JSON, an unknown key, kind or
                option, a bad option value, a column named twice or as the label, no column,
                a cross of fewer than 2 columns, on another kind than categorical, or of the
                label, a numeric, multi-hot or crossed column.
        """
        parsed = _parsed(spec)
        unknown = sorted(set(parsed) - {"label", "columns", "positive"})
        if unknown or not isinstance(parsed.get("label"), str) or not parsed["label"]:
            raise ValueError(
                f"A feature spec takes a label (a column name), columns and optionally "
                f"positive; got {json.dumps(parsed)[:200]}. Write it like {_EXAMPLE}."
            )
        entries = parsed.get("columns")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"The feature spec has no columns; list them like {_EXAMPLE}.")
        columns = tuple(_column(entry) for entry in entries)
        _check_names(parsed["label"], columns)
        positive = parsed.get("positive")
        if positive is not None and not isinstance(positive, (str, int, float)):
            raise ValueError(f"positive is {positive!r}; give the label value of a click.")
        return cls(parsed["label"], columns, None if positive is None else str(positive))

    @classmethod
    def read(cls, path: str) -> FeatureSpec:
        """The spec in the UTF-8 JSON file at `path` (`from_json`).

        Raises:
            ValueError: as `from_json`, or a file that is not UTF-8 text (naming the line and
                column of the first byte that does not decode); each naming `path`.
        """
        with open(path, "rb") as spec:
            data = spec.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data.count(b"\n", 0, error.start) + 1
            column = error.start - data.rfind(b"\n", 0, error.start)
            raise ValueError(
                f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at line {line}, "
                f"column {column} does not decode); a feature spec is UTF-8 JSON: save it as "
                "UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE)."
            ) from None
        try:
            return cls.from_json(text)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None


def _parsed(spec: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"The feature spec is not JSON ({error}); write it like {_EXAMPLE}."
            ) from None
    if not isinstance(spec, Mapping):
        raise ValueError(f"The feature spec is {spec!r}, not an object like {_EXAMPLE}.")
    return dict(spec)


def _column(entry: Any) -> Column:
    """One column of the spec, its options checked."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
        raise ValueError(
            f"A column of the feature spec is {entry!r}; give each a name and a kind, like "
            '{"name": "age", "kind": "numeric"}.'
        )
    name, kind = entry["name"], entry.get("kind")
    if kind not in KINDS:
        raise ValueError(f"Column {name!r} has kind {kind!r}; use one of {', '.join(KINDS)}.")
    options = {key: value for key, value in entry.items() if key not in ("name", "kind")}
    if "cross" in options and kind != "categorical":
        raise ValueError(
            f"Column {name!r} ({kind}) has cross; only a categorical column crosses columns: "
            'give it "kind": "categorical".'
        )
    for key in options:
        if key not in _OPTIONS[kind]:
            close = difflib.get_close_matches(key, _OPTIONS[kind], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"Column {name!r} ({kind}) has no option {key!r}{hint}; its options are "
                f"{', '.join(_OPTIONS[kind])}."
            )
    if options.get("cross") is not None:
        options["cross"] = _checked_cross(name, options["cross"])
    elif kind == "categorical" and "separator" in options:
        raise ValueError(
            f"Column {name!r} has a separator and no cross; a categorical column's separator "
            'joins the values it crosses: add "cross", or make it a multi_hot column.'
        )
    column = Column(name, kind, options)
    _check_options(column)
    return column


def _checked_cross(name: str, cross: Any) -> tuple[str, ...]:
    """A crossed column's `cross` as a tuple (a JSON list and a Python tuple read alike):
    2 or more distinct column names."""
    if (
        not isinstance(cross, (list, tuple))
        or not all(isinstance(source, str) and source for source in cross)
        or len(set(cross)) < 2
        or len(set(cross)) < len(cross)
    ):
        raise ValueError(
            f"Column {name!r} has cross={cross!r}; list 2 or more distinct columns of the "
            'table, like "cross": ["education", "occupation"].'
        )
    return tuple(cross)


def _check_options(column: Column) -> None:
    name, options = column.name, column.options
    allowed = {"normalize": NORMALIZATIONS, "pooling": POOLINGS}
    for key, choices in allowed.items():
        if key in options and options[key] not in choices:
            raise ValueError(
                f"Column {name!r} has {key}={options[key]!r}; use one of {', '.join(choices)}."
            )
    for key in ("hash_buckets", "min_count", "max_vocabulary"):
        value = options.get(key)
        if value is not None and not is_whole(value, 1):
            raise ValueError(f"Column {name!r} has {key}={value!r}; give a whole number >= 1.")
    if options.get("dynamic") is not None:
        _check_dynamic(column)
    buckets = options.get("buckets")
    if buckets is not None and not is_whole(buckets, 2):
        raise ValueError(
            f"Column {name!r} has buckets={buckets!r}; give a whole number >= 2 (the quantile "
            "buckets of its training values), or leave it out."
        )
    fill = options.get("fill")
    if fill is not None and (
        isinstance(fill, bool) or not isinstance(fill, (int, float)) or not math.isfinite(fill)
    ):
        raise ValueError(f"Column {name!r} has fill={fill!r}; give a finite number or null.")
    separator = options.get("separator", "|")
    if not isinstance(separator, str) or not separator:
        raise ValueError(f"Column {name!r} has separator={separator!r}; give a character.")


def _check_dynamic(column: Column) -> None:
    """A dynamic column's `dynamic`: an object of `DYNAMIC_KEYS`, capacity a whole number >= 1,
    the rest as `loops.DynamicTable` takes them; no vocabulary or hashing option beside it."""
    from loops.tables import id_map

    name, dynamic = column.name, column.options["dynamic"]
    example = '"dynamic": {"capacity": 100000, "admit_after": 2}'
    if not isinstance(dynamic, Mapping) or set(dynamic) - set(DYNAMIC_KEYS):
        raise ValueError(
            f"Column {name!r} has dynamic={dynamic!r}; give an object of "
            f"{', '.join(DYNAMIC_KEYS)} (capacity required), like {example}."
        )
    if not is_whole(dynamic.get("capacity"), 1):
        raise ValueError(
            f"Column {name!r} has a dynamic capacity of {dynamic.get('capacity')!r}; give the "
            f"most ids its table holds at once, a whole number >= 1, like {example}."
        )
    clashing = [
        key for key in ("hash_buckets", "min_count", "max_vocabulary") if key in column.options
    ]
    if clashing:
        raise ValueError(
            f"Column {name!r} is dynamic (its ids need no vocabulary or hashing) and has "
            f"{', '.join(clashing)}: remove {'them' if len(clashing) > 1 else 'it'}, or dynamic."
        )
    try:
        id_map.AdmissionPolicy(**{k: v for k, v in dynamic.items() if k != "capacity"})
    except ValueError as error:
        raise ValueError(f"Column {name!r} has dynamic={dict(dynamic)!r}: {error}") from None


def model_arrays(
    fitted: FittedFeatures, columns: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """`columns` as the models take them: ids int32, a dynamic column's int64 (its raw ids)."""
    dynamic = fitted.dynamic_columns()
    return {
        name: array.astype(np.int32) if array.dtype.kind == "i" and name not in dynamic else array
        for name, array in columns.items()
    }


def _check_names(label: str, columns: Sequence[Column]) -> None:
    seen = collections.Counter(column.name for column in columns)
    for column in columns:
        if (
            column.kind == "numeric"
            and column.option("buckets")
            and bucket_name(column.name) in seen
        ):
            raise ValueError(
                f"Column {column.name!r} has buckets, which the model reads as "
                f"{bucket_name(column.name)!r}, and the spec names a column "
                f"{bucket_name(column.name)!r} too; rename that one."
            )
    twice = sorted(name for name, count in seen.items() if count > 1)
    if twice:
        raise ValueError(f"The feature spec names {', '.join(twice)} twice; name each once.")
    if label in seen:
        raise ValueError(
            f"{label!r} is the label and a feature column; a model must not read its label."
        )
    by_name = {column.name: column for column in columns}
    for column in columns:
        for source in column.crosses():
            _check_crossed(column, by_name.get(source), source, label)


def bucket_name(name: str) -> str:
    """The model's column of a numeric column's quantile buckets."""
    return name + "_bucket"


def _check_crossed(column: Column, crossed: Column | None, source: str, label: str) -> None:
    """Refuses a cross of the label, of itself, of another crossed column, or of a numeric
    or multi-hot column of the spec (`crossed`; None for a column the spec does not list)."""
    name = column.name
    if source == label:
        raise ValueError(
            f"Column {name!r} crosses the label {label!r}; a model must not read its label: "
            "cross feature columns."
        )
    if source == name:
        raise ValueError(
            f"Column {name!r} crosses itself; list the table's columns whose values it joins."
        )
    if crossed is not None and crossed.crosses():
        # The same cross with `source` replaced by the columns it joins, each once.
        parts = (crossed.crosses() if s == source else (s,) for s in column.crosses())
        joined = json.dumps(list(dict.fromkeys(part for some in parts for part in some)))
        raise ValueError(
            f"Column {name!r} crosses {source!r}, itself a crossed column; cross the columns "
            f'it joins instead: "cross": {joined}.'
        )
    if crossed is not None and crossed.kind != "categorical":
        raise ValueError(
            f"Column {name!r} crosses {source!r}, a {crossed.kind} column; cross categorical "
            "columns, or columns of the table the spec does not list (read as text)."
        )


@dataclasses.dataclass(frozen=True)
class Table:
    """A file's rows by column: each column a list of its fields (text from a CSV file;
    numbers, text or lists from a Parquet file), in the file's row order."""

    path: str
    columns: dict[str, list[Any]]
    # What a row is called in sentences: the CSV line (header 1) or the Parquet row (from 0).
    row_word: str
    first_row: int
    # A Parquet binary column that holds bytes that are not UTF-8: its first such row. Reading
    # the column is refused; a table may hold such a column that the spec does not read.
    undecodable: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # Some rows of a file (a split's rows of a shard's block): each row's number in it, from 0.
    row_numbers: Sequence[int] | None = None

    def where(self, row: int) -> str:
        number = row if self.row_numbers is None else self.row_numbers[row]
        return f"{self.path} {self.row_word} {self.first_row + number}"


# The refusals of `log_text` in a feature table's words.
_TABLE_TEXT = log_text.TextWords(
    file="CSV table",
    too_long="more than a row of a feature table may hold",
    per_line="one row a line",
    smaller="a table of at most {size} (a sample of the rows, or only the columns the spec reads)",
)
_PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


def read_table(path: str) -> Table:
    """The rows of a Parquet file (by its first bytes, Parquet's "PAR1") or else a CSV file (a
    header line, then comma-separated fields). Parquet text of bytes (a binary column) is
    decoded as UTF-8, as a CSV file's text is.

    Raises:
        ValueError: a file with no rows, a header that names a column twice (naming both
            column numbers), a CSV row with another field count than its header or that does
            not read as CSV, a CSV file that is not UTF-8 text (`log_text`), binary values that
            are not UTF-8, a file named as Parquet that is not one, or one that Parquet cannot
            read; each naming the file (and the line or row).
    """
    with open(path, "rb") as stream:
        magic = stream.read(4)
    if magic == b"PAR1":
        return _parquet_table(path)
    suffix = os.path.splitext(path)[1]
    if suffix.lower() in _PARQUET_SUFFIXES:
        raise ValueError(
            f"{path} is named {suffix}, which reads it as Parquet, and it is not a Parquet file "
            "(it does not start with Parquet's bytes PAR1); if it is CSV text, name it .csv, "
            "else write it again as Parquet."
        )
    return _csv_table(path)


def _check_distinct(path: str, names: Sequence[str]) -> None:
    """Refuses a header that names a column twice (reading one would drop the other)."""
    first: dict[str, int] = {}
    for number, name in enumerate(names, start=1):
        if name in first:
            raise ValueError(
                f"{path}'s header names column {name!r} twice (columns {first[name]} and "
                f"{number}); give each column its own name."
            )
        first[name] = number


def _csv_table(path: str) -> Table:
    log_text.check_fits_memory(path, os.path.getsize(path), words=_TABLE_TEXT)
    with open(path, "rb") as stream:
        rows = _csv_rows(path, csv.reader(log_text.text_lines(path, stream, words=_TABLE_TEXT)))
        header = next(rows, (1, None))[1]
        if not header:
            raise ValueError(f"{path} is empty; a feature table starts with a header line.")
        _check_distinct(path, header)
        fields = _csv_fields(path, header, rows)
    if not fields or not fields[0]:
        raise ValueError(f"{path} has a header and no rows; a feature table needs rows.")
    return Table(path, dict(zip(header, fields)), "line", 2)


def _csv_rows(path: str, reader: Any) -> Iterator[tuple[int, list[str]]]:
    """Each row of a `csv.reader` with the line it starts on.

    Raises:
        ValueError: text that does not read as CSV, naming the line its row starts on.
    """
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise ValueError(
                f"{path} line {start} does not read as CSV ({error}); write one row a line and "
                'close each field quoted with " (one left open runs on over the lines below).'
            ) from None
        yield start, row


def _csv_fields(
    path: str, header: list[str], rows: Iterator[tuple[int, list[str]]]
) -> list[list[str]]:
    """Each column's fields of the rows below the header."""
    fields: list[list[str]] = [[] for _ in header]
    for line, row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"{path} line {line} has {len(row)} fields and the header {len(header)}; "
                "quote a field that holds a comma, and give every row each column."
            )
        for column, field in zip(fields, row):
            column.append(field)
    return fields


def _parquet_table(path: str) -> Table:
    import pyarrow  # installed with tensorflow-datasets; only Parquet files need it
    import pyarrow.parquet

    try:
        _check_distinct(path, pyarrow.parquet.read_schema(path).names)
        table = pyarrow.parquet.read_table(path)
    except pyarrow.ArrowException as error:
        raise ValueError(
            f"{path} does not read as Parquet ({error}); check that the file is whole (a copy "
            "cut short loses the footer Parquet reads first), or write it again."
        ) from None
    if table.num_rows == 0:
        raise ValueError(f"{path} has no rows; a feature table needs rows.")
    columns, undecodable = {}, {}
    for name in table.column_names:
        values = table[name].to_pylist()
        if holds_bytes(table.schema.field(name).type):
            values = [decoded(value) for value in values]
            row = next((row for row, value in enumerate(values) if _undecoded(value)), None)
            if row is not None:
                undecodable[name] = row
        columns[name] = values
    return Table(path, columns, "row", 0, undecodable)


def holds_bytes(kind: Any) -> bool:
    """Whether a Parquet column of this pyarrow type holds bytes (alone or in lists)."""
    import pyarrow.types as types

    if types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind):
        return holds_bytes(kind.value_type)
    return bool(
        types.is_binary(kind)
        or types.is_large_binary(kind)
        or types.is_fixed_size_binary(kind)
        or types.is_binary_view(kind)
    )


def decoded(value: Any) -> Any:
    """A binary value as its UTF-8 text (a list of them as a list), as a CSV file's text reads;
    bytes that are not UTF-8 stay bytes, refused if the spec reads their column."""
    if isinstance(value, list):
        return [decoded(item) for item in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _undecoded(value: Any) -> bool:
    return isinstance(value, bytes) or (
        isinstance(value, list) and any(isinstance(item, bytes) for item in value)
    )


@dataclasses.dataclass(frozen=True)
class FittedFeatures:
    """What the training rows decided for each column of `spec`: the vocabularies (most
    frequent first, by name) and each numeric column's center and scale."""

    spec: FeatureSpec
    vocabularies: dict[str, list[str]]
    scales: dict[str, tuple[float, float]]
    # A numeric column with `buckets`: the training values' quantiles that bound its buckets
    # (as `numbers_of` reads its values: log1p'd for normalize=log), distinct, increasing.
    boundaries: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def cardinalities(self) -> dict[str, int]:
        """The rows of each categorical and multi-hot column's table (row 0 out-of-vocabulary
        for a vocabulary; the buckets for a hashed column), and of each numeric column's
        buckets (`bucket_name`: one more than its boundaries)."""
        dynamic = self.dynamic_columns()
        tables = {
            column.name: dynamic[column.name]["capacity"]
            if column.name in dynamic
            else column.option("hash_buckets") or len(self.vocabularies[column.name]) + 1
            for column in self.spec.columns
            if column.kind != "numeric"
        }
        for name, bounds in self.boundaries.items():
            tables[bucket_name(name)] = len(bounds) + 1
        return tables

    def dynamic_columns(self) -> dict[str, dict[str, Any]]:
        """Each dynamic column's `dynamic` (capacity and policy), by name."""
        return {
            column.name: dict(column.options["dynamic"])
            for column in self.spec.columns
            if column.options.get("dynamic")
        }

    def to_json(self) -> str:
        """Everything `from_json` needs, as JSON text (for a checkpoint or an export)."""
        spec = {
            "label": self.spec.label,
            "positive": self.spec.positive,
            "columns": [
                {"name": column.name, "kind": column.kind, **column.options}
                for column in self.spec.columns
            ],
        }
        # Strict JSON: every scale is finite (`_scale`), so no Infinity or NaN is written.
        saved: dict[str, Any] = {
            "spec": spec,
            "vocabularies": self.vocabularies,
            "scales": self.scales,
        }
        if self.boundaries:
            saved["boundaries"] = self.boundaries
        return json.dumps(saved, sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> FittedFeatures:
        saved = json.loads(text)
        scales = {name: (float(a), float(b)) for name, (a, b) in saved["scales"].items()}
        boundaries = {name: list(map(float, b)) for name, b in saved.get("boundaries", {}).items()}
        return cls(FeatureSpec.from_json(saved["spec"]), saved["vocabularies"], scales, boundaries)

    def arrays(
        self, table: Table, *, part: bool = False
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(column name -> array, labels) of `table`'s rows (`part`: a block of a log, as
        `labels_of` takes it): numeric columns float32 after normalization, categorical int64
        rows (a crossed column's of the values it joins), multi-hot int64 rows padded with
        `PAD_ID`; labels float32 0/1.

        Raises:
            ValueError: a spec column or crossed column missing from the table (naming the
                closest), a crossed column's name that is a column of the table, or a field
                that is not what its column takes, naming the row and the value.
        """
        check_header(self.spec, table)
        columns = {}
        for column in self.spec.columns:
            fields = fields_of(column, table)
            if column.kind == "numeric":
                values = numbers_of(column, fields, table)
                columns[column.name] = _normalized(column, values, self.scales[column.name], table)
                if column.name in self.boundaries:
                    columns[bucket_name(column.name)] = bucket_ids(
                        values, self.boundaries[column.name]
                    )
            else:
                bags = bags_of(column, fields, table)
                columns[column.name] = self._rows_of(column, bags)
        return columns, labels_of(self.spec, table, part=part)

    def _rows_of(self, column: Column, bags: list[list[str]]) -> np.ndarray:
        flat = [value for bag in bags for value in bag]
        buckets = column.hash_buckets()
        if buckets:
            ids = _hashed(flat, buckets)
        else:
            index = {value: row for row, value in enumerate(self.vocabularies[column.name], 1)}
            ids = np.array([index.get(value, 0) for value in flat], np.int64)
        if column.kind == "categorical":
            return ids
        width = max(1, max(map(len, bags), default=1))
        padded = np.full((len(bags), width), PAD_ID, np.int64)
        lengths = np.array([len(bag) for bag in bags], np.int64)
        mask = np.arange(width)[None, :] < lengths[:, None]
        padded[mask] = ids
        return padded


def fit(spec: FeatureSpec, table: Table) -> FittedFeatures:
    """The vocabularies and numeric scales `spec` asks for, learned from `table` (the training
    rows only: validation and test rows must not shape them).

    Raises:
        ValueError: as `FittedFeatures.arrays`, for the training rows, or labels of one value
            alone (nothing to learn).
    """
    check_header(spec, table)
    labels = labels_of(spec, table)
    vocabularies: dict[str, list[str]] = {}
    scales: dict[str, tuple[float, float]] = {}
    boundaries: dict[str, list[float]] = {}
    for column in spec.columns:
        fields = fields_of(column, table)
        if column.kind == "numeric":
            values = numbers_of(column, fields, table)
            scales[column.name] = _scale(column, values)
            if column.option("buckets"):
                boundaries[column.name] = quantile_boundaries(
                    np.sort(values), np.ones(len(values)), column.option("buckets")
                )
            _normalized(column, values, scales[column.name], table)  # each within float32
        elif not column.hash_buckets():
            counts = collections.Counter(v for bag in bags_of(column, fields, table) for v in bag)
            vocabularies[column.name] = vocabulary_of(column, counts)
    _check_both_labels(spec, table, labels)
    return FittedFeatures(spec, vocabularies, scales, boundaries)


def quantile_boundaries(values: np.ndarray, weights: np.ndarray, buckets: int) -> list[float]:
    """The boundaries of at most `buckets` buckets of equal weight over sorted `values` of
    these weights: walking up the distinct values, a bucket ends once it holds its share of
    the weight left (the weight left over the buckets left), and the next value starts the
    next. A value heavier than a share is a bucket of its own and the buckets left split the
    rest: a column that is 0 on most rows (capital gains) gets 0 alone, then thresholds among
    the others. Each boundary is the first value of a bucket."""
    if not len(values):
        return []
    distinct, starts = np.unique(values, return_index=True)
    mass = np.add.reduceat(np.asarray(weights, np.float64), starts)
    bounds: list[float] = []
    left, buckets_left, held = float(mass.sum()), buckets, 0.0
    for index in range(len(distinct) - 1):
        held += mass[index]
        if buckets_left > 1 and held >= left / buckets_left:
            bounds.append(float(distinct[index + 1]))
            left, buckets_left, held = left - held, buckets_left - 1, 0.0
    return bounds


def bucket_ids(values: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """Each value's bucket, 0..len(boundaries): the boundaries at or below it (int64)."""
    return np.searchsorted(np.asarray(boundaries, np.float64), values, side="right").astype(
        np.int64
    )


def vocabulary_of(column: Column, counts: Mapping[str, int]) -> list[str]:
    """A column's vocabulary from its values' counts: the values seen `min_count` times or
    more, most frequent first, then by value (the same vocabulary from the same rows, in any
    order), the first `max_vocabulary` of them (all when None)."""
    kept = [value for value, count in counts.items() if count >= column.option("min_count")]
    ordered = sorted(kept, key=lambda value: (-counts[value], value))
    most = column.option("max_vocabulary")
    return ordered if most is None else ordered[:most]


def check_header(spec: FeatureSpec, table: Table) -> None:
    """Refuses a label or column the table lacks, a crossed column that crosses one, or a
    crossed column named as a column the table has."""
    for name in (spec.label, *(column.name for column in spec.columns if not column.crosses())):
        _check_has(table, name, f"The feature spec names column {name!r}")
    for column in spec.columns:
        if column.crosses() and column.name in table.columns:
            raise ValueError(
                f"Column {column.name!r} crosses {', '.join(column.crosses())} and {table.path} "
                f"has a column {column.name!r} too; give the crossed column a name of its own "
                f"(e.g. {column.name + '_cross'!r}), or drop its cross to read the table's."
            )
        for source in column.crosses():
            _check_has(table, source, f"Column {column.name!r} crosses {source!r}")


def _check_has(table: Table, name: str, start: str) -> None:
    """Refuses a column `name` the table lacks, naming the closest it has, or one of bytes
    that are not UTF-8 text."""
    if name not in table.columns:
        close = difflib.get_close_matches(name, table.columns, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(
            f"{start}, which {table.path} does not have (its columns: "
            f"{', '.join(table.columns)}){hint}"
        )
    if name in table.undecodable:
        row = table.undecodable[name]
        raise ValueError(
            f"{table.where(row)}: column {name!r} (binary) holds {table.columns[name][row]!r:.60}, "
            "which is not UTF-8 text; write the column as UTF-8 strings (or numbers), or leave "
            "it out of the spec."
        )


def fields_of(column: Column, table: Table) -> Sequence[Any]:
    """The fields `column` reads: the table's column of its name, or a crossed column's
    joined values (`_crossed`)."""
    return _crossed(column, table) if column.crosses() else table.columns[column.name]


def _crossed(column: Column, table: Table) -> list[str]:
    """Each row's value of a crossed column: the text of each crossed column's value (as a
    categorical column reads it: "" for an empty field, "3" for 3 and 3.0), joined by the
    column's separator, which none of them may hold (else two rows of other values could
    join to one text)."""
    separator, sources = column.option("separator"), column.crosses()
    joined = []
    for row, values in enumerate(zip(*(table.columns[source] for source in sources))):
        texts = []
        for source, value in zip(sources, values):
            where = f"{table.where(row)}: column {source!r}, crossed by {column.name!r},"
            if isinstance(value, (list, tuple)):
                raise ValueError(f"{where} holds a list ({value!r}); cross single values.")
            text = "" if value is None else text_of(value)
            if separator in text:
                raise ValueError(
                    f"{where} holds {text!r}, which has the cross's separator {separator!r}; "
                    f'give {column.name!r} a "separator" that no crossed value holds.'
                )
            texts.append(text)
        joined.append(separator.join(texts))
    return joined


def numbers_of(column: Column, fields: Sequence[Any], table: Table) -> np.ndarray:
    fill, values = column.option("fill"), np.empty(len(fields), np.float64)
    for row, field in enumerate(fields):
        if field is None or (isinstance(field, str) and not field.strip()):
            if fill is None:
                raise ValueError(
                    f"{table.where(row)}: numeric column {column.name!r} is empty; give the "
                    'column a "fill" value in the spec (e.g. "fill": 0), or fill the file.'
                )
            field = fill
        try:
            value = float(field)
        except (TypeError, ValueError):
            raise ValueError(
                f"{table.where(row)}: numeric column {column.name!r} holds {field!r}, not a "
                "number; make it a categorical column, or correct the value."
            ) from None
        if not math.isfinite(value) or (column.option("normalize") == "log" and value < 0):
            wanted = "a non-negative number (normalize=log)" if math.isfinite(value) else "finite"
            raise ValueError(
                f"{table.where(row)}: numeric column {column.name!r} holds {field!r}; it must be "
                f"{wanted}."
            )
        values[row] = value
    return np.log1p(values) if column.option("normalize") == "log" else values


def _scale(column: Column, values: np.ndarray) -> tuple[float, float]:
    """(center, scale) of a numeric column: mean and standard deviation for "standard" (a
    constant column keeps scale 1), else (0, 1); both finite for any finite values."""
    if column.option("normalize") != "standard":
        return 0.0, 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        center, deviation = float(values.mean()), float(values.std())
    if not (math.isfinite(center) and math.isfinite(deviation)):
        # A sum or a square past float64's range (values of 1e155 and more): the same figures
        # of the values divided by the largest magnitude, where no square passes 1, times it.
        largest = float(np.abs(values).max())
        unit = values / largest
        center, deviation = float(unit.mean()) * largest, float(unit.std()) * largest
    return center, deviation if deviation > 0 else 1.0


def _normalized(
    column: Column, values: np.ndarray, scale: tuple[float, float], table: Table
) -> np.ndarray:
    """A numeric column's values centred and scaled, as the float32 the model reads.

    Raises:
        ValueError: a value whose normalized value is past float32's range (a value of
            normalize=none over 3.4e38, or one far beyond the training rows' deviation),
            naming the row, the value and the fix.
    """
    center, deviation = scale
    with np.errstate(over="ignore", invalid="ignore"):
        normalized = (values - center) / deviation
        # A difference past float64's range (values of both signs near 1.8e308), taken apart.
        apart = ~np.isfinite(normalized)
        normalized[apart] = values[apart] / deviation - center / deviation
        prepared = normalized.astype(np.float32)
    beyond = np.flatnonzero(~np.isfinite(prepared))
    if beyond.size:
        row = int(beyond[0])
        how, other = "", '"standard" or "log"'
        if column.option("normalize") == "standard":
            other = '"log"'
            how = (
                f", less the training rows' mean {center:.4g} over their deviation {deviation:.4g},"
            )
        raise ValueError(
            f"{table.where(row)}: numeric column {column.name!r} holds {values[row]:.6g}, "
            f"which normalized{how} is {normalized[row]:.4g}, past the range of the float32 "
            f'the model reads (3.4e+38); give the column "normalize": {other}, or rescale its '
            "values."
        )
    return prepared


def bags_of(column: Column, fields: Sequence[Any], table: Table) -> list[list[str]]:
    """Each row's values as text: one for a categorical column, any number for a multi-hot
    one (a list, or text split at its separator; an empty field an empty bag)."""
    separator = column.option("separator") if column.kind == "multi_hot" else None
    bags: list[list[str]] = []
    for row, field in enumerate(fields):
        if column.kind == "categorical":
            if isinstance(field, (list, tuple)):
                raise ValueError(
                    f"{table.where(row)}: categorical column {column.name!r} holds a list "
                    f"({field!r}); make it a multi_hot column."
                )
            bags.append(["" if field is None else text_of(field)])
        elif isinstance(field, (list, tuple)):
            bags.append([text_of(value) for value in field if value is not None])
        elif field is None or field == "":
            bags.append([])
        else:
            bags.append(text_of(field).split(separator))
    return bags


def text_of(value: Any) -> str:
    """A value as a categorical column reads it."""
    # 3 and 3.0 of a Parquet column are one category, as "3" of a CSV file.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _hashed(values: list[str], buckets: int) -> np.ndarray:
    """Rows by TensorFlow's FarmHash (`tf.strings.to_hash_bucket_fast`): a serving graph
    hashes a raw value to the row training used."""
    import tensorflow as tf

    if not values:
        return np.zeros(0, np.int64)
    return tf.strings.to_hash_bucket_fast(values, buckets).numpy().astype(np.int64)


def labels_of(spec: FeatureSpec, table: Table, *, part: bool = False) -> np.ndarray:
    """The table's labels as 0/1 float32. A table of `positive` and one other value; `part`: a
    part of a log (a block), which may hold one of them alone (the log's statistics pass
    checks the whole)."""
    fields = table.columns[spec.label]
    if spec.positive is not None:
        texts = [text_of(field) for field in fields]
        others = sorted(set(texts) - {spec.positive})
        if len(others) > 1 or (spec.positive not in texts and not part):
            raise ValueError(
                f"Label column {spec.label!r} of {table.path} holds "
                f"{', '.join(map(repr, sorted(set(texts))[:6]))}: with positive="
                f"{spec.positive!r} it must hold that value and one other (the negatives)."
            )
        return np.array([text == spec.positive for text in texts], np.float32)
    labels = np.empty(len(fields), np.float32)
    for row, field in enumerate(fields):
        label = _label_number(field)
        if label is None:
            raise ValueError(
                f"{table.where(row)}: label column {spec.label!r} holds {field!r}, not 0 or 1; "
                'name the value of a click in the spec (e.g. "positive": ">50K").'
            )
        labels[row] = label
    return labels


def _label_number(field: Any) -> float | None:
    """A label field as the number 0 or 1 it reads as, None for any other: one rule for a CSV
    file's text and a Parquet file's values, the field read as a number ("1", " 1", "1.0",
    1, 1.0 and a boolean's True alike; "True" as text is no number)."""
    try:
        number = float(field)
    except (TypeError, ValueError):
        return None
    return float(number == 1.0) if number in (0.0, 1.0) else None


def _check_both_labels(spec: FeatureSpec, table: Table, labels: np.ndarray) -> None:
    """Refuses training rows of one label alone: nothing to learn (and no AUC to measure)."""
    if labels.min() != labels.max():
        return
    if spec.positive is None:
        value, both = f"is {labels[0]:.0f}", "0 and 1"
    else:  # every row holds `positive`: a label without it is refused by `labels_of`
        value, both = f"holds {spec.positive!r} (positive)", f"{spec.positive!r} and another"
    raise ValueError(
        f"Label column {spec.label!r} of {table.path} {value} on all {len(labels)} rows: with "
        f"one label there is nothing to learn (nor an AUC to measure); give rows of both "
        f"labels, {both}."
    )
