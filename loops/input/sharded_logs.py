"""A log kept as shards of Parquet, TFRecord or CSV/TSV files, found by a file, a directory or a
glob, indexed into blocks of rows (a Parquet row group, or a run of TFRecord records or text
lines) with each shard's identity, and read one block at a time into a `feature_tables.Table`.

The index holds a few numbers a block (its shard, first row, row count and where its bytes
start), never a row: a log of billions of rows is indexed in megabytes, and reading block b
opens its shard alone. Shards are taken in the order of their paths, so the same files listed
in any order, or found by another glob, are the same log.

Formats (`FORMATS`): "parquet" (a row group a block; columns by their names), "tfrecord"
(`tf.train.Example` records, each feature a column by its name; a feature a record lacks is an
empty field), "csv" and "tsv" (a header line, then a row a line; a quoted field may not hold a
line break) and "criteo" (Criteo's click logs: tab-separated lines with no header, the label,
13 integer columns I1..I13 and 26 hexadecimal categorical columns C1..C26).

Nothing here imports TensorFlow when loaded; a TFRecord block parses its records with it.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import io
import os
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from loops.input.feature_tables import Table
from loops.vocabulary.whole_numbers import check_whole

FORMATS = ("parquet", "tfrecord", "csv", "tsv", "criteo")
CRITEO_COLUMNS = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))
# Rows of a TFRecord or text block: a Parquet file's row groups are its own.
BLOCK_ROWS = 8192
# The bytes of each end of a shard its identity's checksum reads.
_IDENTITY_BYTES = 1 << 16
_SUFFIXES = {
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrec": "tfrecord",
    ".csv": "csv",
    ".tsv": "tsv",
}


@dataclasses.dataclass(frozen=True)
class Shard:
    """One file of a log: its path, its name within the log (relative to the log's root), and
    its identity (size, modification time and a CRC-32 of its first and last 64 KiB)."""

    path: str
    name: str
    size: int
    modified_ns: int
    checksum: int

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "checksum": f"{self.checksum:08x}"}


@dataclasses.dataclass(frozen=True)
class Block:
    """Rows first_row..first_row + rows - 1 of shard `shard` (its index in the log), whose
    bytes start at `offset` (a row group's number for Parquet)."""

    shard: int
    first_row: int
    rows: int
    offset: int
    end: int


class BlockTable:
    """A block's rows as a pyarrow table (`arrow`), and as a `feature_tables.Table` of Python
    values when asked (`table()`: the row-by-row checks' sentences name the shard and row)."""

    def __init__(self, path: str, arrow: Any, row_word: str, first_row: int, rows: Any = None):
        self.path, self.arrow, self.row_word, self.first_row = path, arrow, row_word, first_row
        self.rows = rows  # each row's number in its block (None: all of them, in order)
        self._table: Table | None = None

    @property
    def num_rows(self) -> int:
        return int(self.arrow.num_rows)

    def table(self) -> Table:
        if self._table is None:
            from loops.input import feature_tables

            columns, undecodable = {}, {}
            for name in self.arrow.column_names:
                values = self.arrow[name].to_pylist()
                if feature_tables.holds_bytes(self.arrow.schema.field(name).type):
                    values = [feature_tables.decoded(value) for value in values]
                    row = next((r for r, v in enumerate(values) if _undecoded(v)), None)
                    if row is not None:
                        undecodable[name] = row
                columns[name] = values
            self._table = Table(
                self.path, columns, self.row_word, self.first_row, undecodable, self.rows
            )
        return self._table

    def taken(self, index: np.ndarray) -> BlockTable:
        """The rows at `index` (a split's rows of the block)."""
        import pyarrow

        rows = index if self.rows is None else np.asarray(self.rows)[index]
        arrow = self.arrow.take(pyarrow.array(index))
        return BlockTable(self.path, arrow, self.row_word, self.first_row, rows)


def _undecoded(value: Any) -> bool:
    return isinstance(value, bytes) or (
        isinstance(value, list) and any(isinstance(item, bytes) for item in value)
    )


class ShardedLog:
    """The shards of a log and their blocks (`open`); `read(b)` reads block b alone.

    Attributes:
        format: one of `FORMATS`.
        shards: the log's files, by path.
        blocks: every block of every shard, shard by shard; an empty shard has none.
        columns: the columns a row has (a TFRecord log's: the features its first record holds).
    """

    def __init__(
        self,
        file_format: str,
        root: str,
        shards: Sequence[Shard],
        blocks: Sequence[Block],
        columns: Sequence[str],
    ):
        self.format, self.root = file_format, root
        self.shards, self.blocks, self.columns = tuple(shards), tuple(blocks), tuple(columns)
        self.opened: list[int] = []  # the shards read so far, in order (tests hold it to O(1))

    @property
    def num_rows(self) -> int:
        return sum(block.rows for block in self.blocks)

    def block_rows(self) -> np.ndarray:
        return np.array([block.rows for block in self.blocks], np.int64)

    def identity(self) -> dict[str, Any]:
        """What a run that trained on this log records of it: its format, rows and each shard's
        identity (a shard changed, added or gone is another log)."""
        return {
            "format": self.format,
            "rows": self.num_rows,
            "shards": [shard.identity() for shard in self.shards],
        }

    def __repr__(self) -> str:
        return f"ShardedLog({self.root!r}, {self.format}, {len(self.shards)} shards)"

    @classmethod
    def open(
        cls, pattern: str, *, file_format: str | None = None, block_rows: int = BLOCK_ROWS
    ) -> ShardedLog:
        """The log at `pattern`: a file, a directory (its files, not those in folders within or
        named with a leading dot) or a glob; its format from `file_format` or the files'
        suffixes (.parquet, .tfrecord, .csv, .tsv; "criteo" only by name).

        Raises:
            ValueError: nothing found, shards of several formats, an unknown format, or a shard
                its format cannot read, naming the path and the fix.
        """
        check_whole("block_rows", block_rows, 1)
        paths, root = _found(pattern)
        file_format = _format_of(pattern, paths, file_format)
        shards = [_shard(path, root) for path in paths]
        indexer = _INDEXERS[file_format]
        blocks: list[Block] = []
        columns: list[str] | None = None
        for number, shard in enumerate(shards):
            shard_blocks, shard_columns = indexer(shard.path, number, block_rows)
            blocks += shard_blocks
            if columns is None and shard_blocks:
                columns = shard_columns
            elif shard_blocks and shard_columns != columns and file_format != "tfrecord":
                raise ValueError(
                    f"{shard.path} has columns {shard_columns} and {shards[0].path} "
                    f"{columns}; every shard of a log has the same columns."
                )
        if not blocks:
            raise ValueError(f"{pattern} holds {len(shards)} shards and no rows; a log needs rows.")
        return cls(file_format, root, shards, blocks, columns or [])

    def read(self, block: int) -> BlockTable:
        """Block `block`'s rows (a text shard's fields as text, a Parquet or TFRecord shard's as
        their values), named by its shard and first row."""
        where = self.blocks[block]
        shard = self.shards[where.shard]
        self.opened.append(where.shard)
        arrow = _READERS[self.format](shard.path, where, self.columns)
        # How a sentence names a row: a text shard's line (below its header), else its row.
        lines = {"csv": 2, "tsv": 2, "criteo": 1}.get(self.format)
        if lines is None:
            return BlockTable(shard.path, arrow, "row", where.first_row)
        return BlockTable(shard.path, arrow, "line", where.first_row + lines)

    def check_unchanged(self) -> None:
        """Refuses a log whose shards changed since it was indexed (size or checksum), or are
        gone, naming the first such shard."""
        for shard in self.shards:
            if not os.path.isfile(shard.path):
                raise ValueError(
                    f"Shard {shard.path} of {self.root} is gone; restore it, or start a new run "
                    "on the log as it is now."
                )
            now = _shard(shard.path, self.root)
            if (now.size, now.checksum) != (shard.size, shard.checksum):
                raise ValueError(
                    f"Shard {shard.path} of {self.root} changed since the log was indexed "
                    f"({shard.size} -> {now.size} bytes); a stream's positions count its rows "
                    "as they were: restore it, or start a new run."
                )


def row_fractions(log: ShardedLog, block: int) -> np.ndarray:
    """Each row of block `block` as a number in [0, 1) that depends on its shard's name and its
    row number alone (a split of the log by it is the same on any layout and in any order of
    the shards): splitmix64 of (CRC-32 of the name, row), its top 53 bits."""
    where = log.blocks[block]
    name = zlib.crc32(log.shards[where.shard].name.encode("utf-8"))
    rows = np.arange(where.first_row, where.first_row + where.rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = rows + np.uint64(name) * np.uint64(0x9E3779B97F4A7C15)
        mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed = mixed ^ (mixed >> np.uint64(31))
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclasses.dataclass(frozen=True)
class LogPart:
    """The rows of a log whose `row_fractions` fall in [low, high): a split (train,
    validation or test) that needs no pass over the log to draw."""

    log: ShardedLog
    low: float = 0.0
    high: float = 1.0

    def keep(self, block: int) -> np.ndarray:
        """Which rows of block `block` the part holds (a boolean mask)."""
        if self.low <= 0.0 and self.high >= 1.0:
            return np.ones(self.log.blocks[block].rows, bool)
        fractions = row_fractions(self.log, block)
        return (fractions >= self.low) & (fractions < self.high)

    def counts(self) -> np.ndarray:
        """The part's rows in each block, from the index alone (no block is read)."""
        return np.array([int(self.keep(b).sum()) for b in range(len(self.log.blocks))], np.int64)

    def read(self, block: int) -> BlockTable:
        """Block `block`'s rows of the part, in their order."""
        table = self.log.read(block)
        keep = self.keep(block)
        return table if keep.all() else table.taken(np.flatnonzero(keep))

    def __repr__(self) -> str:
        return f"{self.log!r}'s rows in [{self.low:g}, {self.high:g})"


def _found(pattern: str) -> tuple[list[str], str]:
    """The shard paths `pattern` names (sorted) and the root their names are relative to."""
    if os.path.isdir(pattern):
        root = os.path.abspath(pattern)
        names = sorted(n for n in os.listdir(root) if not n.startswith("."))
        paths = [os.path.join(root, n) for n in names if os.path.isfile(os.path.join(root, n))]
    elif os.path.isfile(pattern):
        paths = [os.path.abspath(pattern)]
        root = os.path.dirname(paths[0])
    else:
        paths = sorted(os.path.abspath(p) for p in glob.glob(pattern) if os.path.isfile(p))
        root = os.path.commonpath(paths) if paths else ""
        root = os.path.dirname(root) if len(paths) == 1 else root
    if not paths:
        raise ValueError(
            f"{pattern} names no file: give a file, a directory of shards, or a glob "
            "(e.g. 'logs/day-*.parquet') that matches some."
        )
    return paths, root


def _format_of(pattern: str, paths: Sequence[str], file_format: str | None) -> str:
    if file_format is not None:
        if file_format not in FORMATS:
            raise ValueError(
                f"Unknown log format {file_format!r}; give one of {', '.join(FORMATS)}."
            )
        return file_format
    kinds = {_SUFFIXES.get(os.path.splitext(path)[1].lower()) for path in paths}
    if None in kinds or len(kinds) > 1:
        odd = sorted({os.path.splitext(path)[1] or "(none)" for path in paths})
        raise ValueError(
            f"The shards of {pattern} are named {', '.join(odd)}: name the format "
            f"(one of {', '.join(FORMATS)}; Criteo's TSV logs: criteo), or keep one format "
            "a log, with its suffix."
        )
    return kinds.pop() or ""


def _shard(path: str, root: str) -> Shard:
    status = os.stat(path)
    with open(path, "rb") as stream:
        checksum = zlib.crc32(stream.read(_IDENTITY_BYTES))
        if status.st_size > _IDENTITY_BYTES:
            stream.seek(max(_IDENTITY_BYTES, status.st_size - _IDENTITY_BYTES))
            checksum = zlib.crc32(stream.read(), checksum)
    name = os.path.relpath(path, root) if root else os.path.basename(path)
    return Shard(path, name, status.st_size, status.st_mtime_ns, checksum)


# ---- Parquet: a row group a block.


def _parquet_blocks(path: str, shard: int, block_rows: int) -> tuple[list[Block], list[str]]:
    import pyarrow
    import pyarrow.parquet

    try:
        metadata = pyarrow.parquet.ParquetFile(path).metadata
    except pyarrow.ArrowException as error:
        raise ValueError(
            f"{path} does not read as Parquet ({error}); check that the file is whole, or "
            "write it again."
        ) from None
    blocks, first = [], 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if rows:
            blocks.append(Block(shard, first, rows, group, group + 1))
        first += rows
    return blocks, list(metadata.schema.to_arrow_schema().names)


def _parquet_read(path: str, block: Block, columns: Sequence[str]) -> Any:
    """A row group, its text columns as dictionaries (Parquet keeps them so): a vocabulary
    then maps each distinct value once (`arrow_features`)."""
    import pyarrow.parquet
    import pyarrow.types as types

    schema = pyarrow.parquet.read_schema(path)
    texts = [f.name for f in schema if types.is_string(f.type) or types.is_large_string(f.type)]
    return pyarrow.parquet.ParquetFile(path, read_dictionary=texts).read_row_group(block.offset)


# ---- TFRecord: runs of `block_rows` records, each a tf.train.Example.


def _tfrecord_blocks(path: str, shard: int, block_rows: int) -> tuple[list[Block], list[str]]:
    starts, size = [], os.path.getsize(path)
    with open(path, "rb") as stream:
        offset, count = 0, 0
        while offset < size:
            header = stream.read(12)
            if len(header) < 12:
                raise ValueError(
                    f"{path} ends inside a TFRecord header at byte {offset}; the file was cut "
                    "short: write it again."
                )
            if count % block_rows == 0:
                starts.append((count, offset))
            (length,) = struct.unpack("<Q", header[:8])
            offset += 12 + length + 4
            stream.seek(offset)
            count += 1
        if offset != size:
            raise ValueError(f"{path} ends inside a TFRecord record; write it again.")
    blocks = []
    for number, (first, start) in enumerate(starts):
        end = starts[number + 1][1] if number + 1 < len(starts) else size
        rows = (starts[number + 1][0] if number + 1 < len(starts) else count) - first
        blocks.append(Block(shard, first, rows, start, end))
    columns = _feature_names(_records(path, blocks[0])[0]) if blocks else []
    return blocks, columns


def _records(path: str, block: Block) -> list[bytes]:
    with open(path, "rb") as stream:
        stream.seek(block.offset)
        data = stream.read(block.end - block.offset)
    records, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        records.append(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
    return records


def _feature_names(record: bytes) -> list[str]:
    """The features a `tf.train.Example` record holds, by name."""
    import tensorflow as tf

    return sorted(tf.train.Example.FromString(record).features.feature)


def _tfrecord_read(path: str, block: Block, columns: Sequence[str]) -> Any:
    """A block's records parsed by `tf.io.parse_example`: a feature of at most one value a
    record a column of values (null where a record lacks it), one of several values on some
    record a column of lists. Each feature's kind (int64, float or bytes) is its first
    record's that holds it."""
    import pyarrow
    import tensorflow as tf

    records = _records(path, block)
    kinds = _feature_kinds(records, columns)
    try:
        parsed = tf.io.parse_example(
            tf.constant(records), {name: tf.io.VarLenFeature(kinds[name]) for name in columns}
        )
    except tf.errors.InvalidArgumentError as error:
        raise ValueError(
            f"{path}: the records from {block.first_row} give a feature values of several kinds "
            f"(int64, float, bytes): {error.message.splitlines()[0]:.200}; give a feature one "
            "kind on every record."
        ) from None
    read = {}
    for name in columns:
        sparse = parsed[name]
        rows = sparse.indices[:, 0].numpy()
        values = sparse.values.numpy()
        counts = np.bincount(rows, minlength=len(records))
        array = pyarrow.array(values)
        if kinds[name] == tf.string:
            try:
                array = array.cast(pyarrow.string())
            except pyarrow.ArrowException:
                raise ValueError(
                    f"{path}: feature {name!r} of the records from {block.first_row} holds bytes "
                    "that are not UTF-8 text; write text features as UTF-8."
                ) from None
        if counts.max(initial=0) > 1:
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            read[name] = pyarrow.ListArray.from_arrays(pyarrow.array(offsets), array)
        else:
            # One value or none a record: the value at its row, null where none.
            index = np.full(len(records), -1, np.int64)
            index[rows] = np.arange(len(rows))
            mask = pyarrow.array(index < 0)
            read[name] = (
                array.take(pyarrow.array(np.maximum(index, 0)))
                if len(array)
                else (pyarrow.nulls(len(records), array.type))
            )
            read[name] = pyarrow.compute.if_else(mask, pyarrow.scalar(None, array.type), read[name])
    return pyarrow.table(read)


def _feature_kinds(records: Sequence[bytes], columns: Sequence[str]) -> dict[str, Any]:
    """Each feature's dtype, from the first record that holds it (bytes for one none holds)."""
    import tensorflow as tf

    kinds: dict[str, Any] = {}
    dtypes = {"int64_list": tf.int64, "float_list": tf.float32, "bytes_list": tf.string}
    for record in records:
        features = tf.train.Example.FromString(record).features.feature
        for name in columns:
            if name not in kinds and name in features:
                kind = features[name].WhichOneof("kind")
                if kind and len(getattr(features[name], kind).value):
                    kinds[name] = dtypes[kind]
        if len(kinds) == len(columns):
            break
    return {name: kinds.get(name, tf.string) for name in columns}


# ---- Text: runs of `block_rows` lines below the header (none for Criteo's logs).


def _text_blocks(path: str, shard: int, block_rows: int, delimiter: str, header: bool):
    starts, count = [], 0
    with open(path, "rb") as stream:
        first_line = stream.readline() if header else b""
        offset = len(first_line)
        for line in stream:
            if count % block_rows == 0:
                starts.append((count, offset))
            offset += len(line)
            count += 1
        size = offset
    names = next(csv.reader([first_line.decode("utf-8").rstrip("\r\n")], delimiter=delimiter))
    blocks = []
    for number, (first, start) in enumerate(starts):
        end = starts[number + 1][1] if number + 1 < len(starts) else size
        rows = (starts[number + 1][0] if number + 1 < len(starts) else count) - first
        blocks.append(Block(shard, first, rows, start, end))
    return blocks, list(names) if header else list(CRITEO_COLUMNS)


def _text_read(path: str, block: Block, columns: Sequence[str], delimiter: str) -> Any:
    import pyarrow
    import pyarrow.csv

    with open(path, "rb") as stream:
        stream.seek(block.offset)
        data = stream.read(block.end - block.offset)
    try:
        return pyarrow.csv.read_csv(
            io.BytesIO(data),
            read_options=pyarrow.csv.ReadOptions(column_names=list(columns)),
            parse_options=pyarrow.csv.ParseOptions(delimiter=delimiter),
            convert_options=pyarrow.csv.ConvertOptions(
                column_types={name: pyarrow.string() for name in columns},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except pyarrow.ArrowException:
        pass  # read again by Python's csv below, for the sentence that names the row
    fields: list[list[str]] = [[] for _ in columns]
    reader = csv.reader(io.StringIO(data.decode("utf-8")), delimiter=delimiter)
    for number, row in enumerate(reader):
        if len(row) != len(columns):
            raise ValueError(
                f"{path} row {block.first_row + number} (of its data rows, from 0) has "
                f"{len(row)} fields and the log {len(columns)}; give every row each column."
            )
        for column, field in zip(fields, row):
            column.append(field)
    return pyarrow.table(dict(zip(columns, fields)))


_INDEXERS = {
    "parquet": _parquet_blocks,
    "tfrecord": _tfrecord_blocks,
    "csv": lambda path, shard, rows: _text_blocks(path, shard, rows, ",", True),
    "tsv": lambda path, shard, rows: _text_blocks(path, shard, rows, "\t", True),
    "criteo": lambda path, shard, rows: _text_blocks(path, shard, rows, "\t", False),
}
_READERS = {
    "parquet": _parquet_read,
    "tfrecord": _tfrecord_read,
    "csv": lambda path, block, columns: _text_read(path, block, columns, ","),
    "tsv": lambda path, block, columns: _text_read(path, block, columns, "\t"),
    "criteo": lambda path, block, columns: _text_read(path, block, columns, "\t"),
}
