"""`loops.WarmStart.continuation`: a run that goes on from another run's checkpoint on the
next day's rows, its vocabulary grown by the day's new ids, ends where one run over both
days in order ends (1e-6), on one replica and on two; a model that is not the checkpoint's
is refused; the lineage goes into results.json, one entry a run."""

import numpy as np
import pytest
from test_warm_start import BATCH, rating_trainer, table_rows

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
    first = rating_trainer(
        strategy,
        DAY1_USERS,
        DAY1_ITEMS,
        model_dir=str(tmp_path / "day1"),
        rows=indexed(DAY1, DAY1_USERS, DAY1_ITEMS),
    )
    first.train(DAY1_STEPS)
    first.save_checkpoint()
    users = np.concatenate([DAY1_USERS, NEW_USERS])
    items = np.concatenate([DAY1_ITEMS, NEW_ITEMS])
    ids = {"user_table": (DAY1_USERS, users), "user_bias": (DAY1_USERS, users)}
    ids.update(item_table=(DAY1_ITEMS, items), item_bias=(DAY1_ITEMS, items))
    second = rating_trainer(
        strategy,
        users,
        items,
        model_dir=str(tmp_path / "day2"),
        rows=indexed(DAY2, users, items),
        warm_start=loops.WarmStart.continuation(str(tmp_path / "day1"), row_ids=ids),
    )
    assert int(second.global_step.numpy()) == DAY1_STEPS
    loss = second.train(DAY1_STEPS + DAY2_STEPS)["loss"]
    rows, dense, losses = concatenated
    got = by_raw_id(table_rows(second), users, items)
    assert sorted(got) == sorted(rows)
    for key, value in got.items():
        np.testing.assert_allclose(value, rows[key], rtol=1e-6, atol=1e-6, err_msg=str(key))
    for weight, expected in zip(second.definition.model.weights, dense, strict=True):
        np.testing.assert_allclose(weight.numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(loss, losses[DAY1_STEPS:], rtol=1e-6, atol=1e-6)
    report = second.warm_start_report
    assert report["continues"] is True and report["step"] == DAY1_STEPS
    assert report["remapped"]["user_table"] == {
        "variables": report["remapped"]["user_table"]["variables"],
        "rows": 8,
        "kept": 6,
        "new": 2,
        "dropped": 0,
    }
    assert report["lineage"] == [{"checkpoint": report["checkpoint"], "step": DAY1_STEPS}]
    # Only the learning rates are this run's own: the step, both optimizers' counts and
    # slots, the dense weights and every table came from day 1.
    assert report["left"] and all(name.endswith("_learning_rate") for name in report["left"])
    assert "global_step" in report["taken"]


def test_a_third_day_carries_the_lineage_of_both_runs_before(tmp_path):
    strategy = loops.testing.replica_strategy(1)
    days = []
    for day in range(3):
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
