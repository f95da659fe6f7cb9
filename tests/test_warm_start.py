"""`loops.WarmStart`: a new run takes another run's variables by checkpoint-name patterns, a
table's rows remapped through the two runs' ids (an old id keeps its row and slots bit for bit,
a new id starts as the model built it), on another replica count too; a resume goes on from its
own checkpoint; what cannot be taken is refused before anything changes."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.tables.embedding_tables import tables_in
from loops_models import recommender

BATCH = 8
OLD_USERS = np.array([5, 2**40, -3, 77, 1_000_003, 8], np.int64)
OLD_ITEMS = np.array([f"item-{index * 7}" for index in range(7)])
# The next day's vocabularies: the old ids in another order, two gone, new ones among them.
NEW_USERS = np.array([77, 901, 5, -3, 2**40, 44, 1_000_003], np.int64)
NEW_ITEMS = np.array(["item-42", "item-new", "item-0", "item-14", "item-7", "item-28", "z"])
TABLES = ("user_table", "item_table", "user_bias", "item_bias")


def rating_trainer(
    strategy, users, items, *, model_dir=None, warm_start=None, dynamic=None, rows=None
):
    """A rating model over the raw ids `users` and `items`, tables by Adagrad rows started by
    id, trained on `rows` (user indices, item indices, ratings) in order, else on 40
    generated ratings of those indices."""
    definition = loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=len(users),
            num_items=len(items),
            embedding_dim=4,
            hidden_units=(6,),
            l2=0.01,
            seed=3,
            table_optimizer_fn=lambda: keras.optimizers.Adagrad(0.2),
            user_ids=users,
            item_ids=items,
            dynamic=dynamic,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=len(items),
    )
    if rows is None:
        rng = np.random.default_rng(len(users))
        rows = (
            rng.integers(0, len(users), 40).astype(np.int32),
            rng.integers(0, len(items), 40).astype(np.int32),
            rng.uniform(1.0, 5.0, 40).astype(np.float32),
        )
    return loops.Trainer(
        definition,
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices(rows).repeat().batch(BATCH),
        global_batch_size=BATCH,
        steps_per_loop=3,
        model_dir=model_dir,
        warm_start=warm_start,
        progress=loops.testing.quiet_progress(),
    )


def table_rows(trainer):
    """Each table's rows and slots, whole: {table: {variable: array}}."""
    return {
        table.name: {name: table.whole(name).numpy() for name in ("embeddings", *table.slot_names)}
        for table in tables_in(trainer.definition.model)
    }


def by_id():
    return {
        "user_table": (OLD_USERS, NEW_USERS),
        "user_bias": (OLD_USERS, NEW_USERS),
        "item_table": (OLD_ITEMS, NEW_ITEMS),
        "item_bias": (OLD_ITEMS, NEW_ITEMS),
    }


@pytest.fixture(scope="module")
def yesterday(tmp_path_factory):
    """A run over the old vocabularies, 6 steps on one replica: (its model_dir, its tables,
    its dense weights)."""
    model_dir = str(tmp_path_factory.mktemp("yesterday"))
    trainer = rating_trainer(
        loops.testing.replica_strategy(1), OLD_USERS, OLD_ITEMS, model_dir=model_dir
    )
    trainer.train(6)
    trainer.save_checkpoint()
    dense = [w.numpy() for w in trainer.definition.model.weights]
    return model_dir, table_rows(trainer), dense


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_grown_vocabulary_keeps_each_old_ids_row_and_starts_each_new_id_as_built(
    yesterday, replicas
):
    model_dir, old_rows, old_dense = yesterday
    strategy = loops.testing.replica_strategy(replicas)
    fresh = table_rows(rating_trainer(strategy, NEW_USERS, NEW_ITEMS))
    start = loops.WarmStart(model_dir, variables=["model/.*"], row_ids=by_id())
    trainer = rating_trainer(strategy, NEW_USERS, NEW_ITEMS, warm_start=start)
    rows = table_rows(trainer)
    for table in TABLES:
        old_ids, new_ids = by_id()[table]
        old_index = {value: row for row, value in enumerate(old_ids.tolist())}
        for name, value in rows[table].items():
            for row, raw_id in enumerate(new_ids.tolist()):
                expected = (
                    old_rows[table][name][old_index[raw_id]]
                    if raw_id in old_index
                    else fresh[table][name][row]
                )
                np.testing.assert_array_equal(
                    value[row], expected, err_msg=f"{table} {name} {raw_id}"
                )
    # The dense layers taken whole, bit for bit; the dense optimizer and the step left.
    for weight, old in zip(trainer.definition.model.weights, old_dense, strict=True):
        np.testing.assert_array_equal(weight.numpy(), old)
    assert int(trainer.global_step.numpy()) == 0
    report = trainer.warm_start_report
    assert report["checkpoint"].endswith("ckpt-6")
    assert report["remapped"]["user_table"] == {
        "variables": report["remapped"]["user_table"]["variables"],
        "rows": 7,
        "kept": 5,
        "new": 2,
        "dropped": 1,
    }
    assert report["remapped"]["item_table"]["kept"] == 5
    assert report["remapped"]["item_table"]["dropped"] == 2
    assert len(report["remapped"]["user_table"]["variables"]) == 2  # rows and accumulator
    assert any(name.startswith("optimizer/") for name in report["left"])
    assert "global_step" in report["left"]
    # Two dense layers' kernels and biases, the global bias, each table's rule's step count;
    # its learning rate is this run's.
    assert len(report["taken"]) == 5 + 4
    assert "model/_operations/2/optimizer/_learning_rate" in report["left"]
    assert "model/_operations/12/_kernel" in report["taken"]
    losses = trainer.train(3)["loss"]
    assert np.all(np.isfinite(losses))


def test_a_resumed_warm_start_goes_on_from_its_own_checkpoint_and_keeps_its_report(
    yesterday, tmp_path
):
    source, _, _ = yesterday
    start = loops.WarmStart(source, variables=["model/.*"], row_ids=by_id())
    strategy = loops.testing.replica_strategy(1)
    first = rating_trainer(
        strategy, NEW_USERS, NEW_ITEMS, model_dir=str(tmp_path), warm_start=start
    )
    first.train(3)
    first.save_checkpoint()
    trained = table_rows(first)
    first.write_results()
    first.close()
    again = rating_trainer(
        strategy, NEW_USERS, NEW_ITEMS, model_dir=str(tmp_path), warm_start=start
    )
    assert int(again.global_step.numpy()) == 3
    for table, values in table_rows(again).items():
        for name, value in values.items():
            np.testing.assert_array_equal(value, trained[table][name])
    assert again.warm_start_report == first.warm_start_report
    again.train(6)
    results = again.write_results()
    assert results["warm_start"]["remapped"]["item_table"]["kept"] == 5
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["warm_start"]["checkpoint"] == first.warm_start_report["checkpoint"]


def test_dynamic_tables_of_one_capacity_are_taken_whole(tmp_path):
    dynamic = {"capacity": 5, "admit_after": 1}
    strategy = loops.testing.replica_strategy(1)
    source = rating_trainer(
        strategy, OLD_USERS, OLD_ITEMS, model_dir=str(tmp_path), dynamic=dynamic
    )
    source.train(6)
    source.save_checkpoint()
    saved = table_rows(source)
    counters = {table.name: table.counters() for table in tables_in(source.definition.model)}
    start = loops.WarmStart(str(tmp_path), variables="model/.*")
    trainer = rating_trainer(
        loops.testing.replica_strategy(2), NEW_USERS, NEW_ITEMS, warm_start=start, dynamic=dynamic
    )
    for table in tables_in(trainer.definition.model):
        assert table.counters() == counters[table.name]
        for name, value in saved[table.name].items():
            np.testing.assert_array_equal(table.whole(name).numpy(), value)


def test_what_a_warm_start_cannot_take_is_refused_naming_it_and_the_fix(yesterday):
    model_dir, _, _ = yesterday
    strategy = loops.testing.replica_strategy(1)

    def refused(match, **start):
        with pytest.raises(ValueError, match=match):
            rating_trainer(strategy, NEW_USERS, NEW_ITEMS, warm_start=loops.WarmStart(**start))

    refused(
        r"pattern 'model/dense.\*' matches no variable that both .*ckpt-6 and this model",
        checkpoint=model_dir,
        variables=["model/.*", "model/dense.*"],
    )
    refused(
        r"cannot take 'model/_operations/2/accumulator': .* of shape \[6, 4\], this model of "
        r"shape \[7, 4\]; give row_ids",
        checkpoint=model_dir,
        variables=["model/.*"],
    )
    refused(
        r"names the table 'users', and no table here has that name .*user_table",
        checkpoint=model_dir,
        variables=["model/.*"],
        row_ids={**by_id(), "users": (OLD_USERS, NEW_USERS)},
    )
    refused(
        r"neither a checkpoint .* nor a directory holding one",
        checkpoint=model_dir + "/nothing",
        variables=["model/.*"],
    )
    with pytest.raises(ValueError, match=r"pattern '\(' is no regular expression"):
        loops.WarmStart(model_dir, variables=["("])
    with pytest.raises(ValueError, match="pairs int64 ids with <U"):
        loops.WarmStart(model_dir, variables=".*", row_ids={"t": (OLD_USERS, NEW_ITEMS)})
    with pytest.raises(ValueError, match=r"row_ids\[.t.\]\[0\] holds the id 77 2 times"):
        loops.WarmStart(model_dir, variables=".*", row_ids={"t": ([77, 77], NEW_USERS)})


def day_log(path, first_user):
    """20 users named by strings from u{first_user}, 15 items numbered past 2**31, 6 ratings a
    user: two days of one service, 15 users in both."""
    lines = ["user,item,rating,timestamp"] + [
        f"u{user},{2**35 + 11 * ((3 * user + i) % 15)},{1 + (user + i) % 5},{i}"
        for user in range(first_user, first_user + 20)
        for i in range(6)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loops_recommender_warm_starts_a_new_days_log_keeping_each_old_users_row(tmp_path):
    from conftest import checkpoint_weights, read_results, run_module
    from loops.input import interaction_logs
    from loops.tables import id_rows

    common = (
        *("--model=rating", "--rows_by_id", "--placed_tables", "--table_optimizer=sgd"),
        *("--validation_fraction=0", "--global_batch_size=16"),
    )
    days = {day: day_log(tmp_path / f"day{day}.csv", first) for day, first in ((1, 0), (2, 5))}
    first = run_module(
        "loops.bin.recommender",
        *common,
        f"--data={days[1]}",
        "--table_learning_rate=0.5",
        f"--model_dir={tmp_path / 'day1'}",
        "--train_steps=6",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    # A rate too small to move a row: day 2's checkpoint holds the rows as it started them.
    second = run_module(
        "loops.bin.recommender",
        *common,
        f"--data={days[2]}",
        "--table_learning_rate=1e-30",
        f"--warm_start_from={tmp_path / 'day1'}",
        f"--model_dir={tmp_path / 'day2'}",
        "--train_steps=2",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "warm start from" in second.stdout + second.stderr

    def user_rows(day):
        (rows,) = [
            array
            for name, array in checkpoint_weights(str(tmp_path / f"day{day}")).items()
            if "embeddings" in name and array.shape == (20, 32)  # users; the items are 15
        ]
        return rows

    old, new = user_rows(1), user_rows(2)
    users = {day: interaction_logs.read_interactions(str(days[day])).user_ids for day in days}
    old_row = {user: row for row, user in enumerate(users[1].tolist())}
    fresh = loops.initial_rows(0, tf.constant(id_rows.row_id_numbers(users[2])), 32).numpy()
    for row, user in enumerate(users[2].tolist()):
        expected = old[old_row[user]] if user in old_row else fresh[row]
        np.testing.assert_array_equal(new[row], expected, err_msg=user)
    assert not np.array_equal(old[old_row["u7"]], fresh[list(users[2]).index("u7")])  # trained
    report = read_results(str(tmp_path / "day2"))["warm_start"]
    assert report["remapped"]["user_table"]["kept"] == 15
    assert report["remapped"]["user_table"]["new"] == 5
    assert report["remapped"]["user_table"]["dropped"] == 5
    assert report["remapped"]["item_bias"]["kept"] == 15
    assert report["checkpoint"].endswith("ckpt-6")


def test_loops_recommender_refuses_a_warm_start_it_cannot_take_before_any_work(tmp_path):
    from conftest import run_module

    (tmp_path / "other").mkdir()
    for flags, message in (
        ((f"--warm_start_from={tmp_path / 'none'}",), "is no directory; pass the model_dir"),
        ((f"--warm_start_from={tmp_path}",), "is this run's own --model_dir"),
        ((f"--continue_from={tmp_path / 'none'}",), "is no directory; pass the model_dir"),
        ((f"--continue_from={tmp_path}",), "is this run's own --model_dir"),
        (
            (f"--continue_from={tmp_path / 'other'}", f"--warm_start_from={tmp_path / 'other'}"),
            "are two starts of one run",
        ),
        (
            (f"--continue_from={tmp_path / 'other'}", "--export_deltas"),
            "other/export holds no SavedModel: export that run first",
        ),
    ):
        done = run_module(
            "loops.bin.recommender", *flags, f"--model_dir={tmp_path}", "--train_steps=2"
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert message in done.stderr
        assert not (tmp_path / "checkpoints").exists()
    done = run_module(
        "loops.bin.recommender",
        f"--warm_start_from={tmp_path / 'other'}",
        f"--model_dir={tmp_path / 'run'}",
        "--train_steps=2",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "holds no ids.json" in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
