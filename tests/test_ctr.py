"""The click-through kind: its AUC equals scikit-learn's, each model builder trains to the same
numbers on 1, 2 and 4 replicas (empty bags, a replica left empty), a short run nears the planted
truth's AUC, and a bad feature description is refused naming the column."""

import os
import re
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score

import loops
from conftest import ROOT, run_python
from loops import keras_private
from loops.kinds.library.ranking_metrics import auc
from loops_data import ctr_data
from loops_models import ctr

# 19 rows in batches of 8: the third holds 3, so one replica of 4 holds none.
ROWS, BATCH = 19, 8
COLUMNS = ["I1", "I2", "I3", "C1", "C2", "C3", "tags", "history"]
BUILDERS = {
    "wide_and_deep": lambda features, **tables: ctr.wide_and_deep(
        features, embedding_dim=4, hidden_units=(6,), seed=3, **tables
    ),
    "dcn_v2": lambda features, **tables: ctr.dcn_v2(
        features, embedding_dim=4, cross_layers=2, hidden_units=(6,), seed=3, **tables
    ),
    "dlrm": lambda features, **tables: ctr.dlrm(
        features, embedding_dim=4, bottom_units=(5,), top_units=(6,), seed=3, **tables
    ),
}


def small_log():
    log = ctr_data.click_log(ROWS, seed=10, cardinality=6, bag_cardinality=7, longest_bag=3)
    return log.only(COLUMNS)


def ragged_pass(log, batch):
    """The log's rows once in batches, as `ctr_data.one_pass`, each bag a ragged row of its
    ids alone (no padding; an empty bag an empty row)."""
    columns, labels = ctr_data.dataset_rows(log)
    columns = {
        name: tf.RaggedTensor.from_tensor(column, padding=ctr_data.PAD_ID)
        if name in ctr_data.MULTI_HOT
        else column
        for name, column in columns.items()
    }
    return tf.data.Dataset.from_tensor_slices((columns, labels)).batch(batch)


def build_trainer(builder, strategy, tables=None, ragged=False, **arguments):
    """A CTRLoop of `builder`'s model on the small log; `tables`: the builder's
    table_optimizer_fn (placed `loops.EmbeddingTable`s), None: keras Embeddings; `ragged`:
    the bags as ragged rows."""
    log = small_log()
    features = ctr.CTRFeatures(**log.description())
    batches = ragged_pass if ragged else ctr_data.one_pass
    return loops.Trainer(
        loops.CTRLoop(
            model_fn=lambda: BUILDERS[builder](features, table_optimizer_fn=tables),
            optimizer_fn=lambda: keras.optimizers.Adam(0.05),
            **arguments,
        ),
        strategy=strategy,
        train_data=lambda: batches(log, BATCH),
        eval_data=lambda: batches(log, 5),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )


def test_the_small_log_has_empty_bags_in_every_batch_and_both_labels():
    log = small_log()
    for column in ("tags", "history"):
        empty = np.all(log.columns[column] == ctr.PAD_ID, axis=1)
        assert [bool(empty[start : start + BATCH].any()) for start in (0, 8, 16)] == [True] * 3
    assert 0 < log.labels.sum() < ROWS


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_each_builder_trains_equally_on_1_2_and_4_replicas_with_empty_bags(builder):
    runs = loops.testing.assert_replica_parity(
        lambda strategy: build_trainer(builder, strategy), num_steps=3
    )
    losses = runs[1]["logs"]["loss"]
    assert np.all(np.isfinite(losses)) and len(losses) == 3
    # The first step's loss is the mean log loss of the first batch under the initial model.
    log = small_log()
    fresh = build_trainer(builder, loops.testing.replica_strategy(1)).definition
    logits = fresh.logits({name: column[:BATCH] for name, column in log.columns.items()})
    logits, labels = np.float64(logits.numpy()), log.labels[:BATCH]
    expected = np.mean(np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-abs(logits))))
    np.testing.assert_allclose(losses[0], expected, rtol=1e-5)
    evaluation = runs[4]["eval"]
    assert evaluation["examples"] == ROWS
    np.testing.assert_allclose(evaluation["positive_rate"], small_log().labels.mean(), rtol=1e-6)
    scores = build_eval_scores(builder)
    np.testing.assert_allclose(evaluation["auc"], roc_auc_score(scores[:, 1], scores[:, 0]),
                               atol=1e-6)  # fmt: skip


def test_dlrm_tables_trained_by_adagrad_are_sparse_and_equal_on_1_and_4_replicas():
    def with_adagrad(strategy):
        adagrad = lambda: keras.optimizers.Adagrad(0.5)  # noqa: E731
        return build_trainer("dlrm", strategy, table_optimizer_fn=adagrad)

    definition = with_adagrad(loops.testing.replica_strategy(1)).definition
    assert definition.update.tables.sparse  # the bags' tables too: Adagrad's exact row update
    assert sorted(table.name for table in keras_private.embedding_layers(definition.model)) == [
        "C1_embedding", "C2_embedding", "C3_embedding", "history_embedding_table",
        "tags_embedding_table",
    ]  # fmt: skip
    runs = loops.testing.assert_replica_parity(with_adagrad, num_steps=3, replica_counts=(1, 4))
    assert runs[4]["eval"]["examples"] == ROWS


@pytest.mark.parametrize(
    "name, kind, rate",
    [
        ("same", keras.optimizers.Adam, 0.05),
        ("rowwise_adagrad", loops.RowwiseAdagrad, 0.25),
        ("adagrad", keras.optimizers.Adagrad, 0.25),
        ("sgd", keras.optimizers.SGD, 0.25),
    ],
)
def test_the_binarys_table_optimizer_setting_trains_the_tables_by_the_optimizer_it_names(
    name, kind, rate
):
    from loops.bin import training_settings

    values = {"table_optimizer": name, "table_learning_rate": 0.25}
    table_optimizer_fn = training_settings.table_optimizer_fn(values, learning_rate=0.01)
    assert (table_optimizer_fn is None) == (name == "same")
    trainer = build_trainer(
        "dlrm", loops.testing.replica_strategy(1), table_optimizer_fn=table_optimizer_fn
    )
    tables = trainer.definition.update.tables
    assert type(tables.table_optimizer) is kind
    learning_rate = keras.ops.convert_to_numpy(tables.table_optimizer.learning_rate)
    assert float(learning_rate) == np.float32(rate)
    # The tables' own optimizers update the rows a step looks up alone; Adam's is dense.
    assert tables.sparse is (name != "same")
    layer = trainer.definition.model.get_layer("C3_embedding")
    before = layer.embeddings.numpy()
    trainer.train(3)
    after = layer.embeddings.numpy()
    seen = np.unique(small_log().columns["C3"])
    assert seen.tolist() == [0, 1, 2, 4, 5]  # row 3 is never looked up
    assert np.array_equal(before[3], after[3])
    assert np.all(np.abs(after[seen] - before[seen]).max(axis=1) > 1e-4)


def test_placed_tables_split_over_replicas_train_equally_on_1_2_and_4_replicas():
    def placed(strategy):
        tables = lambda: loops.RowwiseAdagrad(0.5)  # noqa: E731
        return build_trainer("wide_and_deep", strategy, tables=tables)

    runs = loops.testing.assert_replica_parity(placed, num_steps=3, replica_counts=(1, 2, 4))
    assert runs[4]["eval"]["examples"] == ROWS
    model = placed(loops.testing.replica_strategy(4)).definition.model
    layers = keras_private.nested_layers(model, include_self=False)
    tables = [layer for layer in layers if isinstance(layer, loops.EmbeddingTable)]
    # Each categorical column and bag twice: wide & deep's wide and deep sides.
    assert len(tables) == 10 and not keras_private.embedding_layers(model)
    for table in tables:
        assert table.split_over_replicas and len(table.shards) == 4, table.name
        assert sum(int(shard.shape[0]) for shard in table.shards) == table.rows


def test_ragged_bags_train_as_padded_ones_on_1_2_and_4_replicas():
    ragged = loops.testing.assert_replica_parity(
        lambda strategy: build_trainer("dlrm", strategy, ragged=True), num_steps=3
    )
    padded = loops.testing.train_run(
        lambda strategy: build_trainer("dlrm", strategy),
        loops.testing.replica_strategy(1),
        num_steps=3,
    )
    # The same numbers as the bags padded with -1 (an empty bag an empty ragged row; the
    # third batch's 3 rows leave one replica of 4 empty).
    for part in ("logs", "weights", "eval"):
        loops.testing.assert_close(ragged[1][part], padded[part], rtol=1e-6, label=part)
    assert ragged[4]["eval"]["examples"] == ROWS
    batch = next(iter(ragged_pass(small_log(), BATCH)))[0]
    assert isinstance(batch["tags"], tf.RaggedTensor) and min(batch["tags"].row_lengths()) == 0


def build_eval_scores(builder):
    """One replica's last eval (logit, label) pairs after the same 3 steps."""
    trainer = build_trainer(builder, loops.testing.replica_strategy(1))
    trainer.train(3)
    return trainer.definition.last_eval_scores


def test_auc_equals_scikit_learn_with_ties():
    generator = np.random.default_rng(5)
    scores = np.round(generator.normal(size=500), 1)  # many ties
    labels = (generator.random(500) < 1 / (1 + np.exp(-scores))).astype(np.float32)
    assert abs(auc(scores, labels) - roc_auc_score(labels, scores)) <= 1e-6
    log = ctr_data.click_log(3000, seed=1)
    assert abs(log.planted_auc() - roc_auc_score(log.labels, log.truth_logits)) <= 1e-6


def test_an_empty_bag_pools_to_zeros_and_its_gradient_touches_only_looked_up_rows():
    layer = ctr.BagPooling(5, 3, "mean", keras.initializers.RandomNormal(seed=1))
    ids = tf.constant([[1, 3, -1], [-1, -1, -1], [3, -1, -1]])
    with tf.GradientTape() as tape:
        pooled = layer(ids)
        loss = tf.reduce_sum(pooled)
    table = layer.table.embeddings.numpy()
    np.testing.assert_allclose(pooled.numpy()[0], (table[1] + table[3]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(pooled.numpy()[1], np.zeros(3))
    gradient = tape.gradient(loss, layer.table.embeddings)
    assert isinstance(gradient, tf.IndexedSlices)
    assert sorted(gradient.indices.numpy().tolist()) == [1, 3, 3]
    summed = layer.__class__(5, 3, "sum", keras.initializers.RandomNormal(seed=1))
    np.testing.assert_allclose(summed(ids).numpy()[0], table[1] + table[3], rtol=1e-6)


@pytest.mark.parametrize(
    ("arguments", "sentence"),
    [
        (dict(categorical={"C1": 0}),
         "Column 'C1' has cardinality 0; give it a whole number >= 1 (its ids are "
         "0..cardinality - 1)."),
        (dict(multi_hot={"tags": 2.5}),
         "Column 'tags' has cardinality 2.5; give it a whole number >= 1 (its ids are "
         "0..cardinality - 1)."),
        (dict(multi_hot={"tags": (4, "max")}),
         "Multi-hot column 'tags' pools by 'max'; pool by one of ('mean', 'sum')."),
        (dict(numeric=["I1"], categorical={"I1": 3}),
         "Column 'I1' is named twice (numeric and categorical); give each column one kind."),
        (dict(), "The feature description has no column; name at least one column."),
    ],
)  # fmt: skip
def test_a_bad_feature_description_is_refused_naming_the_column(arguments, sentence):
    with pytest.raises(ValueError) as raised:
        ctr.CTRFeatures(**arguments)
    assert str(raised.value) == sentence


def test_an_evaluation_of_more_examples_than_the_auc_keeps_is_refused_with_the_fix():
    trainer = build_trainer("wide_and_deep", loops.testing.replica_strategy(1), auc_examples=10)
    with pytest.raises(ValueError) as raised:
        trainer.evaluate()
    assert str(raised.value) == (
        "The evaluation held 19 examples, more than auc_examples=10 that the exact AUC keeps; "
        "build the CTRLoop with auc_examples >= 19 or evaluate on fewer examples."
    )


def pretend_workers(monkeypatch, workers):
    """The run's placement as CTRLoop's build reads it: `workers` synchronous workers, no
    servers (the Trainer's own placement stays the one process it is)."""
    from loops.kinds import ctr as ctr_kind

    built = ctr_kind.CTRLoop.build

    def build(self):
        real = self.placement
        self.placement = types.SimpleNamespace(num_workers=workers, variables_on_servers=False)
        try:
            built(self)
        finally:
            self.placement = real

    monkeypatch.setattr(ctr_kind.CTRLoop, "build", build)


def test_on_several_workers_every_replica_gathers_every_eval_row_for_the_same_auc(monkeypatch):
    alone = build_trainer("dcn_v2", loops.testing.replica_strategy(1)).evaluate()
    pretend_workers(monkeypatch, 2)
    # Eval batches of 5 over 4 replicas: 2, 1, 1, 1 rows, and 4 rows (one replica empty) last.
    trainer = build_trainer("dcn_v2", loops.testing.replica_strategy(4), eval_batch_size=5)
    gathered = trainer.evaluate()
    assert trainer.definition._rows_over_workers  # the gathering path ran
    assert gathered["examples"] == alone["examples"] == ROWS
    for name, value in alone.items():
        assert gathered[name] == pytest.approx(value, rel=1e-6), name
    assert trainer.definition.last_eval_scores.shape == (ROWS, 2)


def test_several_workers_without_an_eval_batch_size_are_refused_with_the_fix(monkeypatch):
    pretend_workers(monkeypatch, 2)
    with pytest.raises(ValueError) as raised:
        build_trainer("dcn_v2", loops.testing.replica_strategy(2)).evaluate()
    assert str(raised.value) == (
        "CTRLoop's exact AUC needs every eval row on the worker that computes it, and this "
        "run's replicas are on 2 workers; pass eval_batch_size= (the eval data's global batch "
        "size) so each worker gathers every replica's rows, or evaluate on one worker."
    )
    with pytest.raises(ValueError, match="eval_batch_size"):
        loops.CTRLoop(model_fn=None, optimizer_fn=None, eval_batch_size=0)


def test_dlrm_without_numeric_columns_is_refused():
    with pytest.raises(ValueError, match=r"^dlrm's bottom MLP reads the numeric columns"):
        ctr.dlrm(ctr.CTRFeatures(categorical={"C1": 3}))


def test_the_readme_example_comes_near_the_planted_truths_auc():
    """README's click-through block (tests/test_readme.py holds that this test runs it)."""
    with open(os.path.join(ROOT, "README.md")) as readme:
        blocks = re.findall(r"```python\n(.*?)```", readme.read(), flags=re.S)
    (block,) = [block for block in blocks if "loops.CTRLoop(" in block]
    done = run_python(block)
    assert done.returncode == 0, done.stderr[-3000:]
    model_auc, planted, calibration = map(float, done.stdout.strip().splitlines()[-1].split())
    assert planted > 0.85
    assert model_auc >= planted - 0.05, (model_auc, planted)
    assert abs(calibration - 1) < 0.1


def test_two_trainers_on_one_strategy_keep_their_own_global_batch_for_their_tables():
    """The global batch travels with each Trainer's placement to its definition, its Updates
    and the tables its build made: a second Trainer on the same strategy changes none of the
    first's (it was an attribute of the strategy once)."""
    from loops.tables.embedding_tables import tables_in

    strategy = loops.testing.replica_strategy(2)
    trainers = []
    log = small_log()
    features = ctr.CTRFeatures(**log.description())
    for size in (8, 12):
        trainers.append(
            loops.Trainer(
                loops.CTRLoop(
                    model_fn=lambda: BUILDERS["dcn_v2"](
                        features, table_optimizer_fn=lambda: keras.optimizers.Adagrad(0.1)
                    ),
                    optimizer_fn=lambda: keras.optimizers.Adam(0.05),
                ),
                strategy=strategy,
                train_data=lambda: ctr_data.one_pass(log, BATCH),
                global_batch_size=size,
                progress=loops.testing.quiet_progress(),
            )
        )
    for trainer, size in zip(trainers, (8, 12)):
        definition = trainer.definition
        assert definition.placement is trainer.placement
        assert trainer.placement.global_batch_size == size
        assert trainer.placement.examples_per_replica == size // 2
        assert definition.update_context.placement is trainer.placement
        tables = tables_in(definition.model)
        assert tables and all(table._placement is trainer.placement for table in tables)
