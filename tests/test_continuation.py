"""`loops.WarmStart.continuation`: a run that goes on from another run's checkpoint on the
next day's rows, its vocabulary grown by the day's new ids, ends where one run over both
days in order ends (1e-6), on one replica and on two; a model that is not the checkpoint's
is refused; the lineage goes into results.json, one entry a run."""

import os

import numpy as np
import pytest
from test_warm_start import BATCH, day_log, rating_trainer, table_rows

import loops

# Day 1's vocabulary, and day 2's new ids (appended: each old id keeps its row).
DAY1_USERS = np.array([5, 2**40, -3, 77, 1_000_003, 8], np.int64)
DAY1_ITEMS = np.array(["b", "a", "c", "e", "d"])
NEW_USERS = np.array([901, 44], np.int64)
NEW_ITEMS = np.array(["f", "0"])
DAY1_STEPS, DAY2_STEPS = 6, 5


def day_rows(seed, users, items, steps):
    """`steps` batches of ratings by raw id: (user ids, item ids, ratings)."""
    rng = np.random.default_rng(seed)
    count = steps * BATCH
    return (
        users[rng.integers(0, len(users), count)],
        items[rng.integers(0, len(items), count)],
        (rng.uniform(1.0, 5.0, count).astype(np.float32)),
    )


DAY1 = day_rows(1, DAY1_USERS, DAY1_ITEMS, DAY1_STEPS)
# Day 2: old users and items with the new ones among them.
DAY2 = day_rows(
    2,
    np.concatenate([DAY1_USERS[2:], NEW_USERS]),
    np.concatenate([DAY1_ITEMS[:3], NEW_ITEMS]),
    DAY2_STEPS,
)


def indexed(rows, users, items):
    """`rows` by the row of each raw id in the vocabularies `users` and `items`."""
    user_row = {value: row for row, value in enumerate(users.tolist())}
    item_row = {value: row for row, value in enumerate(items.tolist())}
    return (
        np.array([user_row[u] for u in rows[0].tolist()], np.int32),
        np.array([item_row[i] for i in rows[1].tolist()], np.int32),
        rows[2],
    )


def by_raw_id(rows, users, items):
    """Each table's rows and slots keyed by raw id: {(table, variable, id): row}."""
    ids = {"user_table": users, "user_bias": users, "item_table": items, "item_bias": items}
    return {
        (table, name, raw): value[row]
        for table, values in rows.items()
        for name, value in values.items()
        for row, raw in enumerate(ids[table].tolist())
    }


def grown_vocabularies():
    """Day 2's users and items (day 1's, then the new ones) and the continuation's row_ids."""
    users = np.concatenate([DAY1_USERS, NEW_USERS])
    items = np.concatenate([DAY1_ITEMS, NEW_ITEMS])
    ids = {"user_table": (DAY1_USERS, users), "user_bias": (DAY1_USERS, users)}
    ids.update(item_table=(DAY1_ITEMS, items), item_bias=(DAY1_ITEMS, items))
    return users, items, ids


def trained_day1(strategy, model_dir):
    """Day 1 trained on `strategy` into `model_dir`, checkpointed: its Trainer."""
    first = rating_trainer(
        strategy,
        DAY1_USERS,
        DAY1_ITEMS,
        model_dir=str(model_dir),
        rows=indexed(DAY1, DAY1_USERS, DAY1_ITEMS),
    )
    first.train(DAY1_STEPS)
    first.save_checkpoint()
    return first


def continued_day2(strategy, tmp_path, model_dir=None):
    """Day 2 going on from tmp_path/day1 on `strategy` (model_dir: tmp_path/day2)."""
    users, items, ids = grown_vocabularies()
    return rating_trainer(
        strategy,
        users,
        items,
        model_dir=str(model_dir or os.path.join(tmp_path, "day2")),
        rows=indexed(DAY2, users, items),
        warm_start=loops.WarmStart.continuation(os.path.join(tmp_path, "day1"), row_ids=ids),
    )


def check_ends_as_concatenated(rows, weights, loss, concatenated, err_msg=""):
    """`rows` (by raw id), the dense `weights` and day 2's `loss` are the concatenated run's,
    to 1e-6."""
    expected_rows, dense, losses = concatenated
    for key, value in rows.items():
        np.testing.assert_allclose(
            value, expected_rows[key], rtol=1e-6, atol=1e-6, err_msg=f"{err_msg} {key}"
        )
    for weight, expected in zip(weights, dense, strict=True):
        np.testing.assert_allclose(np.asarray(weight), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(loss, losses[DAY1_STEPS:], rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def concatenated():
    """One run over both days in order, on one replica, its vocabulary sorted (another order
    than the continuation's): (rows by raw id, dense weights, step losses)."""
    users = np.sort(np.concatenate([DAY1_USERS, NEW_USERS]))
    items = np.sort(np.concatenate([DAY1_ITEMS, NEW_ITEMS]))
    both = tuple(np.concatenate(parts) for parts in zip(DAY1, DAY2, strict=True))
    trainer = rating_trainer(
        loops.testing.replica_strategy(1), users, items, rows=indexed(both, users, items)
    )
    loss = trainer.train(DAY1_STEPS + DAY2_STEPS)["loss"]
    dense = [w.numpy() for w in trainer.definition.model.weights]
    return by_raw_id(table_rows(trainer), users, items), dense, loss


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_continued_run_on_the_next_day_ends_as_one_run_over_both_days(
    concatenated, replicas, tmp_path
):
    strategy = loops.testing.replica_strategy(replicas)
    trained_day1(strategy, tmp_path / "day1")
    second = continued_day2(strategy, tmp_path)
    assert int(second.global_step.numpy()) == DAY1_STEPS
    loss = second.train(DAY1_STEPS + DAY2_STEPS)["loss"]
    got = by_raw_id(table_rows(second), *grown_vocabularies()[:2])
    assert sorted(got) == sorted(concatenated[0])
    check_ends_as_concatenated(got, second.definition.model.weights, loss, concatenated)
    report = second.warm_start_report
    assert report["continues"] is True and report["step"] == DAY1_STEPS
    assert report["remapped"]["user_table"] == {
        "variables": report["remapped"]["user_table"]["variables"],
        "rows": 8,
        "kept": 6,
        "new": 2,
        "dropped": 0,
    }
    # A Python run records no log identity (a binary's config.json does).
    # No eval data: no temporal evaluation (tests/test_ctr_continuation.py has one).
    assert report["lineage"] == [
        {"checkpoint": report["checkpoint"], "step": DAY1_STEPS, "log": None,
         "evaluated_at_start": {}}
    ]  # fmt: skip
    assert report["evaluated_at_start"] == {} and report["temporal"] == []
    # Only the learning rates are this run's own: the step, both optimizers' counts and
    # slots, the dense weights and every table came from day 1.
    assert report["left"] and all(name.endswith("_learning_rate") for name in report["left"])
    assert "global_step" in report["taken"]


def test_a_continuation_on_two_workers_ends_as_one_run_over_both_days(concatenated, tmp_path):
    """Day 1 by one process, day 2 gone on from its checkpoint by 2 worker processes
    (MultiWorkerMirroredStrategy under loops-launch): one run over both days' rows, weights
    and day-2 losses, to 1e-6, on each worker."""
    import subprocess
    import sys

    trained_day1(loops.testing.replica_strategy(1), tmp_path / "day1").close()
    script = os.path.join(os.path.dirname(__file__), "continuation_workers.py")
    launched = subprocess.run(
        [sys.executable, "-m", "loops.cluster.launch", "--num_workers=2", "--"]
        + [sys.executable, script, str(tmp_path), str(tmp_path / "day1")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert launched.returncode == 0, (launched.stdout + launched.stderr)[-4000:]
    for worker in ("worker_0", "worker_1"):
        got = np.load(tmp_path / f"{worker}.npz")
        rows = {key: got["|".join(map(str, key))] for key in concatenated[0]}
        weights = [got[f"dense_{i}"] for i in range(len(concatenated[1]))]
        check_ends_as_concatenated(rows, weights, got["loss"], concatenated, err_msg=worker)


def test_a_continued_run_killed_midway_resumes_on_its_own_stream(concatenated, tmp_path):
    """A continued run saved 2 steps into day 2 and resumed (its own checkpoint, not the
    warm start again) reads day 2 on from its third batch (the recovery record's
    stream_start), ending as one run over both days."""
    strategy = loops.testing.replica_strategy(1)
    trained_day1(strategy, tmp_path / "day1").close()
    first = continued_day2(strategy, tmp_path)
    early = first.train(DAY1_STEPS + 2)["loss"]
    first.save_checkpoint()
    first.close()
    again = continued_day2(strategy, tmp_path)
    assert int(again.global_step.numpy()) == DAY1_STEPS + 2
    assert int(again.controller.recoveries.stream_start.numpy()) == DAY1_STEPS
    late = again.train(DAY1_STEPS + DAY2_STEPS)["loss"]
    got = by_raw_id(table_rows(again), *grown_vocabularies()[:2])
    check_ends_as_concatenated(
        got, again.definition.model.weights, np.concatenate([early, late]), concatenated
    )


def test_a_third_day_carries_the_lineage_of_both_runs_before(tmp_path):
    strategy = loops.testing.replica_strategy(1)
    days = []
    for day in range(3):
        if days:  # what a binary reads before building a model: the step to go on from
            assert loops.WarmStart.continuation(days[-1]).source_step() == 2 * day
        trainer = rating_trainer(
            strategy,
            DAY1_USERS,
            DAY1_ITEMS,
            model_dir=str(tmp_path / f"day{day}"),
            warm_start=loops.WarmStart.continuation(days[-1]) if days else None,
        )
        trainer.train(2 * (day + 1))
        trainer.save_checkpoint()
        trainer.write_results()
        trainer.close()
        days.append(str(tmp_path / f"day{day}"))
    from conftest import read_results

    lineage = read_results(days[2])["warm_start"]["lineage"]
    assert [(entry["checkpoint"].split("/")[-3], entry["step"]) for entry in lineage] == [
        ("day0", 2),
        ("day1", 4),
    ]


def test_a_continuation_of_another_model_is_refused_naming_what_it_lacks(tmp_path):
    strategy = loops.testing.replica_strategy(1)
    source = rating_trainer(strategy, DAY1_USERS, DAY1_ITEMS, model_dir=str(tmp_path))
    source.train(2)
    source.save_checkpoint()
    # Users by raw id without row_ids: the checkpoint's user rows are of another shape.
    with pytest.raises(ValueError, match=r"cannot take .*of shape \[6, 4\].*\[8, 4\]"):
        rating_trainer(
            strategy,
            np.concatenate([DAY1_USERS, NEW_USERS]),
            DAY1_ITEMS,
            warm_start=loops.WarmStart.continuation(str(tmp_path)),
        )


def test_loops_recommender_continues_a_run_on_the_next_days_log(tmp_path):
    """Day 2 goes on from day 1's step with the ids grown (day 1's first, each keeping its
    row: a user absent on day 2 keeps day 1's row bit for bit under row-wise SGD), the
    lineage with day 1's log in results.json; a --train_steps day 1 reached is refused."""
    from conftest import checkpoint_weights, read_results, run_module
    from loops.model_dir import id_vocabulary

    common = (
        *("--model=rating", "--rows_by_id", "--placed_tables", "--table_optimizer=sgd"),
        *("--validation_fraction=0", "--global_batch_size=16", "--table_learning_rate=0.5"),
    )
    days = {day: day_log(tmp_path / f"day{day}.csv", first) for day, first in ((1, 0), (2, 5))}
    first = run_module(
        "loops.bin.recommender",
        *common,
        f"--data={days[1]}",
        f"--model_dir={tmp_path / 'day1'}",
        "--train_steps=6",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    continued = (*common, f"--data={days[2]}", f"--continue_from={tmp_path / 'day1'}")
    done = run_module(
        "loops.bin.recommender",
        *continued,
        f"--model_dir={tmp_path / 'day2'}",
        "--train_steps=6",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--train_steps=6 is a step the run" in done.stderr
    assert "pass --train_steps=12 to train 6 steps more" in done.stderr
    assert not (tmp_path / "day2" / "checkpoints").exists()
    second = run_module(
        "loops.bin.recommender",
        *continued,
        f"--model_dir={tmp_path / 'day2'}",
        "--train_steps=10",
        "--export_deltas",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    check_the_delta_export(tmp_path)

    ids = {day: id_vocabulary.read_ids(str(tmp_path / f"day{day}")) for day in days}
    assert ids[1]["users"].tolist() == sorted(f"u{user}" for user in range(20))
    assert ids[2]["users"].tolist() == [
        *ids[1]["users"].tolist(),
        *(f"u{u}" for u in range(20, 25)),
    ]
    assert ids[2]["items"].tolist() == ids[1]["items"].tolist()
    results = read_results(str(tmp_path / "day2"))
    assert results["global_step"] == 10
    report = results["warm_start"]
    assert report["continues"] and report["step"] == 6
    assert report["remapped"]["user_table"] | {"variables": None} == {
        "variables": None,
        "rows": 25,
        "kept": 20,
        "new": 5,
        "dropped": 0,
    }
    (entry,) = report["lineage"]
    assert entry["step"] == 6 and entry["checkpoint"].endswith("ckpt-6")
    assert entry["log"]["log"]["path"] == str(days[1])

    def user_rows(day):
        (rows,) = [
            array
            for name, array in checkpoint_weights(str(tmp_path / f"day{day}")).items()
            if "embeddings" in name and array.shape in ((20, 32), (25, 32))  # users, not items
        ]
        return rows

    old, new = user_rows(1), user_rows(2)
    absent = [row for row, user in enumerate(ids[1]["users"].tolist()) if int(user[1:]) < 5]
    present = sorted(set(range(20)) - set(absent))
    np.testing.assert_array_equal(new[absent], old[absent])  # no day-2 row: untouched
    assert not np.array_equal(new[present], old[present])  # trained on


def check_the_delta_export(tmp_path):
    """Day 1's export patched by day 2's delta (loops-apply-deltas) answers 10^4 requests as
    day 2's export does, bit for bit, in a process that imports only TensorFlow."""
    from conftest import run_module, run_python
    from loops.model_dir import export_deltas

    (delta,) = export_deltas.delta_paths([str(tmp_path / "day2" / "deltas")])
    manifest = export_deltas.read_delta(delta)
    assert manifest["follows"] == export_deltas.fingerprint(str(tmp_path / "day1" / "export"))
    assert manifest["gives"] == export_deltas.fingerprint(str(tmp_path / "day2" / "export"))
    # Each changed variable goes as its changed rows or whole, whichever is smaller; the
    # grown user table's 5 new rows are among what it sends; the graph and ids.json hold the
    # grown ids (tests/test_export_deltas.py counts the bytes of a large table's rows).
    entries = manifest["variables"].values()
    assert entries and all(entry.get("whole") or entry["rows"] > 0 for entry in entries)
    (users,) = [entry for entry in entries if entry["shape"] == [25, 32]]
    assert users.get("whole") or users["rows"] >= 5
    assert {"saved_model.pb", "ids.json"} <= set(manifest["files"])
    applied = run_module(
        "loops.cli.apply_deltas",
        f"--export={tmp_path / 'day1' / 'export'}",
        f"--deltas={tmp_path / 'day2' / 'deltas'}",
        f"--output={tmp_path / 'patched'}",
    )
    assert applied.returncode == 0, applied.stderr[-2000:]
    assert "applied 1 deltas" in applied.stdout
    code = """
import sys, numpy as np, tensorflow as tf
rng = np.random.default_rng(3)
users = tf.constant([f"u{u}" for u in rng.integers(0, 30, 10_000)])
items = tf.constant(2**35 + 11 * rng.integers(0, 16, 10_000))
answers = []
for path in sys.argv[1:]:
    model = tf.saved_model.load(path)
    top = model.signatures["serving_default"](users=users)
    pairs = model.signatures["score_pairs"](users=users, items=items)
    answers.append(
        {**{"top " + k: v.numpy() for k, v in top.items()},
         **{"pairs " + k: v.numpy() for k, v in pairs.items()}}
    )
a, b = answers
assert sorted(a) == sorted(b)
for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
assert not [m for m in sys.modules if m.startswith("loops")]
print("equal", sorted(a))
"""
    done = run_python(code, str(tmp_path / "patched"), str(tmp_path / "day2" / "export"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "equal" in done.stdout


def test_a_dynamic_id_continuation_sends_its_maps_changes_and_patches_bit_for_bit(tmp_path):
    """With --dynamic_ids the tables are keyed by raw id: day 2 goes on from day 1's maps,
    and its delta carries the maps' admissions and evictions (the map variables' changed
    entries) with the rows; day 1's export patched by it answers 10^4 requests as day 2's."""
    from conftest import run_module, run_python
    from loops.model_dir import export_deltas

    common = (
        *("--model=rating", "--dynamic_ids", "--id_capacity=16", "--id_admit_after=1"),
        *("--placed_tables", "--table_optimizer=adagrad", "--validation_fraction=0"),
        "--global_batch_size=16",
    )
    days = {day: day_log(tmp_path / f"day{day}.csv", first) for day, first in ((1, 0), (2, 5))}
    first = run_module(
        "loops.bin.recommender", *common, f"--data={days[1]}", f"--model_dir={tmp_path / 'day1'}",
        "--train_steps=6",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_module(
        "loops.bin.recommender", *common, f"--data={days[2]}", f"--model_dir={tmp_path / 'day2'}",
        "--train_steps=12", f"--continue_from={tmp_path / 'day1'}", "--export_deltas",
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    (delta,) = export_deltas.delta_paths([str(tmp_path / "day2" / "deltas")])
    sent = export_deltas.read_delta(delta)["variables"]
    maps = {key for key in sent if "/map_" in key}
    # Each map's row of every id (admitted or evicted) and its scores are among what it sends.
    assert any("/map_row_id/" in key for key in maps), sorted(sent)
    assert any("/map_counters/" in key for key in maps), sorted(sent)
    applied = run_module(
        "loops.cli.apply_deltas",
        f"--export={tmp_path / 'day1' / 'export'}",
        f"--deltas={tmp_path / 'day2' / 'deltas'}",
        f"--output={tmp_path / 'patched'}",
    )
    assert applied.returncode == 0, applied.stderr[-2000:]
    code = """
import sys, numpy as np, tensorflow as tf
rng = np.random.default_rng(3)
users = tf.constant([f"u{u}" for u in rng.integers(0, 30, 10_000)])
items = tf.constant(2**35 + 11 * rng.integers(0, 16, 10_000))
def answers(path):
    model = tf.saved_model.load(path)
    top = model.signatures["serving_default"](users=users)
    pairs = model.signatures["score_pairs"](users=users, items=items)
    return [v.numpy().tobytes() for _, v in sorted({**top, **pairs}.items())]
patched, day2, day1 = map(answers, sys.argv[1:])
assert patched == day2 and patched != day1
assert not [m for m in sys.modules if m.startswith("loops")]
print("equal")
"""
    paths = (tmp_path / "patched", tmp_path / "day2" / "export", tmp_path / "day1" / "export")
    done = run_python(code, *map(str, paths))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "equal" in done.stdout
