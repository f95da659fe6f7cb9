"""A feature spec's statistics (vocabularies, numeric scales and buckets) fitted by one pass
over a sharded log's blocks in bounded memory: each block gives its partial statistics
(`block_partials`); counts add up as they come, and the numeric figures merge block by block
within chunks of `CHUNK_BLOCKS` blocks and chunk by chunk in order (`fit_partials`,
`fit_log`), so any split of the chunks over processes, and the shards listed in any order,
give the same `FittedFeatures` bit for bit.

What a block's partials hold: each vocabulary column's value counts, each numeric column's row
count, largest magnitude, mean and sum of squared deviations of its values over that magnitude
(Chan's pairwise update: no square passes 1, so no sum overflows for any finite values), its
smallest and largest value (the float32 check of every normalized value, without a second
pass), a bucketed column's sketch (`Sketch`), and both labels' counts. Memory grows with the
distinct values of the vocabulary columns, not with the rows; `max_vocabulary` bounds what a
vocabulary keeps (the most frequent, ties by value), not the counts the pass holds.
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


# The weighted points a numeric column's quantile sketch keeps from a block, and at most
# (compressed to this many when a merge passes 4 times as many).
SKETCH_POINTS = 2048


@dataclasses.dataclass
class Sketch:
    """A numeric column's values as weighted points for its quantile buckets: a block's
    `SKETCH_POINTS` order statistics evenly spaced in rank (all of them in a smaller block),
    each weighing the rows it stands for. Merged in block order and compressed the same way,
    it gives the same boundaries from any split of the blocks; each boundary's rank is within
    about rows / SKETCH_POINTS of the exact quantile's."""

    values: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    weights: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    @classmethod
    def of(cls, values: np.ndarray) -> Sketch:
        ordered = np.sort(values)
        return cls(ordered, np.ones(len(ordered))).compressed(SKETCH_POINTS)

    def compressed(self, points: int) -> Sketch:
        if len(self.values) <= points:
            return self
        cumulative = np.cumsum(self.weights)
        targets = cumulative[-1] * (np.arange(points) + 0.5) / points
        index = np.minimum(np.searchsorted(cumulative, targets), len(self.values) - 1)
        return Sketch(self.values[index], np.full(points, cumulative[-1] / points))

    def merged(self, other: Sketch) -> Sketch:
        values = np.concatenate([self.values, other.values])
        weights = np.concatenate([self.weights, other.weights])
        order = np.argsort(values, kind="stable")
        merged = Sketch(values[order], weights[order])
        return merged.compressed(SKETCH_POINTS) if len(values) > 4 * SKETCH_POINTS else merged


@dataclasses.dataclass
class FitPartials:
    """The statistics of some blocks of a log, by column (see the module docstring), and the
    label values seen (a spec with `positive`)."""

    counts: dict[str, collections.Counter] = dataclasses.field(default_factory=dict)
    moments: dict[str, Moments] = dataclasses.field(default_factory=dict)
    sketches: dict[str, Sketch] = dataclasses.field(default_factory=dict)
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
        for name, sketch in other.sketches.items():
            self.sketches[name] = (
                self.sketches[name].merged(sketch) if name in self.sketches else sketch
            )
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
            if column.option("buckets"):
                partials.sketches[column.name] = Sketch.of(values)
        elif not column.hash_buckets():
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
    vocabularies, scales, boundaries = {}, {}, {}
    for column in spec.columns:
        if column.kind == "numeric" and column.option("buckets"):
            sketch = partials.sketches[column.name]
            boundaries[column.name] = feature_tables.quantile_boundaries(
                sketch.values, sketch.weights, column.option("buckets")
            )
        if column.kind == "numeric":
            moments = partials.moments[column.name]
            standard = column.option("normalize") == "standard"
            scales[column.name] = moments.center_and_deviation() if standard else (0.0, 1.0)
            _check_float32(column, moments, scales[column.name], source)
        elif not column.hash_buckets():
            counts = partials.counts[column.name]
            vocabularies[column.name] = feature_tables.vocabulary_of(column, counts)
    return FittedFeatures(spec, vocabularies, scales, boundaries)


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


# Blocks whose numeric statistics one process merges in order before handing them on: the
# unit a pass is split in (a process takes whole chunks), so the float figures are merged in
# one order whatever the split, and a process holds a few numbers a chunk, not a block.
CHUNK_BLOCKS = 64


@dataclasses.dataclass
class FitShare:
    """One process's share of the statistics pass: its blocks' value counts and labels added
    up (integers: in any order), and each of its chunks' numeric moments and sketches (merged
    in chunk order by `fit_log`)."""

    totals: FitPartials
    chunks: dict[int, FitPartials]


def fit_partials(
    spec: FeatureSpec,
    log: ShardedLog,
    band: tuple[float, float],
    *,
    part: tuple[int, int] = (0, 1),
) -> FitShare:
    """The statistics of the rows of `band` in the chunks c (`CHUNK_BLOCKS` blocks each) with
    c % part[1] == part[0]: one process's share of the pass (`fit_log` merges the shares). It
    holds the distinct values' counts and a few numbers a chunk, whatever the rows."""
    index, count = part
    rows = LogPart(log, *band)
    totals, chunks = FitPartials(), {}
    for chunk in range(index, -(-len(log.blocks) // CHUNK_BLOCKS), count):
        numbers = FitPartials()
        for block in range(chunk * CHUNK_BLOCKS, min(len(log.blocks), (chunk + 1) * CHUNK_BLOCKS)):
            table = rows.read(block)
            if not table.num_rows:
                continue
            found = block_partials(spec, table)
            numbers.add(FitPartials(moments=found.moments, sketches=found.sketches))
            found.moments, found.sketches = {}, {}
            totals.add(found)
        chunks[chunk] = numbers
    return FitShare(totals, chunks)


def fit_log(
    spec: FeatureSpec,
    log: ShardedLog,
    band: tuple[float, float],
    *,
    shares: Sequence[FitShare] | None = None,
) -> FittedFeatures:
    """The vocabularies, scales and buckets of the rows of `band`, from `shares` (each
    process's `fit_partials`, in any order), or from one pass here: counts added, numeric
    figures merged in chunk order, so any split of the chunks gives the same result.

    Raises:
        ValueError: a chunk in two shares, or one in none; as `fitted`.
    """
    shares = [fit_partials(spec, log, band)] if shares is None else shares
    chunks = sorted(chunk for share in shares for chunk in share.chunks)
    if chunks != list(range(-(-len(log.blocks) // CHUNK_BLOCKS))):
        raise ValueError(
            f"The shares of the statistics pass hold chunks {chunks[:8]}...; give each chunk "
            "of the log once (fit_partials with part=(i, n) for i in 0..n-1)."
        )
    total = FitPartials()
    for share in shares:
        total.add(share.totals)
    by_chunk = {chunk: part for share in shares for chunk, part in share.chunks.items()}
    numbers = merged(by_chunk[chunk] for chunk in chunks)
    total.moments, total.sketches = numbers.moments, numbers.sketches
    return fitted(spec, total, log.root)
