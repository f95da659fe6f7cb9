"""The recommenders over dynamic tables (`loops-recommender --dynamic_ids`): with room for every
id they equal static tables started by id (`--rows_by_id`), with less they admit and evict
alike on 1 and 2 replicas, and the binary reports each table's counters and refuses a
dynamic table without a row rule before any work."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import read_results, run_module
from loops.tables import id_rows
from loops.tables.embedding_tables import tables_in
from loops_data import recommender_training
from loops_models import recommender

NUM_USERS, NUM_ITEMS, BATCH = 9, 12, 8
# Raw ids as a log holds them: whole numbers of any size for the users, strings for the items.
USER_IDS = np.array([5, 2**40, -3, 77, 1_000_003, 8, 12, 2**33 + 1, 40], np.int64)
ITEM_IDS = np.array([f"item-{index * 7}" for index in range(NUM_ITEMS)])
rng = np.random.default_rng(4)
USERS = rng.integers(0, NUM_USERS, 40).astype(np.int32)
ITEMS = rng.integers(0, NUM_ITEMS, 40).astype(np.int32)
RATINGS = rng.uniform(1.0, 5.0, 40).astype(np.float32)


def rating_trainer(strategy, dynamic=None):
    """A rating model whose four tables train by Adagrad rows: static tables started by id,
    or with `dynamic` (capacity, admit_after) dynamic tables over the raw ids."""
    definition = loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=NUM_USERS,
            num_items=NUM_ITEMS,
            embedding_dim=4,
            hidden_units=(6,),
            l2=0.01,
            seed=3,
            table_optimizer_fn=lambda: keras.optimizers.Adagrad(0.2),
            user_ids=USER_IDS,
            item_ids=ITEM_IDS,
            dynamic=dynamic,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=NUM_ITEMS,
    )
    rows = (USERS, ITEMS, RATINGS)
    return loops.Trainer(
        definition,
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices(rows).repeat().batch(BATCH),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices(rows).batch(5),
        global_batch_size=BATCH,  # bounds the ids a replica exchanges (the last batch is short)
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )


def pair_scores(trainer):
    return trainer.definition.score_pairs(tf.constant(USERS), tf.constant(ITEMS)).numpy()


def test_with_room_for_every_id_dynamic_tables_equal_static_tables_started_by_id():
    # On one replica; the dynamic tables' replica parity is the next test's.
    runs = {}
    for kind, dynamic in (("static", None), ("dynamic", {"capacity": 0, "admit_after": 1})):
        trainer = rating_trainer(loops.testing.replica_strategy(1), dynamic)
        logs = trainer.train(10)
        runs[kind] = (logs["loss"], pair_scores(trainer), trainer.state.last_eval_metrics)
    (static_loss, static_scores, static_eval), (loss, scores, evaluated) = runs.values()
    np.testing.assert_allclose(loss, static_loss, rtol=0, atol=1e-6)
    np.testing.assert_allclose(scores, static_scores, rtol=0, atol=1e-6)
    assert abs(evaluated["rmse"] - static_eval["rmse"]) <= 1e-6
    assert static_loss[-1] < static_loss[0]  # it trains


def test_a_static_table_started_by_id_holds_each_ids_dynamic_start_on_any_split():
    numbers = id_rows.row_id_numbers(ITEM_IDS)
    for replicas in (1, 2):
        with loops.testing.replica_strategy(replicas).scope():
            table = loops.EmbeddingTable(NUM_ITEMS, 5, initial_ids=ITEM_IDS, seed=9)
            table.build()
        expected = loops.initial_rows(9, tf.constant(numbers), 5).numpy()
        np.testing.assert_array_equal(table.whole().numpy(), expected)
    # A string id hashes as a dynamic table of strings keys it.
    dynamic = loops.DynamicTable(4, 2, keras.optimizers.SGD(0.1), ids="strings")
    np.testing.assert_array_equal(dynamic.id_numbers(tf.constant(ITEM_IDS)).numpy(), numbers)
    with pytest.raises(ValueError, match=r"rows=3, initial_ids=\.\.\.\) got 12 ids"):
        loops.EmbeddingTable(3, 5, initial_ids=ITEM_IDS)
    with pytest.raises(ValueError, match="whole numbers or strings"):
        loops.EmbeddingTable(2, 5, initial_ids=[0.5, 1.5])


def test_dynamic_tables_smaller_than_the_log_evict_alike_on_1_and_2_replicas():
    # 4 replicas: tests/test_dynamic_tables.py, table by table.
    runs, trainers = {}, {}
    for replicas in (1, 2):
        trainer = rating_trainer(
            loops.testing.replica_strategy(replicas), {"capacity": 5, "admit_after": 1}
        )
        logs = trainer.train(6)
        runs[replicas] = {
            "logs": logs,
            "weights": loops.testing.loop_weights(trainer),
            "eval": trainer.state.last_eval_metrics,
        }
        trainers[replicas] = trainer
    loops.testing.assert_runs_agree(runs[2], runs[1], rtol=1e-6, label="2 vs 1 replicas")
    logs = runs[1]["logs"]
    # Two user and two item tables of 5 rows each, all full; nine users and twelve items
    # compete for them, so rows were evicted, and a batch of more distinct ids than rows
    # has ids refused (every row was seen in that step), counted.
    assert int(logs["ids_resident"][-1]) == 20
    assert int(logs["ids_evicted"][-1]) > 0 and int(logs["ids_refused"][-1]) > 0
    for table in tables_in(trainers[2].definition.model):
        counters = table.counters()
        assert counters["resident"] == 5 and counters["step"] == 6
        assert counters["admissions"] - counters["evictions"] == counters["resident"]


def test_the_binary_refuses_dynamic_ids_without_a_row_rule_or_on_servers_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="--table_optimizer=adagrad, rowwise_adagrad or sgd"):
        recommender_training.check_dynamic_ids({"dynamic_ids": True}, "same")
    recommender_training.check_dynamic_ids({"dynamic_ids": False}, "same")
    with pytest.raises(ValueError, match="cannot train under --parameter_server_mode=async"):
        recommender_training.check_dynamic_ids(
            {"dynamic_ids": True}, "adagrad", "parameter_server", 1, "async"
        )
    # The exact parameter-server mode trains them (tests/ps_kinds_run.py "rating dynamic").
    recommender_training.check_dynamic_ids({"dynamic_ids": True}, "adagrad", "parameter_server")
    with pytest.raises(ValueError, match="--strategy=central_storage"):
        recommender_training.check_dynamic_ids({"dynamic_ids": True}, "sgd", "central_storage", 2)
    recommender_training.check_dynamic_ids({"dynamic_ids": True}, "sgd", "multi_worker_mirrored")
    done = run_module(
        "loops.bin.recommender", "--dynamic_ids", f"--model_dir={tmp_path}", "--train_steps=5"
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "--dynamic_ids makes each user and item table a loops.DynamicTable" in done.stderr
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("model", ["retrieval", "rating"])
def test_the_binary_with_dynamic_ids_reports_each_tables_admissions_and_evictions(tmp_path, model):
    done = run_module(
        "loops.bin.recommender",
        f"--model={model}",
        "--dynamic_ids",
        "--id_capacity=200",
        "--id_admit_after=2",
        "--table_optimizer=adagrad",
        "--table_learning_rate=0.1",
        f"--model_dir={tmp_path}",
        "--train_steps=30",
        "--eval_every=30",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    tables = {table["name"]: table["dynamic"] for table in results["tables"]}
    expected = {"retrieval": {"user_tower_table", "item_tower_table"}}.get(
        model, {"user_table", "item_table", "user_bias", "item_bias"}
    )
    assert set(tables) == expected
    for counters in tables.values():
        # The generated log's 3,000 users and 1,500 items compete for 200 rows a table.
        assert counters["capacity"] == 200 and counters["admit_after"] == 2
        assert counters["resident"] == 200 and counters["evictions"] > 0
        assert counters["admissions"] - counters["evictions"] - counters["expirations"] == 200
        assert counters["step"] == 30
    train = results["train"]  # the step outputs: sums over the tables
    assert train["ids_resident"] == 200 * len(expected)
    assert train["ids_evicted"] == sum(counters["evictions"] for counters in tables.values())


def test_the_binary_takes_rows_by_id_and_starts_each_row_from_its_raw_id(tmp_path):
    from test_recommender import small_log

    from conftest import checkpoint_weights
    from loops.input import interaction_logs

    log = small_log(tmp_path / "log.csv")
    done = run_module(
        "loops.bin.recommender",
        *("--model=rating", f"--data={log}", "--rows_by_id", "--placed_tables"),
        # A rate too small to move a row: the checkpoint holds the rows as they started.
        *("--table_optimizer=sgd", "--table_learning_rate=1e-30", "--validation_fraction=0"),
        *(f"--model_dir={tmp_path / 'run'}", "--train_steps=2", "--global_batch_size=16"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_results(str(tmp_path / "run"))["config"]["rows_by_id"] is True
    users = interaction_logs.read_interactions(str(log)).user_ids  # the rows' order
    (key,) = [
        name
        for name, array in checkpoint_weights(str(tmp_path / "run")).items()
        # The user table: the one table of a row a user (20 users, 15 items), 32 wide.
        if "embeddings" in name and array.shape == (len(users), 32)
    ]
    expected = loops.initial_rows(0, tf.constant(id_rows.row_id_numbers(users)), 32).numpy()
    np.testing.assert_array_equal(checkpoint_weights(str(tmp_path / "run"))[key], expected)
