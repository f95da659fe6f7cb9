"""The index of a dynamic table's map (`loops.tables.id_map`): its two sorted parts answer
every lookup as the rows themselves do, through compactions, stale entries and ids that come
back to the row they held."""

import numpy as np
import tensorflow as tf

from loops.tables import id_map

CAPACITY, UNIVERSE, IDS_A_STEP, STEPS = 16, 40, 7, 240


def resident(state: id_map.MapState) -> dict[int, int]:
    """Each id's row, read from the rows themselves."""
    used = state.row_used.numpy()
    return {int(key): row for row, key in enumerate(state.row_id.numpy()) if used[row]}


def test_lookups_through_both_index_parts_equal_the_rows_at_every_step():
    assert id_map.recent_places(CAPACITY) == 8
    policy = id_map.AdmissionPolicy(admit_after=1, decay=0.9)
    state = id_map.empty_state(CAPACITY, 0)

    @tf.function
    def decide(values, ids, counts):
        decision = id_map.decide(id_map.MapState(*values), ids, counts, policy)
        return decision.state.values(), decision.admitted_ids, decision.admitted_rows

    rng = np.random.default_rng(0)
    # Raw ids of any value, the extremes included (no id overflows the tie order).
    universe = np.concatenate([[-(2**63), 2**63 - 2], rng.integers(-(2**62), 2**62, UNIVERSE)])
    everyone = tf.constant(universe, tf.int64)
    held_before: dict[int, int] = {}
    compactions = recent_used = returns = 0
    for step in range(STEPS):
        # A popular set that moves, and a few ids from anywhere.
        popular = universe[(step // 10 + np.arange(5)) % len(universe)]
        drawn = np.concatenate([rng.choice(popular, 4), rng.choice(universe, IDS_A_STEP - 4)])
        ids, counts = np.unique(drawn, return_counts=True)
        values, admitted_ids, admitted_rows = decide(
            state.values(), tf.constant(ids, tf.int64), tf.constant(counts, tf.int64)
        )
        state = id_map.MapState(*values)
        held = resident(state)
        rows, known = id_map.lookup(state, everyone, CAPACITY)
        answered = {
            int(key): int(row)
            for key, row, hit in zip(universe, rows.numpy(), known.numpy(), strict=True)
            if hit
        }
        assert answered == held, f"step {step + 1}"
        assert len(held) <= CAPACITY
        recent = state.recent_ids.numpy()
        compactions += int(np.all(recent == id_map.EMPTY) and len(admitted_ids) > 0)
        recent_used += int(np.any(recent != id_map.EMPTY))
        for key, row in zip(admitted_ids.numpy(), admitted_rows.numpy(), strict=True):
            returns += int(held_before.get(int(key)) == int(row))
            held_before[int(key)] = int(row)
        # Each part stays sorted, with no id held twice.
        for part in (state.sorted_ids.numpy(), recent):
            live = part[part != id_map.EMPTY]
            assert np.all(live[1:] > live[:-1]), f"step {step + 1}"
    counters = dict(zip(id_map.COUNTERS, state.counters.numpy().tolist(), strict=True))
    assert counters["evictions"] > 100, counters
    # The stream exercised each path: compactions, a recent part in use, and ids admitted
    # again into the row they held before (their stale entries hold again).
    assert compactions >= 5 and recent_used >= 50 and returns >= 5, (
        compactions,
        recent_used,
        returns,
    )


def test_the_kth_highest_by_a_sampled_bound_equals_a_full_sort():
    """Each way `_kth_highest` settles the k-th value: among the values above the sampled
    bound (distinct values), at the bound (ties), and by a top-k over every value where the
    sample misleads (every 16th value high, the rest low)."""
    rng = np.random.default_rng(3)
    size = 5000
    misleading = np.zeros(size)
    misleading[:: id_map.SAMPLE_STRIDE] = np.arange(len(misleading[:: id_map.SAMPLE_STRIDE])) + 1
    cases = {
        "distinct": rng.normal(size=size),
        "ties": np.where(rng.random(size) < 0.9, 1.0, rng.integers(2, 9, size)).astype(float),
        "misleading": misleading,
        "int64 keys": rng.integers(-(2**62), 2**62, size),
    }
    kth = tf.function(id_map._kth_highest)
    for name, values in cases.items():
        ordered = np.sort(values)[::-1]
        for k in (1, 2, 17, 300, 1000, size):
            got = kth(tf.constant(values), tf.constant(k, tf.int64)).numpy()
            assert got == ordered[k - 1], (name, k, got, ordered[k - 1])
    # The misleading sample's bound (its 140th highest at k = 1000) has 139 values above it.
    bound = np.sort(misleading[:: id_map.SAMPLE_STRIDE])[::-1][2 * (1000 // 16) + 16 - 1]
    assert (misleading > bound).sum() == 139
