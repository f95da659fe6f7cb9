"""`loops.DynamicTable` against static tables of the same rows on a drifting power-law click
stream: the quality of each (AUC) and the speed of the dynamic table's step, in one run.

    python -m benchmarks.dynamic_tables            # 10M events, capacity 2**17 (10-14 min)
    python -m benchmarks.dynamic_tables --quick    # 300K events, capacity 2**12 (about 1 min)

The stream (numpy, in memory, a function of --seed): --ids ids (raw int64 values), each with
a Zipf popularity (exponent 1, over a random ranking), a birth time uniform over [-1, 1] of
the stream's length and a lifetime log-uniform in [0.05, 2]: an id's weight at time t is its
popularity times exp(-(t - birth) / lifetime) once born, so the ranking moves and new ids
arrive throughout (--events events drawn in 50 segments of constant weights). Each id has a
hidden propensity ~ N(0, 1); an event's click ~ Bernoulli(sigmoid(-1.5 + propensity)).

The model: logit = dot(table(id), w) + b, the table's rows (--dim floats) by its own
Adagrad (--table_rate), w and b by Keras' Adam (--dense_rate), on the summed log loss of
each batch of --batch events, trained once over the first 90% of the stream in time order.
Quality: progressive validation AUC (each training batch scored by the step that then
trains on it, its forward pass before the update) and the test AUC of the last 10%,
scored with no update (a dynamic table admits nothing there: an id it has not admitted
reads zeros). AUC is exact (sort-based, ties averaged). The tables, all of --capacity C
rows (+1: the dynamic table's row of zeros, the vocabulary's out-of-vocabulary row):
- dynamic: `loops.DynamicTable(C)` for each --dynamic policy `admit_after:decay`;
- hashed: `loops.EmbeddingTable(C, ids="hashes")` (fingerprint64 buckets: collisions), and
  for each other multiple m of --hashed_sizes one of m x C rows: a dynamic table's map
  takes 42 bytes a row and 24 a waiting place beside a row's 8 x --dim bytes (its floats
  and Adagrad's accumulator): at --dim 8 a dynamic table holds the bytes of 1.66 x C
  hashed rows (admit_after 1), of 2.03 x C with a waiting list of C places (admit_after 2);
- vocabulary: the C most frequent ids of the stream's first 10% each a row, every other id
  the one out-of-vocabulary row (`EmbeddingTable(C + 1)`, ids mapped by numpy beforehand).
With the dynamic tables' counters and a digest of each map after training (`map_digest`:
a change meant only to be faster must leave every digest as it was), the hashed table's
collisions and the vocabulary's coverage. `equal_to_static`: a DynamicTable with room for
every id of a small stream (nothing evicted) against a full-vocabulary EmbeddingTable
started from the same rows (`dynamic_tables.initial_rows`), trained alike: the largest
difference of their weights.

Speed: after the test, each table's training step (the same tf.function as above: lookup,
admission for a dynamic table, the row and dense updates) on the same batches of the last
slice, warmed up, --steps steps a table a round in --rounds rounds taking turns; medians of
ms a step (wall and CPU). `dynamic_over_static`: a dynamic table's step over the hashed table's
(both take raw ids; the goal <= 1.5) and over the vocabulary table's (rows given). The
breakdown of each dynamic step, timed alike on its table: the step without admission
(`training=False`: lookup and update), the step's distinct ids alone, `id_map.decide` alone
(the distinct ids included, nothing written).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import report

BIAS, ZIPF, LIFETIMES, SEGMENTS = -1.5, 1.0, (0.05, 2.0), 50
TEST, VOCABULARY_PART = 0.1, 0.1
QUICK = dict(events=300_000, ids=90_000, capacity=2**12, batch=1024, steps=10)
FULL = dict(events=10_000_000, ids=3_000_000, capacity=2**17, batch=4096, steps=10)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small stream: " + str(QUICK))
    parser.add_argument("--events", type=int, help=f"events of the stream ({FULL['events']})")
    parser.add_argument("--ids", type=int, help=f"ids that may occur ({FULL['ids']})")
    parser.add_argument("--capacity", type=int, help=f"rows of every table ({FULL['capacity']})")
    parser.add_argument("--batch", type=int, help=f"events a step ({FULL['batch']})")
    parser.add_argument("--steps", type=int, help=f"timed steps a round ({FULL['steps']})")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--dynamic", default="1:1.0,1:0.999,2:0.999", help="admit_after:decay")
    parser.add_argument("--hashed_sizes", default="1,2", help="hashed tables' rows / capacity")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--table_rate", type=float, default=0.3, help="the tables' Adagrad")
    parser.add_argument("--dense_rate", type=float, default=0.01, help="Adam's, for w and b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "dynamic_tables.json")
    )
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.dynamic = [
        (int(admit), float(decay))
        for admit, decay in (part.split(":") for part in args.dynamic.split(",") if part)
    ]
    args.hashed_sizes = sorted({1, *(int(m) for m in args.hashed_sizes.split(",") if m)})
    if args.capacity < 2 or args.batch < 2 or args.events < 20 * args.batch:
        parser.error("--capacity and --batch must be >= 2, --events >= 20 batches")
    return args


class Stream:
    """The generated events in time order: raw ids, the index of each id, clicks, true logits."""

    def __init__(self, events: int, ids: int, seed: int):
        rng = np.random.default_rng(seed)
        raw = np.unique(rng.integers(-(2**62), 2**62, ids + ids // 100))[:ids]
        raw = rng.permutation(raw)  # distinct raw values, in no order
        popularity = (rng.permutation(ids) + 1.0) ** -ZIPF
        lifetime = np.exp(rng.uniform(*np.log(LIFETIMES), ids))
        birth = rng.uniform(-1.0, 1.0, ids)
        propensity = rng.normal(0.0, 1.0, ids)
        index = np.empty(events, np.int64)
        for segment in range(SEGMENTS):
            first, last = segment * events // SEGMENTS, (segment + 1) * events // SEGMENTS
            age = (first + last) / 2 / events - birth
            weight = np.where(age >= 0, popularity * np.exp(-np.maximum(age, 0) / lifetime), 0)
            cumulative = np.cumsum(weight)
            draws = rng.random(last - first) * cumulative[-1]
            index[first:last] = np.searchsorted(cumulative, draws, side="right")
        self.index, self.ids = index, raw[index]
        self.logits = BIAS + propensity[index]
        self.labels = (rng.random(events) < 1 / (1 + np.exp(-self.logits))).astype(np.float32)


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The exact ROC AUC (Mann-Whitney: ranks of the positives, tied scores their mean rank)."""
    order = np.argsort(scores, kind="stable")
    ordered = scores[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(ordered)]
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)  # 1-based mean ranks
    positive = labels > 0.5
    count, negatives = int(positive.sum()), int((~positive).sum())
    return float((ranks[positive].sum() - count * (count + 1) / 2) / (count * negatives))


def vocabulary_rows(stream: Stream, capacity: int, first: int) -> tuple[np.ndarray, dict]:
    """Each event's row in a vocabulary of the `capacity` most frequent ids of the first
    `first` events (ties: the smaller id), the rest row `capacity`; its coverage."""
    values, counts = np.unique(stream.ids[:first], return_counts=True)
    kept = np.sort(values[np.lexsort((values, -counts))[:capacity]])
    position = np.minimum(np.searchsorted(kept, stream.ids), len(kept) - 1)
    inside = kept[position] == stream.ids
    rows = np.where(inside, position, capacity).astype(np.int64)
    train = int(len(stream.ids) * (1 - TEST))
    return rows, {
        "words": len(kept),
        "train_events_in_vocabulary": round(float(inside[:train].mean()), 4),
        "test_events_in_vocabulary": round(float(inside[train:].mean()), 4),
    }


def collisions(stream: Stream, rows: int) -> dict:
    """The hashed table's collisions: the share of the stream's distinct ids whose row holds
    another of them, and of each tenth of the stream's events whose row another id of that
    tenth shares (mean over the tenths)."""
    import tensorflow as tf

    from loops.tables import table_ids

    distinct, inverse = np.unique(stream.ids, return_inverse=True)
    hashed = table_ids.hashed_rows(tf.constant(distinct), rows).numpy()
    per_row = np.bincount(hashed, minlength=rows)
    shared = []
    for part in np.array_split(np.arange(len(stream.ids)), 10):
        seen = np.unique(inverse[part])
        holders = np.bincount(hashed[seen], minlength=rows)
        shared.append(float((holders[hashed[inverse[part]]] > 1).mean()))
    return {
        "distinct_ids": len(distinct),
        "ids_sharing_a_row": round(float((per_row[hashed] > 1).mean()), 4),
        "events_sharing_a_row_within_a_tenth": round(statistics.mean(shared), 4),
        "rows_used": int((per_row > 0).sum()),
    }


class Learner:
    """One table with w and b: its traced training step (returning the batch's logits,
    computed before the update) and its scoring; `inputs` are its ids for the stream."""

    def __init__(self, name: str, table, inputs: np.ndarray, args):
        import keras
        import tensorflow as tf

        self.name, self.table, self.inputs = name, table, inputs
        self.dynamic = hasattr(table, "policy")
        table.build()
        rng = np.random.default_rng(args.seed + 1)  # every learner starts w alike
        self.w = tf.Variable(rng.normal(0.0, args.dim**-0.5, args.dim).astype(np.float32))
        self.b = tf.Variable(0.0)
        self.dense = keras.optimizers.Adam(args.dense_rate)
        self.dense.build([self.w, self.b])
        batch = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32)]
        self.train = tf.function(self._train, input_signature=batch)
        self.train_without_admission = tf.function(
            lambda ids, labels: self._train(ids, labels, admit=False), input_signature=batch
        )
        self.score = tf.function(lambda ids: self._logits(ids), input_signature=batch[:1])
        self.parts = breakdown_functions(self) if self.dynamic else {}

    def trace(self) -> None:
        """Traces every function now: AutoGraph reads the source of what it converts, which
        may change while a long run goes on (a tree that others edit)."""
        self.train.get_concrete_function()
        self.score.get_concrete_function()
        for function in self.parts.values():
            function.get_concrete_function()

    def _logits(self, ids, admit=False):
        import tensorflow as tf

        vectors = self.table(ids, training=admit) if self.dynamic else self.table(ids)
        return tf.linalg.matvec(vectors, self.w) + self.b

    def _train(self, ids, labels, admit=True):
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = self._logits(ids, admit)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        dense = [self.w, self.b]
        gradients = tape.gradient(loss, [*self.table.shards, *dense])
        self.table.apply_gradients(gradients[: -len(dense)])
        self.dense.apply_gradients(zip(gradients[-len(dense) :], dense))
        return logits


def make_learners(args, stream: Stream, vocabulary: np.ndarray) -> list[Learner]:
    import keras

    import loops

    def adagrad():
        return keras.optimizers.Adagrad(args.table_rate)

    learners = []
    for admit, decay in args.dynamic:
        table = loops.DynamicTable(
            args.capacity, args.dim, adagrad(), admit_after=admit, decay=decay, seed=args.seed
        )
        learners.append(
            Learner(f"dynamic admit_after={admit} decay={decay}", table, stream.ids, args)
        )
    for multiple in args.hashed_sizes:
        rows = multiple * args.capacity
        hashed = loops.EmbeddingTable(rows, args.dim, adagrad(), ids="hashes", seed=args.seed)
        name = "hashed" if multiple == 1 else f"hashed, {multiple} x capacity rows"
        learners.append(Learner(name, hashed, stream.ids, args))
    fitted = loops.EmbeddingTable(args.capacity + 1, args.dim, adagrad(), seed=args.seed)
    learners.append(Learner("vocabulary of the first 10%", fitted, vocabulary, args))
    return learners


def train_and_test(learner: Learner, stream: Stream, train_events: int, batch: int) -> dict:
    """Trains `learner` once over the first `train_events` events in order: its progressive
    validation AUC, the test AUC of the rest, the pass's rate."""
    import tensorflow as tf

    scores = np.empty(train_events, np.float32)
    wall, cpu = time.perf_counter(), time.process_time()
    for first in range(0, train_events, batch):
        ids = tf.constant(learner.inputs[first : first + batch])
        labels = tf.constant(stream.labels[first : first + batch])
        scores[first : first + batch] = learner.train(ids, labels).numpy()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    test = np.concatenate(
        [
            learner.score(tf.constant(learner.inputs[first : first + 2**16])).numpy()
            for first in range(train_events, len(stream.ids), 2**16)
        ]
    )
    steps = train_events // batch
    return {
        "method": learner.name,
        "progressive_auc": round(auc(scores, stream.labels[:train_events]), 4),
        "test_auc": round(auc(test, stream.labels[train_events:]), 4),
        "pass_ms_a_step": round(1e3 * wall / steps, 2),
        "pass_cpu_ms_a_step": round(1e3 * cpu / steps, 2),
    }


def breakdown_functions(learner: Learner) -> dict:
    """The parts of a dynamic table's step, each a traced function of a batch that writes
    nothing (but the step without admission, which trains the rows it reads)."""
    import tensorflow as tf

    from loops.tables import dynamic_tables, id_map

    table, spec = learner.table, tf.TensorSpec([None], tf.int64)

    def distinct(ids):
        return dynamic_tables._step_ids(table, table.id_numbers(ids))

    def decide(ids):
        decision = id_map.decide(table.map_state(), *distinct(ids), table.policy)
        return [decision.admitted_ids, decision.admitted_rows, *decision.state.values()]

    parts = {
        "step without admission": learner.train_without_admission,
        "distinct ids": tf.function(distinct, input_signature=[spec]),
        "decide (with distinct ids)": tf.function(decide, input_signature=[spec]),
    }
    return parts


def timed(calls: dict, steps: int, rounds: int) -> dict:
    """Each call's median (wall ms, CPU ms) over `rounds` rounds of `steps` calls, the calls
    taking turns; `calls`: name -> (function, its argument tuples, one a batch), round r of
    every one on batches r * steps onwards (cycling), after 3 calls to warm up."""
    samples: dict = {name: [] for name in calls}
    for function, arguments in calls.values():
        for one in arguments[:3]:
            function(*one)
    for round_ in range(rounds):
        for name, (function, arguments) in calls.items():
            mine = [arguments[(round_ * steps + k) % len(arguments)] for k in range(steps)]
            wall, cpu = time.perf_counter(), time.process_time()
            for one in mine:
                result = function(*one)
            np.asarray(_first(result))  # the last call's result is there
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            samples[name].append((1e3 * wall / steps, 1e3 * cpu / steps))
    return {
        name: {
            "ms": round(statistics.median(ms for ms, _ in values), 3),
            "cpu_ms": round(statistics.median(ms for _, ms in values), 3),
        }
        for name, values in samples.items()
    }


def _first(result):
    import tensorflow as tf

    return tf.nest.flatten(result)[0]


def speed(learners: list[Learner], stream: Stream, train_events: int, args) -> dict:
    """The training steps side by side on the test slice's batches, then each dynamic step's
    parts on its own table; the ratios of the dynamic steps to the static ones."""
    import tensorflow as tf

    firsts = range(train_events, len(stream.ids) - args.batch + 1, args.batch)
    labels = [tf.constant(stream.labels[first : first + args.batch]) for first in firsts]

    def batches(learner: Learner, with_labels: bool = True) -> list[tuple]:
        ids = [tf.constant(learner.inputs[first : first + args.batch]) for first in firsts]
        return list(zip(ids, labels)) if with_labels else [(one,) for one in ids]

    steps = timed(
        {learner.name: (learner.train, batches(learner)) for learner in learners},
        args.steps,
        args.rounds,
    )
    parts = {}
    for learner in learners:
        if not learner.dynamic:
            continue
        calls = {"step": (learner.train, batches(learner))}
        for name, function in learner.parts.items():
            calls[name] = (function, batches(learner, name == "step without admission"))
        parts[learner.name] = timed(calls, args.steps, args.rounds)
    static = {"hashed": steps["hashed"]["ms"], "vocabulary": steps[learners[-1].name]["ms"]}
    ratios = {
        learner.name: {
            f"over_{kind}": round(steps[learner.name]["ms"] / ms, 3) for kind, ms in static.items()
        }
        for learner in learners
        if learner.dynamic
    }
    return {"steps": steps, "dynamic_over_static": ratios, "breakdown": parts}


def equal_to_static(args, ids: int = 1000, steps: int = 40, batch: int = 512) -> dict:
    """A DynamicTable with room for every id of a small stream against a full-vocabulary
    EmbeddingTable started from the same initial rows, trained alike by the same step: the
    largest absolute difference of the seen ids' rows, of w and of b."""
    import keras
    import tensorflow as tf

    import loops
    from loops.tables import dynamic_tables

    rng = np.random.default_rng(args.seed + 2)
    vocabulary = np.unique(rng.integers(-(2**62), 2**62, ids))
    index = (rng.zipf(1.3, steps * batch) - 1) % len(vocabulary)
    raw = vocabulary[index]
    labels = (rng.random(len(raw)) < 0.3).astype(np.float32)
    dynamic = loops.DynamicTable(
        len(vocabulary), args.dim, keras.optimizers.Adagrad(args.table_rate), seed=args.seed
    )
    static = loops.EmbeddingTable(
        len(vocabulary), args.dim, keras.optimizers.Adagrad(args.table_rate)
    )
    learners = [Learner("dynamic", dynamic, raw, args), Learner("static", static, index, args)]
    static.set_whole(dynamic_tables.initial_rows(args.seed, tf.constant(vocabulary), args.dim))
    for first in range(0, len(raw), batch):
        for learner in learners:
            ids = tf.constant(learner.inputs[first : first + batch])
            learner.train(ids, tf.constant(labels[first : first + batch]))
    seen = np.unique(index)
    rows = dynamic(tf.constant(vocabulary[seen])).numpy() - static.whole().numpy()[seen]
    weights = [
        np.abs(one.numpy() - other.numpy()).max()
        for one, other in ((learners[0].w, learners[1].w), (learners[0].b, learners[1].b))
    ]
    counters = dynamic.counters()
    return {
        "ids": len(seen),
        "steps": steps,
        "max_abs_difference": float(max(np.abs(rows).max(), *weights)),
        "evictions": counters["evictions"],
        "resident": counters["resident"],
    }


def measure(args) -> dict:
    started = time.perf_counter()
    stream = Stream(args.events, args.ids, args.seed)
    train_events = int(args.events * (1 - TEST)) // args.batch * args.batch
    first_part = int(args.events * VOCABULARY_PART)
    vocabulary, coverage = vocabulary_rows(stream, args.capacity, first_part)
    figures: dict = {
        "stream": {
            "events": args.events,
            "train_events": train_events,
            "test_events": args.events - train_events,
            "click_rate": round(float(stream.labels.mean()), 4),
            "distinct_ids": int(len(np.unique(stream.ids))),
            "distinct_test_ids_unseen_in_training": _unseen(stream.ids, train_events),
            "generated_s": round(time.perf_counter() - started, 1),
        },
        "vocabulary": coverage,
        "hashed_collisions": {
            str(m * args.capacity): collisions(stream, m * args.capacity) for m in args.hashed_sizes
        },
    }
    truth = {
        "method": "true logits (the bound)",
        "progressive_auc": round(
            auc(stream.logits[:train_events], stream.labels[:train_events]), 4
        ),
        "test_auc": round(auc(stream.logits[train_events:], stream.labels[train_events:]), 4),
    }
    learners = make_learners(args, stream, vocabulary)
    for learner in learners:
        learner.trace()
    figures["equal_to_static"] = equal_to_static(args)
    figures["quality"] = [truth]
    for learner in learners:
        figures["quality"].append(train_and_test(learner, stream, train_events, args.batch))
        print(format_quality(figures["quality"][-1:]).splitlines()[-1], flush=True)
    figures["dynamic_counters"] = {
        learner.name: learner.table.counters() for learner in learners if learner.dynamic
    }
    figures["map_digests"] = {
        learner.name: map_digest(learner.table) for learner in learners if learner.dynamic
    }
    figures["speed"] = speed(learners, stream, train_events, args)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures


def map_digest(table) -> str:
    """The first 16 hex digits of the SHA-256 of a dynamic table's map (every `MapState`
    field's name, dtype, shape and bytes, in `id_map.FIELDS` order): equal digests after the
    training pass mean the same admissions, evictions, scores and counters, bit for bit, so
    a change meant to be only faster can be checked against the run before it."""
    from loops.tables import id_map

    digest = hashlib.sha256()
    for name, value in zip(id_map.FIELDS, table.map_state().values(), strict=True):
        array = np.ascontiguousarray(value.numpy())
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()[:16]


def _unseen(ids: np.ndarray, train_events: int) -> float:
    """The share of the test slice's distinct ids that training never saw."""
    test = np.unique(ids[train_events:])
    return round(float(1 - np.isin(test, ids[:train_events]).mean()), 4)


def format_quality(rows: list[dict]) -> str:
    lines = [f"{'method':<40} {'progressive AUC':>15} {'test AUC':>9} {'pass ms a step':>14}"]
    for row in rows:
        rate = f"{row['pass_ms_a_step']:14.2f}" if "pass_ms_a_step" in row else f"{'':>14}"
        lines.append(
            f"{row['method']:<40} {row['progressive_auc']:15.4f} {row['test_auc']:9.4f} {rate}"
        )
    return "\n".join(lines)


def format_figures(figures: dict) -> str:
    lines = [format_quality(figures["quality"]), ""]
    for name, counters in figures["dynamic_counters"].items():
        lines.append(f"{name}: {counters}, map digest {figures['map_digests'][name]}")
    lines.append(f"hashed collisions: {figures['hashed_collisions']}")
    lines.append(f"vocabulary: {figures['vocabulary']}")
    lines.append(f"equal to a static table: {figures['equal_to_static']}")
    lines.append("")
    speed_figures = figures["speed"]
    for name, timing in speed_figures["steps"].items():
        lines.append(f"{name:<40} {timing['ms']:9.3f} ms a step {timing['cpu_ms']:9.3f} CPU ms")
    for name, ratios in speed_figures["dynamic_over_static"].items():
        lines.append(f"{name}: {ratios}")
    for name, parts in speed_figures["breakdown"].items():
        lines.append(f"{name}:")
        for part, timing in parts.items():
            lines.append(f"  {part:<38} {timing['ms']:9.3f} ms {timing['cpu_ms']:9.3f} CPU ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    figures = measure(args)
    print(format_figures(figures))
    report.write(args, **figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
