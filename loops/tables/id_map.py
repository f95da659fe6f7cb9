"""The map of a `loops.DynamicTable`: which raw ids hold a row, and the step's admissions and
evictions, decided by TensorFlow ops from the step's global ids and the map alone.

The map is a value (`MapState`, tensors), and a step's decisions a function of it and of
the step's distinct ids with their counts, in ascending id order (`decide`): no clock but
the map's own step count, no random draw, no order but the ids'. Every replica, worker and
run that sees the same stream of steps therefore holds the same map, bit for bit.

What the map holds, for a table of C rows and a waiting list of P ids:
- per row: the id it holds, whether it is in use, its score and the step it was last seen;
- an index of the resident ids in two sorted parts, each id with its row: the ids admitted
  since the last compaction (at most R = `recent_places(C)`) and the older ones (C places).
  A lookup is a binary search of each part (`tf.searchsorted`, O(log C) an id, no hash
  table), and an entry holds only while its row still holds its id (`row_id`, `row_used`):
  an evicted id's entry goes stale in place, so a step rewrites R places, not C. When the
  recent part would overflow, both parts are merged into the older one (O(C), about once
  in R / (admissions a step) steps);
- the waiting list (ids seen fewer than `admit_after` times): sorted ids, each with its
  count and the step it was last seen;
- the step count and the counters (`COUNTERS`).

A step (`decide`), at step t = the count + 1, over the step's distinct ids:
1. a resident id's score decays and gains its count: score * decay ** (t - seen) + count,
   and it is seen at t;
2. with a time-to-live, a row not seen for more than `ttl` steps is freed (expired), and so
   is a waiting id;
3. a waiting or new id whose count (kept while it waits) reaches `admit_after` is ready;
4. ready ids take free rows, the lowest free row first; if they are more than the free
   rows, the rows not seen this step are evicted, lowest decayed score first (ties: the
   least recently seen, then the smallest id); ready ids that still find no row are
   refused, the highest count first admitted (ties: the smallest id), and wait on;
5. the waiting list keeps at most P ids, the highest counts (ties: the most recently seen,
   then the smallest id); the ids it drops are counted.
An admitted id starts at score = its count, seen at t. Its row's values and slots are the
table's to set (`loops.tables.dynamic_tables`).

The reserved id: 2**63 - 1 (`EMPTY`) marks the sorted arrays' unused end.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from loops.vocabulary.whole_numbers import is_whole

EMPTY = 2**63 - 1
# The counters a map keeps, in this order (`MapState.counters`).
COUNTERS = (
    "admissions",  # ids given a row
    "evictions",  # rows freed for a ready id, the table being full
    "expirations",  # rows and waiting ids freed by the time-to-live
    "refusals",  # ready ids that found no row (every row seen this step): they wait on
    "waiting_dropped",  # ids dropped from a full waiting list
    "unadmitted_lookups",  # training lookups of an id without a row, after the step's admissions
)


@dataclasses.dataclass(frozen=True)
class AdmissionPolicy:
    """When an id gets a row and when a row is freed (the module docstring states the rules).

    Attributes:
        admit_after: an id is admitted once seen this many times (1: at first sight).
        decay: each step multiplies a row's score (its count of lookups) by this, in (0, 1];
            1 is least-frequently-used over all time, less forgets old counts.
        ttl: a row (or a waiting id) not seen for more than this many steps is freed; None:
            never by age.
        waiting: the most ids that wait for admission at once (None: the table's capacity);
            0 with admit_after > 1 admits only an id seen `admit_after` times in one step.
    """

    admit_after: int = 1
    decay: float = 1.0
    ttl: int | None = None
    waiting: int | None = None

    def __post_init__(self) -> None:
        for name, least in (("admit_after", 1), ("ttl", 1), ("waiting", 0)):
            value = getattr(self, name)
            if not (value is None and name != "admit_after") and not is_whole(value, least):
                raise ValueError(
                    f"DynamicTable({name}={value!r}) needs a whole number >= {least}"
                    f"{'' if name == 'admit_after' else ', or None'}."
                )
        decay = self.decay
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 < decay <= 1:
            raise ValueError(
                f"DynamicTable(decay={decay!r}) needs a number in (0, 1]: 1 keeps every "
                "count, 0.99 halves a count in about 69 steps."
            )


@dataclasses.dataclass(frozen=True)
class MapState:
    """A map's state as tensors (the module docstring says what each holds)."""

    row_id: tf.Tensor  # int64 [C]
    row_used: tf.Tensor  # bool [C]
    row_score: tf.Tensor  # float64 [C]
    row_seen: tf.Tensor  # int64 [C]
    sorted_ids: tf.Tensor  # int64 [C], the older index part, EMPTY past the last
    sorted_rows: tf.Tensor  # int64 [C], -1 past the last
    recent_ids: tf.Tensor  # int64 [R], the ids admitted since the last compaction, sorted
    recent_rows: tf.Tensor  # int64 [R], -1 past the last
    waiting_ids: tf.Tensor  # int64 [P], sorted, EMPTY past the last
    waiting_counts: tf.Tensor  # int64 [P]
    waiting_seen: tf.Tensor  # int64 [P]
    step: tf.Tensor  # int64 []
    counters: tf.Tensor  # int64 [len(COUNTERS)]

    def values(self) -> list[tf.Tensor]:
        """The tensors, in `FIELDS` order."""
        return [getattr(self, name) for name in FIELDS]


FIELDS = tuple(field.name for field in dataclasses.fields(MapState))


def recent_places(capacity: int) -> int:
    """R, the places of the index's recent part for a map of `capacity` rows: a 16th of
    them (at least 8), so a step rewrites about C / 16 places and a compaction comes once in
    about C / 16 admissions."""
    return min(capacity, max(8, capacity // 16))


def empty_state(capacity: int, waiting: int) -> MapState:
    """The state of a map of `capacity` rows and `waiting` places, no id in it."""

    def filled(size: int, value, dtype) -> tf.Tensor:
        return tf.fill([size], tf.constant(value, dtype))

    return MapState(
        row_id=filled(capacity, EMPTY, tf.int64),
        row_used=filled(capacity, False, tf.bool),
        row_score=filled(capacity, 0.0, tf.float64),
        row_seen=filled(capacity, 0, tf.int64),
        sorted_ids=filled(capacity, EMPTY, tf.int64),
        sorted_rows=filled(capacity, -1, tf.int64),
        recent_ids=filled(recent_places(capacity), EMPTY, tf.int64),
        recent_rows=filled(recent_places(capacity), -1, tf.int64),
        waiting_ids=filled(waiting, EMPTY, tf.int64),
        waiting_counts=filled(waiting, 0, tf.int64),
        waiting_seen=filled(waiting, 0, tf.int64),
        step=tf.constant(0, tf.int64),
        counters=filled(len(COUNTERS), 0, tf.int64),
    )


def _found(sorted_ids: tf.Tensor, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(whether each of `ids` is among `sorted_ids`, its position there where it is)."""
    size = tf.shape(sorted_ids, out_type=tf.int64)[0]
    if sorted_ids.shape[0] == 0:
        return tf.zeros(tf.shape(ids), tf.bool), tf.zeros(tf.shape(ids), tf.int64)
    position = tf.minimum(tf.searchsorted(sorted_ids, ids, out_type=tf.int64), size - 1)
    return tf.gather(sorted_ids, position) == ids, position


def _among(sorted_ids: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Whether each of `ids` is among `sorted_ids` (ascending, any length, none at all too)."""
    ended = tf.concat([sorted_ids, tf.constant([EMPTY], tf.int64)], 0)
    return tf.gather(ended, tf.searchsorted(ended, ids, out_type=tf.int64)) == ids


def lookup(state: MapState, ids: tf.Tensor, absent_row: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(the row of each of `ids` (int64, any shape), `absent_row` for an id without one;
    whether each has one)."""
    flat = tf.reshape(ids, [-1])
    older, in_older = _held(state, state.sorted_ids, state.sorted_rows, flat)
    recent, in_recent = _held(state, state.recent_ids, state.recent_rows, flat)
    # An id re-admitted into the row it had held is in both parts, with the same row.
    rows = tf.where(in_recent, recent, tf.where(in_older, older, absent_row))
    known = in_older | in_recent
    return tf.reshape(rows, tf.shape(ids)), tf.reshape(known, tf.shape(ids))


def _held(state: MapState, sorted_ids, sorted_rows, ids) -> tuple[tf.Tensor, tf.Tensor]:
    """(the row that an index part gives each of `ids`, whether that row holds it now)."""
    found, position = _found(sorted_ids, ids)
    rows = tf.maximum(tf.gather(sorted_rows, position), 0)
    holds = tf.gather(state.row_used, rows) & (tf.gather(state.row_id, rows) == ids)
    return rows, found & holds


def decayed(state: MapState, step: tf.Tensor, decay: float, rows=None) -> tf.Tensor:
    """The scores of `rows` (every row: None) decayed to `step`."""
    score = state.row_score if rows is None else tf.gather(state.row_score, rows)
    seen = state.row_seen if rows is None else tf.gather(state.row_seen, rows)
    if decay == 1.0:
        return score
    age = step - seen
    base = tf.constant(decay, tf.float64)
    oldest = tf.reduce_max(tf.concat([age, [0]], 0))

    def by_ages() -> tf.Tensor:
        # The factor of each age up to the oldest, gathered: the same pow of the same
        # arguments, for far fewer calls where the rows' ages repeat (every row of a step).
        factors = tf.pow(base, tf.cast(tf.range(oldest + 1), tf.float64))
        return tf.gather(factors, age)

    factor = tf.cond(
        oldest < tf.size(age, out_type=tf.int64),
        by_ages,
        lambda: tf.pow(base, tf.cast(age, tf.float64)),
    )
    return score * factor


def _scatter(values: tf.Tensor, rows: tf.Tensor, updates) -> tf.Tensor:
    updates = tf.broadcast_to(tf.cast(updates, values.dtype), tf.shape(rows))
    return tf.tensor_scatter_nd_update(values, rows[:, None], updates)


class Decision(NamedTuple):
    """A step's outcome: the new state, and the ids admitted with the row each took."""

    state: MapState
    admitted_ids: tf.Tensor  # int64 [k], ascending
    admitted_rows: tf.Tensor  # int64 [k]


def decide(state: MapState, ids: tf.Tensor, counts: tf.Tensor, policy: AdmissionPolicy):
    """The step's `Decision` over its distinct `ids` (int64 [n], ascending) seen `counts`
    (int64 [n]) times in the step (the module docstring states the rules)."""
    step = state.step + 1
    counters = dict.fromkeys(COUNTERS, tf.constant(0, tf.int64))
    rows_now, hit = lookup(state, ids, 0)
    hit_rows = tf.boolean_mask(rows_now, hit)
    score = decayed(state, step, policy.decay, hit_rows)
    score += tf.cast(tf.boolean_mask(counts, hit), tf.float64)
    state = dataclasses.replace(
        state,
        row_score=_scatter(state.row_score, hit_rows, score),
        row_seen=_scatter(state.row_seen, hit_rows, step),
    )
    if policy.ttl is not None:
        expired = state.row_used & (step - state.row_seen > policy.ttl)
        counters["expirations"] += tf.reduce_sum(tf.cast(expired, tf.int64))
        state = dataclasses.replace(state, row_used=state.row_used & ~expired)
    new_ids, new_counts = tf.boolean_mask(ids, ~hit), tf.boolean_mask(counts, ~hit)
    waiting, totals = _waited(state, new_ids, new_counts, step, policy, counters)
    ready = totals >= policy.admit_after
    state, admitted, rows, refused = _admit(
        state,
        tf.boolean_mask(new_ids, ready),
        tf.boolean_mask(totals, ready),
        step,
        policy,
        counters,
    )
    unadmitted = tf.reduce_sum(new_counts) - tf.reduce_sum(
        tf.gather(new_counts, tf.searchsorted(new_ids, admitted, out_type=tf.int64))
    )
    counters["unadmitted_lookups"] += unadmitted
    still = tf.boolean_mask(new_ids, ~ready), tf.boolean_mask(totals, ~ready)
    state = _rewaited(state, waiting, still, refused, step, policy, counters)
    state = _indexed(state, admitted, rows)
    total = state.counters + tf.stack([counters[name] for name in COUNTERS])
    state = dataclasses.replace(state, step=step, counters=total)
    return Decision(state, admitted, rows)


def _waited(state: MapState, ids, counts, step, policy: AdmissionPolicy, counters):
    """(the waiting entries kept from before this step: (ids, counts, seen), unexpired and
    not among `ids`; each of `ids`' count with what it had waited)."""
    if state.waiting_ids.shape[0] == 0:
        return (state.waiting_ids, state.waiting_counts, state.waiting_seen), counts
    valid = state.waiting_ids != EMPTY
    if policy.ttl is not None:
        alive = step - state.waiting_seen <= policy.ttl
        counters["expirations"] += tf.reduce_sum(tf.cast(valid & ~alive, tf.int64))
        valid &= alive
    waited, position = _found(state.waiting_ids, ids)
    waited &= tf.gather(valid, position)
    totals = counts + tf.where(waited, tf.gather(state.waiting_counts, position), 0)
    # The entries these ids renew leave the old list: they come back with their new counts.
    renewed = tf.scatter_nd(
        tf.boolean_mask(position, waited)[:, None],
        tf.ones_like(tf.boolean_mask(position, waited), tf.bool),
        tf.shape(state.waiting_ids, out_type=tf.int64),
    )
    kept = valid & ~renewed
    entries = tuple(
        tf.boolean_mask(column, kept)
        for column in (state.waiting_ids, state.waiting_counts, state.waiting_seen)
    )
    return entries, totals


def _admit(state: MapState, ready, totals, step, policy: AdmissionPolicy, counters):
    """Rows for the `ready` ids (ascending) with their `totals`: (state, admitted ids
    ascending, their rows, (refused ids, their totals))."""
    capacity = tf.shape(state.row_used, out_type=tf.int64)[0]
    free = capacity - tf.reduce_sum(tf.cast(state.row_used, tf.int64))
    wanted = tf.shape(ready, out_type=tf.int64)[0]
    evictable = state.row_used & (state.row_seen < step)
    evicted = tf.minimum(tf.maximum(wanted - free, 0), tf.reduce_sum(tf.cast(evictable, tf.int64)))
    victims = _victims(state, step, policy, evictable, evicted)
    used = _scatter(state.row_used, victims, False)
    counters["evictions"] += evicted
    taken = tf.minimum(wanted, free + evicted)
    # The highest count first, then the smallest id (the ids are ascending: a stable sort).
    priority = tf.argsort(-totals, stable=True)
    chosen = tf.sort(tf.gather(ready, priority[:taken]))
    chosen_totals = tf.gather(totals, tf.searchsorted(ready, chosen, out_type=tf.int64))
    rows = tf.where(~used)[:taken, 0]
    refused = (tf.gather(ready, priority[taken:]), tf.gather(totals, priority[taken:]))
    counters["admissions"] += taken
    counters["refusals"] += wanted - taken
    state = dataclasses.replace(
        state,
        row_id=_scatter(state.row_id, rows, chosen),
        row_used=_scatter(used, rows, True),
        row_score=_scatter(state.row_score, rows, tf.cast(chosen_totals, tf.float64)),
        row_seen=_scatter(state.row_seen, rows, step),
    )
    return state, chosen, rows, refused


def _victims(state: MapState, step, policy: AdmissionPolicy, evictable, count) -> tf.Tensor:
    """The `count` `evictable` rows that go first: the lowest decayed score, then the least
    recently seen, then the smallest id. The count-th lowest score is found by `_kth_highest`;
    only the rows tied at it are ranked further (by last step, then id), not every row."""

    def chosen() -> tf.Tensor:
        score = tf.where(evictable, decayed(state, step, policy.decay), float("inf"))
        threshold = -_kth_highest(-score, count)
        below = tf.where(score < threshold)[:, 0]
        tied = tf.where(evictable & (score == threshold))[:, 0]
        rest = count - tf.shape(below, out_type=tf.int64)[0]
        # Of the tied rows, the least recently seen, then the smallest ids (the highest by the
        # ids' bitwise complement, which no id overflows).
        keys = [
            lambda at: -tf.gather(state.row_seen, tf.gather(tied, at)),
            lambda at: tf.bitwise.invert(tf.gather(state.row_id, tf.gather(tied, at))),
        ]
        return tf.concat([below, tf.gather(tied, _top(keys, tf.size(tied, tf.int64), rest))], 0)

    return tf.cond(count > 0, chosen, lambda: tf.zeros([0], tf.int64))


# `_kth_highest` bounds the k-th value by every SAMPLE_STRIDE-th value first: a top-k over C
# values costs several passes, a count of the values above a bound one.
SAMPLE_STRIDE = 16


def _kth_highest(values: tf.Tensor, k) -> tf.Tensor:
    """The `k`-th highest of `values` (1 <= k <= their number), exactly. A bound b from a
    strided sample (about 2 k values above it) settles it where the values above b are at
    least k (the k-th highest of those alone) or fewer than k with b's ties reaching k (b
    itself); otherwise a top-k over every value."""
    k = tf.cast(k, tf.int64)
    size = tf.size(values, tf.int64)

    def whole() -> tf.Tensor:
        return tf.math.top_k(values, k=tf.cast(k, tf.int32)).values[-1]

    def bounded() -> tf.Tensor:
        sample = values[::SAMPLE_STRIDE]
        rank = tf.minimum(tf.size(sample, tf.int64), 2 * (k // SAMPLE_STRIDE) + 16)
        bound = tf.math.top_k(sample, k=tf.cast(rank, tf.int32)).values[-1]
        above = values > bound
        above_count = tf.cast(tf.reduce_sum(tf.cast(above, tf.int32)), tf.int64)

        def among_above() -> tf.Tensor:
            return tf.math.top_k(tf.boolean_mask(values, above), k=tf.cast(k, tf.int32)).values[-1]

        def at_bound() -> tf.Tensor:
            reached = above_count + tf.reduce_sum(tf.cast(values == bound, tf.int64)) >= k
            return tf.cond(reached, lambda: bound, whole)

        return tf.cond(above_count >= k, among_above, at_bound)

    return tf.cond(size > 16 * SAMPLE_STRIDE, bounded, whole)


def _rewaited(state: MapState, kept, still, refused, step, policy, counters) -> MapState:
    """The waiting list after the step: the `kept` entries (ascending ids), the ids `still`
    waiting and the `refused` ones (both seen at `step`), the `policy.waiting` highest counts
    of them (then the most recently seen, then the smallest id), by a partial top-k."""
    places = int(state.waiting_ids.shape[0])
    fresh_ids = tf.concat([still[0], refused[0]], 0)
    by_id = tf.argsort(fresh_ids)  # the step's new entries alone: few
    fresh = (
        tf.gather(fresh_ids, by_id),
        tf.gather(tf.concat([still[1], refused[1]], 0), by_id),
        tf.fill(tf.shape(fresh_ids), step),
    )
    columns = [tf.concat([old, new], 0) for old, new in zip(kept, fresh, strict=True)]
    size = tf.shape(columns[0], out_type=tf.int64)[0]
    counters["waiting_dropped"] += tf.maximum(size - places, 0)
    # The few to drop, not the many to keep: the lowest counts, the least recently seen, the
    # largest ids.
    keys = [
        lambda at: -tf.gather(columns[1], at),
        lambda at: -tf.gather(columns[2], at),
        lambda at: tf.gather(columns[0], at),
    ]
    dropped = _top(keys, size, tf.maximum(size - places, 0))
    chosen = ~tf.scatter_nd(dropped[:, None], tf.ones_like(dropped, tf.bool), [size])
    old = tf.shape(kept[0], out_type=tf.int64)[0]
    # Both parts stay ascending: merged, they are the new list in id order.
    parts = [(chosen[:old], kept), (chosen[old:], fresh)]
    held = [[tf.boolean_mask(c, mask) for c in part] for mask, part in parts]
    ids, counts, seen = _merge(held[0], held[1], [EMPTY, 0, 0], places)
    return dataclasses.replace(state, waiting_ids=ids, waiting_counts=counts, waiting_seen=seen)


def _top(keys: list, size, count) -> tf.Tensor:
    """The indices (of `size` entries) of the `count` entries highest by `keys`, each a
    function from entry indices to their values (the first key, ties by the next, ...; the
    last unique): the count-th value at each key, over the entries tied at the one before."""
    candidates = tf.range(size)
    chosen = []
    for index, key in enumerate(keys):
        values = key(candidates)
        k = tf.cast(count, tf.int32)
        if index == len(keys) - 1:
            chosen.append(tf.gather(candidates, tf.math.top_k(values, k=k).indices))
            break
        # The count-th highest value; with none left to choose, one above every value.
        kth = tf.cond(
            k > 0,
            lambda values=values, k=k: _kth_highest(values, k),
            lambda values=values: tf.reduce_max(tf.concat([values, [0]], 0)) + 1,
        )
        above = tf.boolean_mask(candidates, values > kth)
        chosen.append(above)
        count -= tf.shape(above, out_type=tf.int64)[0]
        candidates = tf.boolean_mask(candidates, values == kth)
    return tf.concat(chosen, 0)


def _merge_positions(first: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    """Where each of two ascending arrays of distinct ids goes in their merge: `first`'s
    places, then `second`'s (each id's index plus the other array's ids below it)."""

    def places(ids: tf.Tensor, others: tf.Tensor) -> tf.Tensor:
        below = tf.searchsorted(others, ids, out_type=tf.int64)
        return tf.range(tf.shape(ids, out_type=tf.int64)[0]) + below

    return tf.concat([places(first, second), places(second, first)], 0)


def _holding(state: MapState, sorted_ids, sorted_rows, but) -> tuple[tf.Tensor, tf.Tensor]:
    """An index part's entries whose row still holds their id, less the ids among `but`
    (ascending): (ids, rows), ascending."""
    rows = tf.maximum(sorted_rows, 0)
    holds = (sorted_rows >= 0) & tf.gather(state.row_used, rows)
    holds &= tf.gather(state.row_id, rows) == sorted_ids
    holds &= ~_among(but, sorted_ids)
    return tf.boolean_mask(sorted_ids, holds), tf.boolean_mask(sorted_rows, holds)


def _merge(first: list, second: list, fills: list, places=None) -> list[tf.Tensor]:
    """Two lists of columns, each led by ascending distinct ids, merged in id order (no
    sort: each entry's place, then one gather a column), padded with `fills` to `places`
    (None: as many as they are)."""
    order = tf.math.invert_permutation(_merge_positions(first[0], second[0]))
    merged = [tf.gather(tf.concat([a, b], 0), order) for a, b in zip(first, second, strict=True)]
    if places is None:
        return merged
    fill = places - tf.shape(order, out_type=tf.int64)[0]
    return [
        tf.pad(column, [[0, fill]], constant_values=value)
        for column, value in zip(merged, fills, strict=True)
    ]


def _merged(first: tuple, second: tuple, places=None) -> tuple[tf.Tensor, tf.Tensor]:
    """Two ascending (ids, rows) of distinct ids merged, ascending, in `places` places
    (EMPTY and -1 past the last; None: as many as they are)."""
    ids, rows = _merge(list(first), list(second), [EMPTY, -1], places)
    return ids, rows


def _indexed(state: MapState, new_ids: tf.Tensor, new_rows: tf.Tensor) -> MapState:
    """The index after the step: the `new_ids` (ascending) in `new_rows` joined to the recent
    part, less its stale entries; where they would overflow it, both parts merged into the
    older one (a compaction) and the recent part emptied."""
    capacity, places = int(state.sorted_ids.shape[0]), int(state.recent_ids.shape[0])
    # An id re-admitted into a row it held before has a stale entry that holds again.
    recent = _merged(
        _holding(state, state.recent_ids, state.recent_rows, new_ids), (new_ids, new_rows)
    )

    def compacted():
        older = _holding(state, state.sorted_ids, state.sorted_rows, recent[0])
        empty = tf.fill([places], tf.constant(EMPTY, tf.int64))
        return (
            *_merged(older, recent, capacity),
            empty,
            tf.fill([places], tf.constant(-1, tf.int64)),
        )

    def kept():
        fill = places - tf.shape(recent[0])[0]
        padded = [
            tf.pad(part, [[0, fill]], constant_values=value)
            for part, value in zip(recent, (EMPTY, -1), strict=True)
        ]
        return state.sorted_ids, state.sorted_rows, *padded

    parts = tf.cond(tf.shape(recent[0])[0] > places, compacted, kept)
    names = ("sorted_ids", "sorted_rows", "recent_ids", "recent_rows")
    return dataclasses.replace(state, **dict(zip(names, parts, strict=True)))
