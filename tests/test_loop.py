"""The outer loop: tracing, resume, checkpoints, results and argument errors."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import make_trainer, tiny_batches


def make_loop(strategy=None, model_dir=None, *, steps_per_loop=3, model="mlp", **kwargs):
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.build_classifier(
            model, input_shape=(8, 8, 1), num_classes=10, l2=1e-3, seed=7
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=strategy or loops.testing.replica_strategy(2),
        train_data=tiny_batches(8, 21, shuffle_seed=2),
        eval_data=tiny_batches(8, 21, seed=1),
        steps_per_loop=steps_per_loop,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def test_train_step_traced_once_over_two_epochs_with_partial_batches():
    loop = make_loop(steps_per_loop=2)
    logs = loop.train(7)  # 3 batches an epoch (8, 8, 5): steps 3 and 6 are partial
    np.testing.assert_array_equal(logs["num_examples"], [8, 8, 5, 8, 8, 5, 8])
    assert loop.executor.train_function.experimental_get_tracing_count() == 1
    loop.evaluate()
    assert loop.executor.eval_function.experimental_get_tracing_count() == 1


def test_the_eval_step_is_traced_once_for_its_names_and_every_pass(tmp_path, monkeypatch):
    # A kept-best metric is checked against the eval step's outputs before training (a
    # trace that runs nothing); the evaluations then call that same trace.
    traces, eval_step = [], loops.ClassifierLoop.eval_step

    def counted(self, batch):
        traces.append(1)  # Python runs only while TensorFlow traces
        return eval_step(self, batch)

    monkeypatch.setattr(loops.ClassifierLoop, "eval_step", counted)
    loop = make_loop(
        model_dir=str(tmp_path), keep_best_metric="accuracy", keep_best_mode="max", eval_every=2
    )
    loop.train(4)
    loop.evaluate()
    assert len(traces) == 1
    assert loop.executor.eval_step_function.experimental_get_tracing_count() == 1
    assert loop.executor.eval_function.experimental_get_tracing_count() == 1


def test_train_counts_to_a_total_and_steps_the_global_step():
    loop = make_loop()
    assert loop.train(5)["loss"].shape == (5,)
    assert loop.state.step == 5
    assert loop.train(8)["loss"].shape == (3,)
    assert loop.state.step == 8


def test_resume_matches_an_uninterrupted_run(tmp_path):
    uninterrupted = make_loop()
    uninterrupted.train(8)

    first = make_loop(model_dir=str(tmp_path))
    first.train(4)
    del first
    resumed = make_loop(model_dir=str(tmp_path))
    assert resumed.state.step == 4
    logs = resumed.train(8)
    assert resumed.state.step == 8
    assert logs["loss"].shape == (4,)
    loops.testing.assert_close(
        loops.testing.loop_weights(resumed),
        loops.testing.loop_weights(uninterrupted),
        rtol=1e-6,
        label="resumed vs uninterrupted",
    )


def test_checkpoint_cadence_and_results_file(tmp_path):
    loop = make_loop(model_dir=str(tmp_path), checkpoint_every=2, eval_every=3)
    loop.train(5)
    kept = sorted(
        os.path.basename(p)
        for p in tf.train.get_checkpoint_state(
            str(tmp_path / "checkpoints")
        ).all_model_checkpoint_paths
    )
    assert kept == ["ckpt-2", "ckpt-4", "ckpt-5"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["loop"] == "classifier"
    assert results["strategy"] == "mirrored"
    assert results["num_replicas"] == 2
    assert results["global_step"] == 5
    assert results["eval"]["num_examples"] == 21
    assert 0.0 <= results["eval"]["accuracy"] <= 1.0
    assert results["train"]["loss"] > 0
    assert results["steps_per_second"] > 0
    lines = loop.run_context.progress.stream.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "step 2/5",
        "step 3/5",
        "eval at step 3",
        "step 4/5",
        "step 5/5",
        "eval at step 5",
    ]


def test_summaries_are_written_for_train_and_eval(tmp_path):
    make_loop(model_dir=str(tmp_path)).train(3)
    for name in ("train", "eval"):
        events = tf.io.gfile.glob(str(tmp_path / "summaries" / name / "events.*"))
        assert len(events) == 1, name
        tags = {
            value.tag
            for event in tf.compat.v1.train.summary_iterator(events[0])
            for value in event.summary.value
        }
        assert "loss" in tags and "accuracy" in tags


def test_checkpoint_of_another_model_is_refused_and_kept(tmp_path):
    make_loop(model_dir=str(tmp_path)).train(2)
    before = sorted(os.listdir(tmp_path / "checkpoints"))
    with pytest.raises(ValueError, match="does not match this loop.*new directory"):
        make_loop(model_dir=str(tmp_path), model="cnn")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == before


def test_run_eagerly_gives_the_graph_numbers():
    graph = make_loop(loops.testing.replica_strategy(1)).train(4)
    eager = make_loop(loops.testing.replica_strategy(1), run_eagerly=True).train(4)
    np.testing.assert_allclose(eager["loss"], graph["loss"], rtol=1e-5)


@pytest.mark.parametrize(
    "argument, value, message",
    [
        ("steps_per_loop", 0, "steps_per_loop must be a whole number >= 1, got 0"),
        (
            "eval_every",
            -5,
            "eval_every must be a whole number >= 1 .or None to turn it off., got -5",
        ),
        ("checkpoint_every", 2.5, "checkpoint_every must be a whole number >= 1"),
    ],
)
def test_bad_loop_arguments_name_the_value(argument, value, message):
    with pytest.raises(ValueError, match=message):
        make_loop(**{argument: value})


def test_model_dir_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        make_loop(model_dir=str(path))
    assert path.read_text() == "mine"


def test_keras_loss_with_a_reduction_is_refused():
    with pytest.raises(ValueError, match="reduction=None"):
        make_loop(loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def test_step_outputs_must_be_reduced_scalars():
    class Unreduced(loops.ClassifierLoop):
        def train_step(self, iterator):
            inputs, labels = next(iterator)
            per_example = self.strategy.run(
                lambda x: tf.reduce_sum(tf.cast(x, tf.float32), [1, 2, 3]), args=(inputs,)
            )
            return {"loss": loops.Mean(per_example)}

    loop = loops.Trainer(
        Unreduced(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10),
            optimizer_fn=lambda: keras.optimizers.SGD(0.1),
        ),
        strategy=loops.testing.replica_strategy(1),
        train_data=tiny_batches(),
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(TypeError, match="every value must be a scalar"):
        loop.train(1)


def test_gradient_clipping_bounds_the_update():
    strategy = loops.testing.replica_strategy(2)
    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=1),
            optimizer_fn=lambda: keras.optimizers.SGD(1.0),
            clip_norm=1e-3,
        ),
        strategy=strategy,
        train_data=tiny_batches(),
        progress=loops.testing.quiet_progress(),
    )
    before = [v.numpy() for v in loop.definition.model.trainable_variables]
    loop.train(1)
    after = [v.numpy() for v in loop.definition.model.trainable_variables]
    update_norm = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(after, before)))
    assert update_norm == pytest.approx(1e-3, rel=1e-4)


def test_a_loop_that_makes_its_own_data_needs_no_dataset():
    class Counting(loops.Loop):
        needs_train_data = False

        def build(self):
            self.total = tf.Variable(0.0, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        def checkpoint_items(self):
            return {"total": self.total}

        def train_step(self, iterator):
            assert iterator is None
            step = tf.cast(self.global_step, tf.float32)
            per_replica = self.strategy.run(
                lambda: (
                    tf.cast(
                        tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32
                    )
                    + step
                )
            )
            value = loops.sum_over_replicas(self.strategy, {"value": per_replica})["value"]
            self.total.assign_add(value)
            return {"value": loops.Mean(value)}

    loop = loops.Trainer(
        Counting(),
        strategy=loops.testing.replica_strategy(2),
        progress=loops.testing.quiet_progress(),
    )
    logs = loop.train(3)
    # Replica ids 0 + 1, plus the step index once per replica.
    np.testing.assert_array_equal(logs["value"], [1.0, 3.0, 5.0])
    assert loop.definition.total.numpy() == 9.0


class TwoBatchesDeclaredOneTaken(loops.ClassifierLoop):
    batches_per_step = 2


class OneBatchDeclaredTwoTaken(loops.ClassifierLoop):
    def train_step(self, iterator):
        next(iterator)
        return super().train_step(iterator)


@pytest.mark.parametrize(
    "loop_class, message",
    [
        (TwoBatchesDeclaredOneTaken, "took 1 batches but batches_per_step = 2"),
        (OneBatchDeclaredTwoTaken, "more than batches_per_step = 1 times"),
    ],
)
def test_a_step_must_take_exactly_batches_per_step_batches(loop_class, message):
    loop = make_trainer(
        loop_class,
        strategy=loops.testing.replica_strategy(1),
        model_fn=lambda: models.build_classifier("mlp", input_shape=(8, 8, 1), num_classes=10),
        optimizer_fn=lambda: keras.optimizers.SGD(0.1),
        train_data=tiny_batches(8, 21),
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(ValueError, match=message):
        loop.train(2)
    assert loop.state.step == 0


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_logs_of_every_dtype_come_back_step_by_step(num_replicas):
    # The inner loop keeps one TensorArray per dtype and runs its last step
    # after the tf.range loop: loops of 3, 3 and 1 steps cover both paths.
    class Summing(loops.Loop):
        def build(self):
            self.total = tf.Variable(
                0, dtype=tf.int64, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
            )

        def checkpoint_items(self):
            return {"total": self.total}

        def train_step(self, iterator):
            rows = self.strategy.run(tf.reduce_sum, args=(next(iterator),))
            value = self.strategy.reduce(tf.distribute.ReduceOp.SUM, rows, axis=None)
            self.total.assign_add(value)
            return {
                "value": loops.Sum(value),
                "total": loops.Last(self.total.read_value()),
                "half": loops.Mean(tf.cast(value, tf.float32) / 2),
                "step": loops.Last(tf.cast(self.global_step, tf.float64)),
            }

    loop = loops.Trainer(
        Summing(),
        strategy=loops.testing.replica_strategy(num_replicas),
        train_data=lambda: tf.data.Dataset.range(10).batch(4),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )
    logs = loop.train(7)
    values = [6, 22, 17, 6, 22, 17, 6]  # batches [0..3], [4..7], [8, 9], repeated
    assert logs["value"].dtype == np.int64 and logs["value"].tolist() == values
    assert logs["total"].tolist() == np.cumsum(values).tolist()
    assert logs["half"].dtype == np.float32 and logs["half"].tolist() == [v / 2 for v in values]
    assert logs["step"].dtype == np.float64 and logs["step"].tolist() == list(range(7))
    assert loop.state.step == 7 and int(loop.definition.total.numpy()) == 96
