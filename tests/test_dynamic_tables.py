"""loops.DynamicTable: raw ids admitted and evicted within a capacity by the stated rules, the
same maps, rows, slots and counters on 1, 2 and 4 replicas and across a checkpoint into another
layout, equal to a float64 numpy reference of the rules, and an export that answers every kind
of id in a process that imports only TensorFlow."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.tables import dynamic_tables, id_map

CAPACITY, DIM, RATE, EPSILON, INITIAL_ACCUMULATOR = 6, 3, 0.1, 1e-7, 0.1
WEIGHTS = np.array([[1.0, 2.0, 0.5]])
POLICY = dict(admit_after=2, decay=0.5, ttl=5, waiting=4)
IDS_A_STEP = 16


def drifting_stream(steps=40, seed=0):
    """Each step's 16 global ids: 12 from a popular set of 7 that moves by one id every 4
    steps, a new id twice and 2 new ids once; every 9th step a burst of 8 new ids, each
    twice. Raw ids of any value (negative, near 2**62)."""
    rng = np.random.default_rng(seed)

    def new(count):
        return rng.integers(-(2**62), 2**62, size=count)

    stream = []
    for step in range(steps):
        popular = np.arange(step // 4, step // 4 + 7) * 1_000_003 - 7
        if step % 9 == 8:
            ids = np.repeat(new(8), 2)
        else:
            ids = np.concatenate([rng.choice(popular, size=12), np.repeat(new(1), 2), new(2)])
        stream.append(ids.astype(np.int64))
    return stream


class Reference:
    """The module docstring's rules of `loops.tables.id_map`, in plain Python and float64 numpy,
    training each step with Adagrad on loss sum(rows**2 * WEIGHTS)."""

    def __init__(self, seed, admit_after, decay, ttl, waiting):
        self.seed, self.admit_after, self.decay, self.ttl, self.places = (
            seed,
            admit_after,
            decay,
            ttl,
            waiting,
        )
        self.rows = {}  # row -> {id, score, seen}
        self.waiting = {}  # id -> (count, seen)
        self.values = np.zeros((CAPACITY, DIM))
        self.accumulator = np.full((CAPACITY, DIM), INITIAL_ACCUMULATOR)
        self.step = 0
        self.counters = dict.fromkeys(id_map.COUNTERS, 0)

    def resident(self):
        return {entry["id"]: row for row, entry in self.rows.items()}

    def decayed(self, entry):
        return entry["score"] * self.decay ** (self.step - entry["seen"])

    def take_step(self, ids):
        self.step += 1
        t = self.step
        distinct, counts = np.unique(ids, return_counts=True)
        counts = dict(zip(distinct.tolist(), counts.tolist(), strict=True))
        resident = self.resident()
        for key, count in counts.items():
            if key in resident:
                entry = self.rows[resident[key]]
                entry["score"] = self.decayed_to(entry, t) + count
                entry["seen"] = t
        for row in [r for r, e in self.rows.items() if t - e["seen"] > self.ttl]:
            del self.rows[row]
            self.counters["expirations"] += 1
        alive = {}
        for key, (count, seen) in self.waiting.items():
            if t - seen <= self.ttl:
                alive[key] = (count, seen)
            else:
                self.counters["expirations"] += 1
        new = {k: c for k, c in counts.items() if k not in resident}
        totals = {k: c + alive.get(k, (0, 0))[0] for k, c in new.items()}
        ready = sorted(k for k, total in totals.items() if total >= self.admit_after)
        free = CAPACITY - len(self.rows)
        evictable = [(self.decayed(e), e["seen"], e["id"], r) for r, e in self.rows.items()]
        evictable = sorted(item for item in evictable if item[1] < t)
        evicted = min(max(len(ready) - free, 0), len(evictable))
        for *_, row in evictable[:evicted]:
            del self.rows[row]
        self.counters["evictions"] += evicted
        taken = min(len(ready), free + evicted)
        by_priority = sorted(ready, key=lambda k: (-totals[k], k))
        chosen, refused = sorted(by_priority[:taken]), by_priority[taken:]
        open_rows = [r for r in range(CAPACITY) if r not in self.rows][:taken]
        for key, row in zip(chosen, open_rows, strict=True):
            self.rows[row] = {"id": key, "score": float(totals[key]), "seen": t}
            self.values[row] = dynamic_tables.initial_rows(self.seed, tf.constant([key]), DIM)[0]
            self.accumulator[row] = INITIAL_ACCUMULATOR
        self.counters["admissions"] += taken
        self.counters["refusals"] += len(refused)
        self.counters["unadmitted_lookups"] += sum(c for k, c in new.items() if k not in chosen)
        still = [(k, totals[k], t) for k in new if totals[k] < self.admit_after]
        entries = [(k, c, s) for k, (c, s) in alive.items() if k not in new]
        entries += still + [(k, totals[k], t) for k in refused]
        entries.sort(key=lambda e: (-e[1], -e[2], e[0]))
        self.counters["waiting_dropped"] += max(len(entries) - self.places, 0)
        self.waiting = {k: (c, s) for k, c, s in entries[: self.places]}
        self.train(ids)

    def decayed_to(self, entry, t):
        return entry["score"] * self.decay ** (t - entry["seen"])

    def train(self, ids):
        resident = self.resident()
        gradient = np.zeros_like(self.values)
        for key in ids.tolist():
            if key in resident:
                row = resident[key]
                gradient[row] += 2.0 * self.values[row] * WEIGHTS[0]
        self.accumulator += gradient**2
        self.values -= RATE * gradient / np.sqrt(self.accumulator + EPSILON)


ROW_RULES = {
    "adagrad": lambda: keras.optimizers.Adagrad(RATE),
    "sgd": lambda: keras.optimizers.SGD(RATE),
    "rowwise_adagrad": lambda: loops.RowwiseAdagrad(RATE),
}


def made_table(replicas, seed=3, optimizer="adagrad", **policy):
    strategy = loops.testing.replica_strategy(replicas)
    with strategy.scope():
        table = loops.DynamicTable(
            CAPACITY, DIM, ROW_RULES[optimizer](), seed=seed, name="ids", **policy
        )
        table.build()
    return strategy, table


def training_step(strategy, table):
    weights = tf.constant(WEIGHTS, tf.float32)

    def replica_step(ids):
        with tf.GradientTape() as tape:
            found = table(ids, training=True)
            loss = tf.reduce_sum(found**2 * weights)
        table.apply_gradients(tape.gradient(loss, table.shards))

    return tf.function(lambda ids: strategy.run(replica_step, args=(ids,)))


def state_of(table):
    """Everything the table holds, as numpy: its map, rows and slot."""
    state = {f"map_{name}": getattr(table.map_state(), name).numpy() for name in id_map.FIELDS}
    state["embeddings"] = table.whole().numpy()
    for name in table.slot_names:  # Adagrad's accumulator; SGD keeps none
        state[name] = table.whole(name).numpy()
    return state


def trained(replicas, stream, table=None, strategy=None, **policy):
    """Trains on `stream` (global ids a step) dealt to `replicas` replicas in order; the
    table and its state after each step."""
    if table is None:
        strategy, table = made_table(replicas, **(policy or POLICY))
    step = training_step(strategy, table)
    states = []
    share = IDS_A_STEP // replicas
    for ids in stream:
        step(
            strategy.experimental_distribute_values_from_function(
                lambda context, ids=ids: tf.constant(
                    ids[context.replica_id_in_sync_group * share :][:share], tf.int64
                )
            )
        )
        states.append(state_of(table))
    return table, states


def assert_same_states(got, want, rows_exact=True):
    """The maps and counters bit for bit; the rows and slots too, or (another replica count,
    whose collectives sum a row's gradient in another order) to 1e-6."""
    assert len(got) == len(want)
    for index, (one, other) in enumerate(zip(got, want, strict=True)):
        for name in one:
            message = f"{name}, step {index}"
            if name.startswith("map_") or rows_exact:
                np.testing.assert_array_equal(one[name], other[name], err_msg=message)
            else:
                np.testing.assert_allclose(
                    one[name], other[name], rtol=0, atol=1e-6, err_msg=message
                )


def test_the_rules_equal_a_float64_numpy_reference_step_by_step():
    stream = drifting_stream()
    table, states = trained(1, stream)
    reference = Reference(3, **POLICY)
    for step, (ids, state) in enumerate(zip(stream, states, strict=True)):
        reference.take_step(ids)
        rows = reference.resident()
        held = {
            int(key): int(row)
            for key, row in zip(state["map_row_id"], range(CAPACITY), strict=True)
            if state["map_row_used"][row]
        }
        assert held == rows, f"step {step + 1}"
        for row in rows.values():
            np.testing.assert_allclose(state["embeddings"][row], reference.values[row], atol=1e-6)
            np.testing.assert_allclose(
                state["accumulator"][row], reference.accumulator[row], atol=1e-6
            )
        counters = dict(zip(id_map.COUNTERS, state["map_counters"].tolist(), strict=True))
        assert counters == reference.counters, f"step {step + 1}"
        waiting = {
            int(k): (int(c), int(s))
            for k, c, s in zip(
                state["map_waiting_ids"],
                state["map_waiting_counts"],
                state["map_waiting_seen"],
                strict=True,
            )
            if k != id_map.EMPTY
        }
        assert waiting == reference.waiting, f"step {step + 1}"
    # The stream exercised every rule.
    final = reference.counters
    assert min(final.values()) > 0, final
    np.testing.assert_array_equal(states[-1]["embeddings"][CAPACITY], np.zeros(DIM))
    assert table.counters()["step"] == len(stream)


@pytest.mark.parametrize("replicas", [2, 4])
def test_maps_and_counters_are_bit_identical_on_1_2_and_4_replicas_rows_to_1e_6(replicas):
    stream = drifting_stream()
    _, alone = trained(1, stream)
    _, split = trained(replicas, stream)
    assert_same_states(split, alone, rows_exact=False)
    _, again = trained(replicas, stream)
    assert_same_states(again, split)  # the same layout: every bit


def test_a_checkpoint_at_an_evicting_step_resumes_the_same_map_on_another_layout(tmp_path):
    stream = drifting_stream()
    table, states = trained(1, stream)
    # The first step after which something was evicted, and the one after it evicts too.
    evictions = [s["map_counters"][id_map.COUNTERS.index("evictions")] for s in states]
    cut = next(i for i in range(1, len(states)) if evictions[i] > evictions[i - 1]) + 1
    for saved_on, restored_on in ((1, 1), (1, 2), (4, 1)):
        strategy, saved = made_table(saved_on, **POLICY)
        trained(saved_on, stream[:cut], saved, strategy)
        path = tf.train.Checkpoint(table=saved).save(str(tmp_path / f"from{saved_on}"))
        strategy, restored = made_table(restored_on, seed=3, **POLICY)
        tf.train.Checkpoint(table=restored).restore(path).assert_consumed()
        _, resumed = trained(restored_on, stream[cut:], restored, strategy)
        assert_same_states(resumed, states[cut:], rows_exact=saved_on == restored_on == 1)


@pytest.mark.parametrize("optimizer", sorted(ROW_RULES))
def test_with_room_for_every_id_it_equals_a_full_vocabulary_table_started_alike(optimizer):
    vocabulary = np.array([-40, 3, 17, 2**40, 5], np.int64)
    rng = np.random.default_rng(1)
    stream = [rng.choice(vocabulary, size=IDS_A_STEP) for _ in range(12)]
    strategy, table = made_table(2, optimizer=optimizer, admit_after=1, decay=1.0)
    table, _ = trained(2, stream, table, strategy)
    strategy, static = loops.testing.replica_strategy(2), None
    with strategy.scope():
        static = loops.EmbeddingTable(len(vocabulary), DIM, ROW_RULES[optimizer]())
        static.build()
    static.set_whole(dynamic_tables.initial_rows(3, tf.constant(vocabulary), DIM))
    step = training_step(strategy, static)
    lookup = {int(key): index for index, key in enumerate(vocabulary)}
    for ids in stream:
        rows = np.array([lookup[int(key)] for key in ids], np.int32)
        step(
            strategy.experimental_distribute_values_from_function(
                lambda context, rows=rows: tf.constant(
                    rows[context.replica_id_in_sync_group * 8 :][:8]
                )
            )
        )
    dynamic = table(tf.constant(vocabulary)).numpy()
    np.testing.assert_allclose(dynamic, static.whole().numpy(), rtol=0, atol=1e-6)
    assert table.counters()["evictions"] == 0 and table.counters()["resident"] == 5
    for name in table.slot_names:  # the slots of the ids' rows, as the static table's
        rows = [dict(zip(table.map_state().row_id.numpy().tolist(), range(CAPACITY)))[int(k)]
                for k in vocabulary]  # fmt: skip
        np.testing.assert_allclose(
            table.whole(name).numpy()[rows], static.whole(name).numpy(), rtol=0, atol=1e-6
        )


def test_an_export_answers_admitted_evicted_waiting_and_unseen_ids_in_plain_tensorflow(tmp_path):
    stream = drifting_stream()
    table, states = trained(1, stream)
    reference = Reference(3, **POLICY)
    for ids in stream:
        reference.take_step(ids)
    resident = reference.resident()
    ever = {int(key) for ids in stream for key in ids}
    evicted = sorted(ever - set(resident) - set(reference.waiting))[:2]
    cases = {
        "admitted": sorted(resident)[:2],
        "evicted": evicted,
        "waiting": sorted(reference.waiting)[:1],
        "unseen": [123, -(2**50)],
    }
    assert all(cases.values()), cases

    class Served(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = table

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, ids):
            return {"rows": self.table(ids), "known": self.table.known(ids)}

    tf.saved_model.save(Served(), str(tmp_path / "export"))
    code = (
        "import json, sys, tensorflow as tf\n"
        "served = tf.saved_model.load(sys.argv[1])\n"
        "cases = json.loads(sys.argv[2])\n"
        "out = {k: {n: v.numpy().tolist() for n, v in served.serve(tf.constant(ids, tf.int64))"
        ".items()} for k, ids in cases.items()}\n"
        "assert not [m for m in sys.modules if m.startswith('loops')]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "export"), json.dumps(cases)],
        capture_output=True,
        text=True,
        check=True,
    )
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for kind, ids in cases.items():
        known = kind == "admitted"
        assert answers[kind]["known"] == [known] * len(ids), kind
        want = [reference.values[resident[key]] if known else np.zeros(DIM) for key in ids]
        np.testing.assert_allclose(answers[kind]["rows"], want, atol=1e-6, err_msg=kind)


def test_string_ids_hash_to_64_bit_fingerprints_and_an_evaluation_changes_nothing():
    strategy, table = made_table(1, admit_after=1)
    step = training_step(strategy, table)
    step(tf.constant([3, 3, 4, 5, 6, 7, 8, 9], tf.int64))
    before = state_of(table)
    table(tf.constant([100, 3], tf.int64))  # not training: no admission, no clock
    assert_same_states([state_of(table)], [before])
    assert table.counters()["step"] == 1 and table.counters()["resident"] == 6
    words = loops.DynamicTable(4, 2, ids="strings", name="words")
    words.build()
    numbers = words.id_numbers(tf.constant(["a", "b", "a"])).numpy()
    assert numbers[0] == numbers[2] != numbers[1] and (numbers >= 0).all()
    np.testing.assert_array_equal(
        numbers, tf.strings.to_hash_bucket_fast(["a", "b", "a"], 2**63 - 1).numpy()
    )


def test_initial_rows_are_a_function_of_seed_and_id_in_range_and_distinct():
    ids = tf.constant([0, 1, -1, 2**62, 7], tf.int64)
    rows = dynamic_tables.initial_rows(5, ids, 4).numpy()
    assert rows.shape == (5, 4) and np.abs(rows).max() <= 0.05
    assert len(np.unique(rows)) == 20
    again = dynamic_tables.initial_rows(5, tf.constant([7, 0], tf.int64), 4).numpy()
    np.testing.assert_array_equal(again, rows[[4, 0]])
    other = dynamic_tables.initial_rows(6, ids, 4).numpy()
    assert np.abs(other - rows).min() > 0


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(capacity=0), "capacity=0"),
        (dict(admit_after=0), "admit_after=0"),
        (dict(decay=1.5), "decay=1.5"),
        (dict(decay=0), "decay=0"),
        (dict(ttl=0), "ttl=0"),
        (dict(waiting=-1), "waiting=-1"),
        (dict(ids="hashes"), "ids='hashes'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(arguments, named):
    given = dict(capacity=4, dim=2) | arguments
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        loops.DynamicTable(**given)


def test_the_reserved_id_is_refused_naming_it():
    table = loops.DynamicTable(4, 2, name="reserved")
    table.build()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"2\*\*63 - 1 is reserved"):
        table(tf.constant([1, 2**63 - 1], tf.int64))


def test_a_strategy_with_one_copy_for_several_replicas_is_refused_before_any_step():
    strategy = loops.testing.replica_strategy(2, "central_storage")
    with strategy.scope():
        table = loops.DynamicTable(4, 2, name="central")
        with pytest.raises(ValueError, match="keeps one copy of the table for several replicas"):
            table.build()


def test_the_step_outputs_sum_the_tables_resident_ids_evictions_and_refusals():
    stream = drifting_stream()
    tables = [trained(1, stream)[0], trained(1, stream[:20])[0]]
    counted = {k: int(v) for k, v in dynamic_tables.summed_counters(tables).items()}
    each = [table.counters() for table in tables]
    assert counted == {
        "ids_resident": sum(c["resident"] for c in each),
        "ids_evicted": sum(c["evictions"] for c in each),
        "ids_refused": sum(c["refusals"] for c in each),
    }
    assert dynamic_tables.summed_counters([loops.EmbeddingTable(3, 2)]) == {}
