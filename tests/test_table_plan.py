"""`loops.TablePlan`: a model's plain keras.layers.Embedding placed by the strategy when the
Trainer is given a plan: split over 2 and 4 replicas, trained to the numbers of the plain
layer on one replica, a small one kept replicated by the stated rule, in results.json, one
checkpoint across replica counts, and refused where it cannot place a table."""

import json
import os
import re
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops import keras_private
from loops.tables import table_blocks
from loops.tables.table_plan import PlacedEmbedding

BIG, SMALL, DIM, RATE, MIN_ROWS = 40, 6, 3, 0.1, 16
# Four global batches of 4 examples: big-table ids (duplicates within and across examples,
# rows 13, 25 and 38 never looked up), small-table ids and targets.
BIG_IDS = np.array(
    [
        [[0, 9, 9], [17, 3, 39], [21, 21, 21], [5, 30, 0]],
        [[11, 12, 39], [2, 2, 33], [8, 27, 19], [35, 36, 0]],
        [[1, 4, 6], [7, 10, 14], [15, 16, 18], [20, 22, 23]],
        [[24, 26, 28], [29, 31, 32], [34, 37, 9], [9, 9, 9]],
    ],
    np.int32,
)
SMALL_IDS = np.array([[1, 2, 0, 5], [3, 3, 4, 1], [0, 0, 2, 5], [4, 1, 3, 2]], np.int32)
TARGETS = np.array([[0.5, -1.0, 2.0, 0.0], [1.0, 0.3, -0.7, 0.2], [0.0, 0.4, -0.2, 1.5],
                    [-1.0, 0.8, 0.6, -0.3]], np.float32)  # fmt: skip
UNTOUCHED = [13, 25, 38]


def make_model(seed_rows=None):
    """(big ids, small id) -> [mean of big rows, small row] -> Dense(1), with plain keras
    Embeddings; `seed_rows` sets the big one's initial rows (a plan draws its own)."""
    big_ids = keras.Input((3,), dtype="int32")
    small_id = keras.Input((), dtype="int32")
    big = keras.layers.Embedding(BIG, DIM)
    small = keras.layers.Embedding(SMALL, DIM)
    head = keras.layers.Dense(1)
    features = keras.ops.concatenate([keras.ops.mean(big(big_ids), axis=1), small(small_id)], 1)
    model = keras.Model([big_ids, small_id], head(features))
    if seed_rows is not None:
        big.set_weights([seed_rows])
    rng = np.random.default_rng(3)
    small.set_weights([rng.uniform(-0.05, 0.05, (SMALL, DIM)).astype(np.float32)])
    head.set_weights([rng.normal(size=(2 * DIM, 1)).astype(np.float32), np.zeros(1, np.float32)])
    return model, big, small


class PlannedModel(loops.Loop):
    """A model written with plain Embeddings, trained by one Update (Adagrad everywhere)."""

    supports_parameter_server = True  # its steps are sums over examples

    def __init__(self, *, seed_rows=None, model=None, optimizer="adagrad", **loop_args):
        super().__init__(**loop_args)
        self.seed_rows, self.given_model, self.optimizer_name = seed_rows, model, optimizer

    def build(self):
        made = self.given_model or make_model(self.seed_rows)
        self.model, self.big, self.small = made
        if self.optimizer_name != "adagrad":  # one optimizer: the tables' too
            adam = self.optimizer_name == "adam"
            optimizer = keras.optimizers.Adam if adam else keras.optimizers.Adagrad
            self.optimizer, tables = optimizer(RATE), None
        else:
            self.optimizer = keras.optimizers.Adagrad(RATE)
            tables = keras.optimizers.Adagrad(RATE)
            # A placed table keeps its own slots.
            plain = [
                layer for layer in (self.big, self.small) if type(layer) is keras.layers.Embedding
            ]
            tables.build([layer.embeddings for layer in plain])
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, table_optimizer=tables)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _replica_loss(self, big_ids, small_id, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.squeeze(self.model([big_ids, small_id], training=True), -1)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    def train_step(self, iterator):
        result = self.update(self._replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"])}


def batches():
    return tf.data.Dataset.from_tensor_slices((BIG_IDS, SMALL_IDS, TARGETS))


def run(replicas, steps, plan=None, model_dir=None, **definition_args):
    """A Trainer of PlannedModel on `replicas` replicas, trained to `steps`: (its definition,
    its step losses, its loop weights)."""
    trainer = loops.Trainer(
        PlannedModel(**definition_args),
        strategy=loops.testing.replica_strategy(replicas),
        train_data=batches,
        table_plan=plan,
        model_dir=model_dir,
        steps_per_loop=1,
        progress=loops.testing.quiet_progress(),
    )
    restored = int(trainer.global_step.numpy())
    losses = [
        float(np.ravel(trainer.train(step)["loss"])[-1]) for step in range(restored + 1, steps + 1)
    ]
    weights = loops.testing.loop_weights(trainer)
    trainer.close()
    return trainer.definition, losses, weights


def planned_figures(strategy):
    """PlannedModel trained under a plan on `strategy` (in a cluster's task, every worker
    calls it): its placed table's and accumulator's rows read whole, its shards' rows and
    devices, its step count and its step losses, keyed `plan_*`."""
    trainer = loops.Trainer(
        PlannedModel(),
        strategy=strategy,
        train_data=batches,
        table_plan=loops.TablePlan(min_rows=MIN_ROWS),
        steps_per_loop=1,
        progress=loops.testing.quiet_progress(),
    )
    steps = range(1, len(BIG_IDS) + 1)
    losses = [float(np.ravel(trainer.train(step)["loss"])[-1]) for step in steps]
    table = trainer.definition.big.table
    figures = {
        "plan_table": table.whole().numpy(),
        "plan_accumulator": table.whole("accumulator").numpy(),
        "plan_shard_rows": np.array([shard.shape[0] for shard in table.shards]),
        "plan_devices": np.array([shard.device for shard in table.shards]),
        "plan_iterations": int(table.optimizer.iterations.numpy()),
        "plan_losses": np.array(losses),
    }
    trainer.close()
    return figures


def plan_rows():
    """The placed big table's initial rows: the table's own draw of seed 0."""
    return table_blocks.uniform_rows(0, 0, (BIG, DIM), -0.05, 0.05).numpy()


def test_a_plan_places_the_large_embedding_and_trains_it_as_the_plain_layer_on_any_count():
    plain, plain_losses, _ = run(1, 4, seed_rows=plan_rows())
    plain_rows = plain.big.embeddings.numpy()
    for replicas in (1, 2, 4):
        planned, losses, weights = run(replicas, 4, loops.TablePlan(min_rows=MIN_ROWS))
        assert isinstance(planned.big, PlacedEmbedding)
        assert type(planned.small) is keras.layers.Embedding
        rows = planned.big.table.whole().numpy()
        np.testing.assert_allclose(losses, plain_losses, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(rows, plain_rows, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(rows[UNTOUCHED], plan_rows()[UNTOUCHED])
        np.testing.assert_allclose(
            planned.small.embeddings.numpy(), plain.small.embeddings.numpy(), atol=1e-6
        )
        for got, want in zip(planned.model.layers[-1].get_weights(),
                             plain.model.layers[-1].get_weights()):  # fmt: skip
            np.testing.assert_allclose(got, want, atol=1e-6)
        # The placed table trains with the Update's table optimizer, which counted each step.
        assert planned.big.table.optimizer is planned.update.table_optimizer
        assert int(planned.big.table.optimizer.iterations.numpy()) == 4
        accumulator = [key for key in weights if key.endswith("/accumulator")]
        assert len(accumulator) == 1 and weights[accumulator[0]].shape == (BIG, DIM)


def test_each_replica_holds_only_its_block_and_results_json_says_where_each_table_lives(
    tmp_path,
):
    planned, _, _ = run(4, 1, loops.TablePlan(min_rows=MIN_ROWS), model_dir=str(tmp_path))
    shards = planned.big.table.shards
    assert [tuple(shard.shape) for shard in shards] == [(10, DIM)] * 4
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]
    assert [shard.device for shard in shards] == devices
    with open(os.path.join(tmp_path, "results.json")) as results:
        tables = json.load(results)["tables"]
    assert tables == [
        {"name": planned.big.name, "rows": BIG, "dim": DIM, "optimizer": "Adagrad",
         "split": "replicas", "blocks": [[0, 10], [10, 20], [20, 30], [30, 40]]},
        {"name": planned.small.name, "rows": SMALL, "dim": DIM, "optimizer": None,
         "split": "replicated", "blocks": [[0, SMALL]]},
    ]  # fmt: skip


def test_a_planned_checkpoint_of_4_replicas_resumes_on_one_to_the_uninterrupted_numbers(
    tmp_path,
):
    plan = loops.TablePlan(min_rows=MIN_ROWS, optimizer=lambda: keras.optimizers.Adagrad(RATE))
    one = dict(optimizer="adagrad_alone")  # the plan's optimizer is the placed table's alone
    _, whole_losses, whole_weights = run(1, 4, plan, **one)
    _, first_losses, _ = run(4, 2, plan, model_dir=str(tmp_path), **one)
    _, resumed_losses, resumed = run(1, 4, plan, model_dir=str(tmp_path), **one)
    np.testing.assert_allclose(first_losses + resumed_losses, whole_losses, rtol=1e-6)
    resumed, whole_weights = unnamed(resumed), unnamed(whole_weights)
    assert set(resumed) == set(whole_weights) and len(resumed) == 11
    for key, value in whole_weights.items():
        np.testing.assert_allclose(resumed[key], value, atol=1e-6, err_msg=key)


def unnamed(weights):
    """`weights` keyed without the tables' layer names (each Trainer makes its own layers)."""
    return {re.sub(r"embedding_\d+", "embedding", key): value for key, value in weights.items()}


def test_a_plan_is_refused_where_it_cannot_place_a_table(tmp_path):
    with pytest.raises(ValueError, match=r"min_rows=0\) needs a whole number >= 1"):
        loops.TablePlan(min_rows=0)
    with pytest.raises(ValueError, match="not an optimizer: each table keeps its own slots"):
        loops.TablePlan(optimizer=keras.optimizers.Adagrad())
    plan = loops.TablePlan(min_rows=MIN_ROWS)
    with (
        plan.placing(),
        pytest.raises(ValueError, match="embeddings_initializer.*min_rows above 40"),
    ):
        keras.layers.Embedding(BIG, DIM, embeddings_initializer="zeros")
    planned, _, _ = run(1, 1, plan)
    with pytest.raises(ValueError, match="a .keras or .weights.h5 file would leave its rows out"):
        planned.model.save_weights(os.path.join(tmp_path, "model.weights.h5"))
    with pytest.raises(ValueError, match=r"'embedding\w*' \(40 rows\) was made before"):
        run(1, 1, plan, model=make_model())
    with pytest.raises(ValueError, match="Adam has no exact row update.*TablePlan"):
        run(1, 1, plan, optimizer="adam")


def test_the_plan_is_in_force_inside_its_block_alone_even_when_the_block_fails():
    plan = loops.TablePlan(min_rows=MIN_ROWS)
    with pytest.raises(RuntimeError, match="inside"):
        with plan.placing():
            assert isinstance(keras.layers.Embedding(BIG, DIM), PlacedEmbedding)
            assert type(keras.layers.Embedding(SMALL, DIM)) is keras.layers.Embedding
            by_name = keras.layers.Embedding(input_dim=MIN_ROWS, output_dim=2)
            assert isinstance(by_name, PlacedEmbedding)
            raise RuntimeError("inside")
    assert "__new__" not in vars(keras.layers.Embedding)
    assert type(keras.layers.Embedding(BIG, DIM)) is keras.layers.Embedding
    with pytest.raises(ValueError, match="made by a loops.TablePlan in force"):
        PlacedEmbedding(BIG, DIM)
    # Blocks nest, the innermost choosing; a __new__ that is not loops' own is refused.
    with keras_private.embeddings_made_as(lambda rows: None):
        with plan.placing():
            assert isinstance(keras.layers.Embedding(BIG, DIM), PlacedEmbedding)
        assert type(keras.layers.Embedding(BIG, DIM)) is keras.layers.Embedding
    assert "__new__" not in vars(keras.layers.Embedding)
    keras.layers.Embedding.__new__ = lambda cls, *args, **kwargs: object.__new__(cls)
    try:
        with pytest.raises(RuntimeError, match="already has a __new__ of its own"):
            with plan.placing():
                pass
    finally:
        del keras.layers.Embedding.__new__


def test_a_plan_in_force_in_one_thread_leaves_the_embeddings_of_another_plain():
    """The plan's choice is this thread's: a model another thread makes while a plan is in
    force gets plain Embeddings, and either thread may leave first."""
    plan = loops.TablePlan(min_rows=MIN_ROWS)
    inside, made, leave = threading.Event(), threading.Event(), threading.Event()
    found = {}

    def planned():
        with plan.placing():
            inside.set()
            found["planned"] = type(keras.layers.Embedding(BIG, DIM))
            made.wait(timeout=30)
        leave.set()

    def plain():
        inside.wait(timeout=30)
        found["plain"] = type(keras.layers.Embedding(BIG, DIM))
        made.set()

    threads = [threading.Thread(target=planned), threading.Thread(target=plain)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert leave.is_set()
    assert found == {"planned": PlacedEmbedding, "plain": keras.layers.Embedding}
    assert "__new__" not in vars(keras.layers.Embedding)


def test_a_plans_optimizer_class_and_seed_are_taken_as_documented():
    plan = loops.TablePlan(min_rows=MIN_ROWS, optimizer=keras.optimizers.Adagrad, seed=5)
    with plan.placing():
        first, second = keras.layers.Embedding(BIG, DIM), keras.layers.Embedding(BIG, 2)
        first.build(), second.build()
    assert [first.table.seed, second.table.seed] == [5, 6]
    optimizers = [first.table.optimizer, second.table.optimizer]
    assert all(type(optimizer) is keras.optimizers.Adagrad for optimizer in optimizers)
    assert optimizers[0] is not optimizers[1]  # one a table: each keeps its own slots
    np.testing.assert_array_equal(
        first.table.whole().numpy(), table_blocks.uniform_rows(5, 0, (BIG, DIM), -0.05, 0.05)
    )
    # "update" is the one string an EmbeddingTable takes for its optimizer.
    assert loops.EmbeddingTable(4, 2, "update").slot_names == ()
    with pytest.raises(
        ValueError, match=r"optimizer='adam'\): pass a Keras optimizer, or 'update'"
    ):
        loops.EmbeddingTable(4, 2, "adam")


@pytest.mark.parametrize(
    "replicas, name, expected",
    [
        (1, "mirrored", {"big": "whole", "small": "whole"}),
        (4, "mirrored", {"big": "replicas", "small": "replicated"}),
        (2, "central_storage", {"big": "whole", "small": "replicated"}),
    ],
)
def test_the_plans_split_of_each_table_is_known_before_the_build_and_is_what_it_builds(
    replicas, name, expected
):
    """The split is data: `TablePlan.split_of` answers from the rows and the placement before
    any table is made, and results.json's `tables` (`table_placements`) says the same after."""
    from loops import placement
    from loops.tables.embedding_tables import table_placements

    strategy = loops.testing.replica_strategy(replicas, name)
    where = placement.Placement.of(strategy, placement.EXACT)
    plan = loops.TablePlan(min_rows=MIN_ROWS)
    planned = {"big": plan.split_of(BIG, where), "small": plan.split_of(SMALL, where)}
    assert planned == expected
    with strategy.scope(), plan.placing():
        ids = keras.Input((2,), dtype="int32")
        big = keras.layers.Embedding(BIG, DIM, name="big")(ids)
        small = keras.layers.Embedding(SMALL, DIM, name="small")(ids)
        model = keras.Model(ids, keras.ops.concatenate([big, small], axis=-1))
    built = {table["name"]: table["split"] for table in table_placements({"model": model}, where)}
    assert built == planned
