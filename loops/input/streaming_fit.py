"""A feature spec's statistics (vocabularies, numeric scales) fitted by one pass over a sharded
log's blocks in bounded memory: each block gives its partial statistics (`block_partials`),
partials are merged in block order (`FitPartials.merged`), so any split of the blocks over
processes, and the shards listed in any order, give the same `FittedFeatures` bit for bit.

What a block's partials hold: each vocabulary column's value counts, each numeric column's row
count, largest magnitude, mean and sum of squared deviations of its values over that magnitude
(Chan's pairwise update: no square passes 1, so no sum overflows for any finite values), its
smallest and largest value (the float32 check of every normalized value, without a second
pass), and both labels' counts. Memory grows with the distinct values of the vocabulary
columns, not with the rows; `max_vocabulary` bounds what a vocabulary keeps (the most
frequent, ties by value), not the counts the pass holds.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from loops.input import arrow_features, feature_tables
from loops.input.feature_tables import FeatureSpec, FittedFeatures
from loops.input.sharded_logs import BlockTable, LogPart, ShardedLog


@dataclasses.dataclass
class Moments:
    """A numeric column's values in a few numbers: count, largest magnitude (`scale`), mean and
    sum of squared deviations of values / scale, smallest and largest value."""

    count: int = 0
    scale: float = 0.0
    mean: float = 0.0
    squares: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    @classmethod
    def of(cls, values: np.ndarray) -> Moments:
        if not len(values):
            return cls()
        scale = float(np.abs(values).max())
        unit = values / scale if scale else values
        mean = float(unit.mean())
        squares = float(np.square(unit - mean).sum())
        return cls(len(values), scale, mean, squares, float(values.min()), float(values.max()))

    def merged(self, other: Moments) -> Moments:
        if not other.count:
            return self
        if not self.count:
            return other
        scale = max(self.scale, other.scale)
        first, second = self._at(scale), other._at(scale)
        count = self.count + other.count
        delta = second[0] - first[0]
        mean = first[0] + delta * other.count / count
        squares = first[1] + second[1] + delta * delta * self.count * other.count / count
        return Moments(
            count, scale, mean, squares, min(self.low, other.low), max(self.high, other.high)
        )

    def _at(self, scale: float) -> tuple[float, float]:
        ratio = self.scale / scale if scale else 1.0
        return self.mean * ratio, self.squares * ratio * ratio

    def center_and_deviation(self) -> tuple[float, float]:
        """The mean and standard deviation of the values (a constant column's deviation 1)."""
        scale = self.scale or 1.0
        deviation = math.sqrt(self.squares / self.count) * scale if self.count else 0.0
        return self.mean * scale, deviation if deviation > 0 else 1.0


@dataclasses.dataclass
class FitPartials:
    """The statistics of some blocks of a log, by column (see the module docstring), and the
    label values seen (a spec with `positive`)."""

    counts: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    moments: dict[str, Moments] = dataclasses.field(default_factory=dict)
    labels: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    label_values: set[str] = dataclasses.field(default_factory=set)
    rows: int = 0

    def add(self, other: FitPartials) -> None:
        """Adds the statistics of later blocks to these (in place: a count table is not copied
        a block)."""
        for name, counter in other.counts.items():
            self.counts.setdefault(name, collections.Counter()).update(counter)
        for name, value in other.moments.items():
            self.moments[name] = self.moments[name].merged(value) if name in self.moments else value
        self.labels = [self.labels[0] + other.labels[0], self.labels[1] + other.labels[1]]
        self.label_values |= other.label_values
        self.rows += other.rows


def block_partials(spec: FeatureSpec, block: BlockTable) -> FitPartials:
    """The statistics of one block's rows, every field checked as `fit` checks it: vectorized
    (`arrow_features`), else row by row for a column that needs it.

    Raises:
        ValueError: as `feature_tables.fit` (naming the shard and the row), but for labels of
            one value: a block may hold one label alone.
    """
    arrow = block.arrow
    if any(name not in arrow.column_names for name in arrow_features.read_columns(spec)) or any(
        column.crosses() and column.name in arrow.column_names for column in spec.columns
    ):
        feature_tables.check_header(spec, block.table())
    found = arrow_features.labels(spec, arrow)
    if found is None:
        table = block.table()
        labels = feature_tables.labels_of(spec, table, part=True)
        seen = set(map(feature_tables.text_of, table.columns[spec.label]))
    else:
        labels, seen = found
    partials = FitPartials(rows=len(labels))
    positives = int(labels.sum())
    partials.labels = [len(labels) - positives, positives]
    partials.label_values = seen if spec.positive is not None else set()
    for column in spec.columns:
        if column.kind == "numeric":
            values = arrow_features.numbers(column, arrow[column.name])
            if values is None:
                table = block.table()
                fields = feature_tables.fields_of(column, table)
                values = feature_tables.numbers_of(column, fields, table)
            partials.moments[column.name] = Moments.of(values)
        elif not column.option("hash_buckets"):
            counts = arrow_features.value_counts(column, arrow)
            if counts is None:
                table = block.table()
                bags = feature_tables.bags_of(
                    column, feature_tables.fields_of(column, table), table
                )
                counts = collections.Counter(v for bag in bags for v in bag)
            partials.counts[column.name] = collections.Counter(counts)
    return partials


def merged(parts: Iterable[FitPartials]) -> FitPartials:
    """The partials of blocks, merged in the order given (give them in block order)."""
    total = FitPartials()
    for part in parts:
        total.add(part)
    return total


def fitted(spec: FeatureSpec, partials: FitPartials, source: str) -> FittedFeatures:
    """The vocabularies and scales of merged partials, as `feature_tables.fit` decides them
    (most frequent first, then by value; `min_count`; `max_vocabulary`).

    Raises:
        ValueError: labels of one value alone, or a value whose normalized value is past
            float32's range, naming `source`, the column and the fix.
    """
    others = sorted(partials.label_values - {spec.positive})
    if spec.positive is not None and (
        len(others) > 1 or spec.positive not in partials.label_values
    ):
        shown = ", ".join(map(repr, sorted(partials.label_values)[:6]))
        raise ValueError(
            f"Label column {spec.label!r} of {source} holds {shown}: with positive="
            f"{spec.positive!r} it must hold that value and one other (the negatives)."
        )
    if not (partials.labels[0] and partials.labels[1]):
        raise ValueError(
            f"{source}'s training rows ({partials.rows}) hold one label alone: there is "
            "nothing to learn (nor an AUC to measure); give rows of both labels."
        )
    vocabularies, scales = {}, {}
    for column in spec.columns:
        if column.kind == "numeric":
            moments = partials.moments[column.name]
            standard = column.option("normalize") == "standard"
            scales[column.name] = moments.center_and_deviation() if standard else (0.0, 1.0)
            _check_float32(column, moments, scales[column.name], source)
        elif not column.option("hash_buckets"):
            counts = partials.counts[column.name]
            vocabularies[column.name] = feature_tables.vocabulary_of(column, counts)
    return FittedFeatures(spec, vocabularies, scales)


def _check_float32(
    column: feature_tables.Column, moments: Moments, scale: tuple[float, float], source: str
) -> None:
    center, deviation = scale
    for value in (moments.low, moments.high):
        with np.errstate(over="ignore"):
            normalized = np.float32(value / deviation - center / deviation)
        if not np.isfinite(normalized):
            raise ValueError(
                f"{source}: numeric column {column.name!r} holds {value:.6g}, which normalized "
                f"is past the range of the float32 the model reads (3.4e+38); give the column "
                '"normalize": "log", or rescale its values.'
            )


@dataclasses.dataclass(frozen=True)
class Split:
    """Where each part of the log lies on [0, 1) of `row_fractions`: test, validation, train."""

    test_fraction: float
    validation_fraction: float = 0.0

    def bands(self) -> dict[str, tuple[float, float]]:
        test = self.test_fraction
        validation = test + (1.0 - test) * self.validation_fraction
        return {"test": (0.0, test), "validation": (test, validation), "train": (validation, 1.0)}


def fit_partials(
    spec: FeatureSpec,
    log: ShardedLog,
    band: tuple[float, float],
    *,
    part: tuple[int, int] = (0, 1),
) -> list[tuple[int, FitPartials]]:
    """(block, partials) of the rows of `band` in blocks b with b % part[1] == part[0]: one
    process's share of the statistics pass (`fit_log` merges the shares)."""
    index, count = part
    rows = LogPart(log, *band)
    found = []
    for block in range(index, len(log.blocks), count):
        table = rows.read(block)
        if table.num_rows:
            found.append((block, block_partials(spec, table)))
    return found


def fit_log(
    spec: FeatureSpec,
    log: ShardedLog,
    band: tuple[float, float],
    *,
    shares: Sequence[list[tuple[int, FitPartials]]] | None = None,
) -> FittedFeatures:
    """The vocabularies and scales of the rows of `band`, from `shares` (each process's
    `fit_partials`, in any order), or from one pass here; merged in block order, so any split of
    the blocks gives the same result."""
    shares = [fit_partials(spec, log, band)] if shares is None else shares
    ordered = sorted((entry for share in shares for entry in share), key=lambda e: e[0])
    blocks = [block for block, _ in ordered]
    if len(set(blocks)) != len(blocks):
        raise ValueError("Two shares of the statistics pass hold the same block; give each once.")
    total = merged(partials for _, partials in ordered)
    return fitted(spec, total, log.root)
