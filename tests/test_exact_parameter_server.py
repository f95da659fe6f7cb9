"""The parameter-server modes: exact (the numbers of one process, resumable mid-stream) and
async (each batch scheduled once, resumed at the first batch not yet scheduled)."""

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import types

import keras
import numpy as np
import ps_exact_run
import pytest
import tensorflow as tf
import test_sparse_tables as sparse_tables

import loops
from conftest import ROOT, SUBPROCESS_ENV, slice_update_context, tiny_batches
from loops.placement import Placement
from loops.run.parameter_servers import exact_parameter_server
from loops.vocabulary import settings

NOISE = re.compile(
    r"remove function remotely|GRPC error information|Error received from peer|"
    r"could happen if the remote target|register function remotely"
)


def run_exact(tmp_path, workers, servers, steps):
    """tests/ps_exact_run.py's report; it asserts the parity itself (AssertionError)."""
    script = os.path.join(ROOT, "tests", "ps_exact_run.py")
    arguments = [str(workers), str(servers), str(steps), str(tmp_path / "model")]
    try:
        completed = subprocess.run(
            [sys.executable, script, *arguments],
            capture_output=True,
            text=True,
            env=SUBPROCESS_ENV,
            timeout=600,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as error:
        # The stages it reached (its "ps_exact_run: ..." lines) say where it hung.
        said = error.stderr or b""  # bytes, text=True notwithstanding
        said = said.decode(errors="replace") if isinstance(said, bytes) else said
        raise AssertionError(f"{script} timed out:\n{said[-6000:]}") from None
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    # TensorFlow logs every function it cannot remove from a lost task: left out.
    said = [line for line in completed.stderr.splitlines() if not NOISE.search(line)]
    assert lines, f"exit code {completed.returncode}:\n" + "\n".join(said[-80:])
    return json.loads(lines[0].removeprefix("RESULT "))


def test_two_workers_and_two_servers_are_exact_resumable_and_survive_a_lost_worker(
    tmp_path,
):
    report = run_exact(tmp_path, workers=2, servers=2, steps=7)
    print("ps_exact_run: " + json.dumps(report))
    model_dir = str(tmp_path / "model")
    # 21 examples in batches of 8: steps 3 and 6 read the partial batch of 5, split [3, 2].
    assert report["num_examples"] == [8, 8, 5, 8, 8, 5, 8]
    assert report["1 replica"] <= 1e-5 and report["2 mirrored"] <= 1e-5
    assert report["loss"][-1] < report["loss"][1]
    # Stopped after step 4 and resumed by a new Trainer: the uninterrupted run's weights.
    assert report["restored_step"] == 4
    assert report["resumed"] <= 1e-5
    # SIGUSR1 to the chief during step 2: saved at the next boundary, stopped as preempted;
    # the rerun restores step 4 and ends with the uninterrupted weights.
    assert report["sigusr1"]["preempted"] is True
    assert report["sigusr1"]["stopped_at"] == report["sigusr1"]["restored_step"] == 4
    assert report["sigusr1"]["difference"] <= 1e-5
    # 2 mirrored replicas saved step 4; the cluster restored it and trained on, exactly.
    assert report["reshaped_restored_step"] == 4
    assert report["reshaped"] <= 1e-5
    # A new run going on from step 4's checkpoint on the rest of the stream as its own data
    # (`loops.WarmStart.continuation`): the uninterrupted weights; only the rate its own.
    continued = report["continued"]
    assert continued["from_step"] == 4 and continued["difference"] <= 1e-5
    assert all(name.endswith("_learning_rate") for name in continued["left"])
    assert continued["evaluated_at_start"]["step"] == 4
    assert continued["evaluated_at_start"]["num_examples"] == 21
    # worker_1 killed right after step 4's closures were scheduled: its closure ran again on
    # worker_0 (by TensorFlow when it failed, by the chief when its result was lost with
    # it), which only computes, so the weights are the same.
    killed = report["worker_killed"]
    assert killed["difference"] <= 1e-6
    assert killed["mode"] == "exact" and killed["scheduled_closures"] == 2 * 7
    assert killed["recomputed_closures"] in (0, 1)
    # With worker_1 gone, the asynchronous mode trains on: each batch of the stream scheduled
    # once, in order, on worker_0.
    assert report["async_after_lost_worker"] == [8, 8, 5, 8, 8, 5, 8]
    lost = report["async_after_lost_worker_counts"]
    assert lost["scheduled_steps"] == 7 and lost["step_runs"] == 7 + lost["retried_steps"]
    # A step that read an inf: recovered as one replica recovers, to its weights.
    assert report["recoveries"] == [
        {"step": 2, "restored_step": 0, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    assert report["recovered"] <= 1e-5
    # ps_1 killed mid-run (last: the cluster is then lost): a bounded stop with the sentence.
    killed = report["server_killed"]
    assert killed["error"] == "ClusterTaskLostError"
    assert killed["seconds"] < 60
    assert re.match(
        r"chief_0 lost ps_1 at 127\.0\.0\.1:\d+: it stopped answering .* every step up to "
        r"the last checkpoint is saved\. Start every task again with the same command once its "
        r"host is reachable, and the run continues from that checkpoint\.",
        killed["message"],
    ), killed["message"]
    # ps_1 started again and the killed run's Trainer built anew (the same command), here
    # with worker_0 alone (worker_1 was killed above: 1 worker + 2 servers): it continues
    # from its checkpoint of step 2 to the uninterrupted run's weights.
    assert report["server_rerun"]["restored_step"] == 2
    assert report["server_rerun"]["difference"] <= 1e-5
    # Restarted on another shape, 1 worker and 3 servers: the classifier saved at step 4 by
    # 2 workers and 2 servers, and the table model saved at step 3 (its rows and their
    # Adagrad slot split [10, 10], now [7, 7, 6]), end with the uninterrupted weights.
    assert report["table_shard_rows"] == [10, 10] and report["table_1 replica"] <= 1e-5
    other = report["other_shape"]
    assert other["classifier_restored_step"] == 4 and other["classifier"] <= 1e-5
    assert other["table_restored_step"] == 3 and other["table_shard_rows"] == [7, 7, 6]
    assert other["table"] <= 1e-5
    continued_on_mirrored_replicas(model_dir, continued["evaluated_at_start"])
    # The asynchronous mode reads the same stream in order, each batch scheduled once, and a
    # resume after step 4 goes on with the batches of positions 4, 5, 6 (8, 5, 8 examples).
    assert report["async_first_num_examples"] == [8, 8, 5, 8]
    assert report["async_resumed_num_examples"] == [8, 5, 8]
    assert report["async_counts"] == {
        "mode": "async",
        "scheduled_steps": 3,
        "step_runs": 3,
        "retried_steps": 0,
    }


def continued_on_mirrored_replicas(model_dir, evaluated_at_start):
    """The cluster's runs continue in this process: the classifier saved at step 4 on 2
    mirrored replicas, to the uninterrupted weights (and evaluated there first, as the
    cluster's continuation evaluated it as it started: `evaluated_at_start`); the table
    model saved at step 3 on 2 mirrored replicas (the table split over them) and on one
    replica, each to its own."""
    with open(model_dir + "_uninterrupted.pickle", "rb") as file:
        uninterrupted = pickle.load(file)
    classifier = ps_exact_run.build(
        loops.testing.replica_strategy(2), model_dir=model_dir + "_at_4_mirrored"
    )
    assert int(classifier.global_step.numpy()) == 4
    figures = classifier.evaluate()
    assert sorted(figures) == sorted(set(evaluated_at_start) - {"step"})
    for name, value in figures.items():
        assert value == pytest.approx(evaluated_at_start[name], rel=1e-5, abs=1e-6), name
    classifier.train(7)
    loops.testing.assert_close(
        loops.testing.loop_weights(classifier),
        uninterrupted["classifier"],
        rtol=1e-5,
        label="classifier: 2 workers and 2 servers, then 2 mirrored replicas",
    )
    table_dir = model_dir + "_table_at_3_mirrored"
    split_dir = table_dir + "_split"
    shutil.copytree(table_dir, split_dir)  # each continuation resumes from step 3
    split = ps_exact_run.build_table(loops.testing.replica_strategy(2), model_dir=split_dir)
    assert int(split.global_step.numpy()) == 3
    assert [shard.shape[0] for shard in split.definition.table.shards] == [10, 10]
    split.train(ps_exact_run.TABLE_STEPS)
    loops.testing.assert_close(
        ps_exact_run.table_weights(split),
        uninterrupted["table"],
        rtol=1e-5,
        label="table: 2 workers and 2 servers, then split over 2 mirrored replicas",
    )
    table = ps_exact_run.build_table(loops.testing.replica_strategy(1), model_dir=table_dir)
    assert int(table.global_step.numpy()) == 3
    table.train(ps_exact_run.TABLE_STEPS)
    loops.testing.assert_close(
        ps_exact_run.table_weights(table),
        uninterrupted["table"],
        rtol=1e-5,
        label="table: 2 workers and 2 servers, then 1 replica",
    )


def test_the_mode_is_a_setting_whose_default_is_exact():
    setting = settings.BY_NAME["parameter_server_mode"]
    assert setting.default == setting.flag_default == "exact"
    assert setting.choices == ("exact", "async")
    with pytest.raises(
        ValueError, match="parameter_server_mode must be one of exact, async, got 'sync'"
    ):
        loops.Trainer(loops.Loop(), train_data=tiny_batches(), parameter_server_mode="sync")


def test_only_parameter_server_strategies_are_exact_or_asynchronous():
    strategy = type("ParameterServerStrategyV2", (), {})()
    assert Placement.of(strategy, "exact").exact_parameter_server
    assert not Placement.of(strategy, "exact").steps_out_of_order
    assert Placement.of(strategy, "async").steps_out_of_order
    mirrored = type("MirroredStrategy", (), {})()
    assert not Placement.of(mirrored, "exact").exact_parameter_server
    assert not Placement.of(mirrored, "async").steps_out_of_order


class InProcessCoordinator:
    """Runs each closure `WorkerGradients` schedules at once, in this process: its slices and
    their sum without a cluster (the strategy stands for one of 2 workers)."""

    def __init__(self, strategy):
        strategy._num_workers = 2  # what a ParameterServerStrategy counts when it connects
        self.strategy = strategy

    def schedule(self, function, args):
        value = tf.nest.map_structure(np.asarray, function(*args))
        return types.SimpleNamespace(fetch=lambda: value)


def test_an_embedding_table_is_sent_as_rows_and_trained_by_its_table_optimizer():
    # The table path meets the exact mode: each slice's IndexedSlices gradient leaves as its
    # unique rows (`TableGradients.sent_rows`), and the chief sums them and applies them with
    # table_optimizer (Adagrad's sparse row update), the rest with optimizer (Adam).
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        context = slice_update_context(
            strategy, exact_parameter_server.WorkerGradients(InProcessCoordinator(strategy))
        )
        model = sparse_tables.make_model()
        table, *rest = model.trainable_variables
        optimizer = keras.optimizers.Adam(sparse_tables.RATE, epsilon=1e-3)
        optimizer.build(rest)
        table_optimizer = keras.optimizers.Adagrad(sparse_tables.RATE)
        table_optimizer.build([table])
        update = loops.Update(context, optimizer, model, table_optimizer=table_optimizer)

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        scores = tf.cast(tf.squeeze(model(ids, training=True), -1), tf.float32)
        return loops.scale_to_global_batch((scores - targets) ** 2, count), {}

    steps = list(zip(sparse_tables.IDS, sparse_tables.TARGETS))
    for ids, targets in steps:  # the last batch of 1 leaves the second slice empty
        update(replica_loss, args=(tf.constant(ids, tf.int32), tf.constant(targets)))
    assert update.tables.indices == {0}
    for got, want in zip(
        model.get_weights(), sparse_tables.numpy_adagrad_table_adam_rest(steps), strict=True
    ):
        assert loops.testing.relative_error(got, want) <= 1e-5
    assert int(optimizer.iterations.numpy()) == len(steps)
    assert int(table_optimizer.iterations.numpy()) == len(steps)
    assert context.slice_gradients.scheduled_closures == 2 * len(steps)


def test_a_step_that_writes_a_variable_on_the_workers_is_refused_naming_it():
    # BatchNormalization updates its moving statistics in the forward pass: on the workers
    # that would happen once per slice and again on a retried closure, so it is refused
    # before the first closure is scheduled, naming what the step writes.
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        context = slice_update_context(
            strategy, exact_parameter_server.WorkerGradients(InProcessCoordinator(strategy))
        )
        model = keras.Sequential(
            [keras.Input((3,)), keras.layers.BatchNormalization(), keras.layers.Dense(1)]
        )
        update = loops.Update(context, keras.optimizers.SGD(0.1), model)
    before = [weight.copy() for weight in model.get_weights()]
    features = tf.ones((4, 3))

    def replica_loss(step_features):
        per_example = tf.reduce_sum(model(step_features, training=True), axis=1)
        count = loops.global_count(tf.shape(per_example)[0])
        return loops.scale_to_global_batch(per_example, count), {}

    with pytest.raises(ValueError, match=r"writes .*moving_mean.* in its forward pass") as raised:
        update(replica_loss, (features,))
    assert "--strategy=multi_worker_mirrored" in str(raised.value)
    assert update.context.slice_gradients.scheduled_closures == 0
    for got, want in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)


def dense_update_in_process():
    """(context, update, its loss of features and a scale): a Dense model's loops.Update whose
    slices an InProcessCoordinator computes, on one CPU standing for 2 workers."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        context = slice_update_context(
            strategy, exact_parameter_server.WorkerGradients(InProcessCoordinator(strategy))
        )
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        update = loops.Update(context, keras.optimizers.SGD(0.1), model)

    def replica_loss(features, scale=1):
        per_example = float(scale) * tf.reduce_sum(model(features, training=True), axis=1)
        return loops.scale_to_global_batch(
            per_example, loops.global_count(tf.shape(features)[0])
        ), {}

    return context, update, replica_loss


def test_the_slices_function_is_traced_once_for_every_step_of_one_loss():
    # The Update converts its loss for AutoGraph: a new object at every call, which once made
    # a new function a step, traced again on the workers at every step (10-25x async).
    context, update, replica_loss = dense_update_in_process()
    for step in range(4):
        update(replica_loss, args=(tf.fill((4, 3), float(step)),))
    assert context.slice_gradients.scheduled_closures == 8
    assert context.slice_gradients.slice_traces == 1
    # The chief's sum and apply: one function for the layout, traced once for these shapes.
    assert context.slice_gradients.apply_traces == 1


def test_a_python_value_in_the_slices_args_gets_a_function_of_its_own():
    # A trace holds a Python value of the args as a constant (the GAN's critic index): each
    # value has its own traced slice function, never another value's (kept by shapes alone,
    # the second value's slices once failed to bind).
    context, update, replica_loss = dense_update_in_process()
    losses = [
        float(update(replica_loss, args=(tf.ones((4, 3)), scale)).sums["loss"])
        for scale in (0, 1, 0, 1)
    ]
    assert losses[0] == losses[2] == 0.0 and losses[1] != 0.0
    assert context.slice_gradients.scheduled_closures == 8
    assert context.slice_gradients.slice_traces == 2
