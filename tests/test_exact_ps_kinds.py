"""Every kind that can trains under --strategy=parameter_server: the recommenders, the LM, the
GAN and the click-through models (their tables split over the servers) exactly (one cluster of
2 workers + 2 servers, tests/ps_kinds_run.py); RL, and the GAN in the asynchronous mode, say
why not, with the fix."""

import json
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import ROOT, SUBPROCESS_ENV, slice_update_context, tiny_batches
from loops.kinds import rl
from loops.kinds.library import retrieval_loss
from loops.placement import Placement
from loops.run.execution import loop_execution
from loops.run.parameter_servers import exact_parameter_server
from loops_data import cartpole

# Only the strategy's class name decides; a real one would connect to a cluster.
PARAMETER_SERVER = type("ParameterServerStrategyV2", (), {})()


def test_the_recommenders_lm_gan_and_ctr_train_exactly_on_two_workers_and_two_servers(
    tmp_path,
):
    completed = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "ps_kinds_run.py"), "2", "2", "3"],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=400,
        cwd=tmp_path,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit code {completed.returncode}:\n{completed.stderr[-6000:]}"
    report = json.loads(lines[0].removeprefix("RESULT "))
    # 21 rows in batches of 8: step 3 reads the partial batch of 5, split [3, 2] by the
    # workers (rating, LM) or computed whole by one worker (retrieval's in-batch softmax).
    assert report["rating"]["counted"] == [8, 8, 5]
    assert report["retrieval"]["counted"] == [8, 8, 5]
    assert report["lm"]["counted"] == [25, 24, 18]  # real tokens predicted
    # Two batches a step (n_critic=2): 8+8, 5+8, 8+5 real examples.
    assert report["gan"]["counted"] == [16, 13, 13]
    # The recommenders' tables and every click-through table (wide & deep, DCN-v2, DLRM over
    # numeric, categorical and multi-hot columns): loops.EmbeddingTables in 2 blocks, one
    # a server; the evaluation (the exact AUC among it) compared to 1e-5 by the runner.
    for kind in ("rating", "retrieval", "ctr wide_and_deep", "ctr dcn_v2", "ctr dlrm"):
        assert report[kind]["table_shards"] == [2], (kind, report[kind])
    # DCN-v2 on 3 streamed Parquet shards: full batches of 8 shuffled from windows of 2
    # blocks, its test rows evaluated in a pass whose last batch is partial.
    assert report["ctr streamed"]["counted"] == [8, 8, 8]
    assert report["ctr streamed"]["table_shards"] == [2]
    assert 0 < report["ctr streamed"]["eval"]["examples"] % 8
    # The rating model over 4 loops.DynamicTables of 4 rows: the chief decides each step's
    # admissions from the whole batch before the workers compute their slices, and every
    # map (ids, rows, counts, counters: 13 arrays a table) equals 1 replica's and 2 mirrored
    # replicas' to the last bit (asserted by the runner); rows are evicted and refused.
    dynamic = report["rating dynamic"]
    assert dynamic["counted"] == [8, 8, 5] and dynamic["map_keys"] == 52
    assert dynamic["ids"]["ids_resident"][-1] == 16
    assert dynamic["ids"]["ids_evicted"][-1] > 0 and dynamic["ids"]["ids_refused"][-1] > 0
    # Stopped after step 2 and continued on the cluster, from its own checkpoint and from one
    # that 2 mirrored replicas saved: step 3 evicts, and the maps equal the uninterrupted
    # run's to the last bit (asserted by the runner), the weights to 1e-5.
    evicted = dynamic["ids"]["ids_evicted"]
    assert evicted[2] > evicted[1], evicted
    for saved_by in ("servers", "mirrored"):
        resumed = dynamic["resumed"][saved_by]
        assert resumed["restored_step"] == 2 and resumed["difference"] <= 1e-5, resumed
    # The rating model on 3 streamed Parquet shards of interactions: full batches of 8.
    assert report["rating streamed"]["counted"] == [8, 8, 8]
    assert report["rating streamed"]["table_shards"] == [2]
    for kind in ("ctr wide_and_deep", "ctr dcn_v2", "ctr dlrm"):
        assert report[kind]["counted"] == [8, 8, 5]
        assert report[kind]["eval"]["examples"] == 21 and 0 < report[kind]["eval"]["auc"] < 1
    for kind, found in report.items():
        # The runner asserted every weight, log and eval metric to 1e-5 itself; these are
        # the largest relative differences it found.
        assert found["1 replica"] <= 1e-5, (kind, found)
        # (The GAN's 1 and 2 mirrored replicas agree in tests/test_gan.py.)
        assert kind == "gan" or found["2 mirrored"] <= 1e-5, (kind, found)
        assert np.all(np.isfinite(found["loss"])), (kind, found)
    for kind in ("rating", "retrieval", "lm"):
        # The asynchronous mode trains them too (not reproducible: only its counts).
        assert report[kind]["async_counted"] == report[kind]["counted"], kind
        assert np.all(np.isfinite(report[kind]["async_loss"])), kind
    assert "async_counted" not in report["gan"]


class OneProcessWorkers:
    """A coordinator that runs each closure `WorkerGradients` schedules at once, in this
    process, and counts the rows of each: the exact mode without a cluster (2 workers)."""

    def __init__(self, strategy):
        strategy._num_workers = 2  # what a ParameterServerStrategy counts when it connects
        self.strategy = strategy
        self.slice_rows = []

    def schedule(self, function, args):
        self.slice_rows.append(int(tf.shape(tf.nest.flatten(args[0])[0])[0]))
        value = tf.nest.map_structure(np.asarray, function(*args))
        return types.SimpleNamespace(fetch=lambda: value)


def contrastive_update(slice_gradients):
    """An Update of an in-batch softmax (`whole_batch_loss=True`) on a fixed linear tower."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        context = slice_update_context(strategy, slice_gradients(strategy))
        tower = keras.layers.Dense(3, use_bias=False)
        tower.build((None, 4))
        tower.kernel.assign(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3))
        optimizer = keras.optimizers.SGD(0.5)
        optimizer.build(tower.trainable_variables)
        update = loops.Update(
            context, optimizer, lambda: tower.trainable_variables, whole_batch_loss=True
        )

    def replica_loss(users, items):
        count = loops.global_count(tf.shape(users)[0])
        losses = retrieval_loss.in_batch_softmax(
            tower(users), tower(items), tf.range(tf.shape(items)[0]), global_batch_size=5
        )
        return loops.scale_to_global_batch(losses, count), {}

    return update, tower, replica_loss


def test_a_whole_batch_loss_is_computed_whole_by_one_worker():
    rng = np.random.default_rng(0)
    steps = [(rng.normal(size=(rows, 4)), rng.normal(size=(rows, 4))) for rows in (5, 5, 3)]
    kernels, losses, coordinators = [], [], []

    def workers(strategy):
        coordinators.append(OneProcessWorkers(strategy))
        return exact_parameter_server.WorkerGradients(coordinators[-1])

    for slice_gradients in (lambda strategy: None, workers):
        update, tower, replica_loss = contrastive_update(slice_gradients)
        batches = [tuple(tf.constant(part, tf.float32) for part in step) for step in steps]
        losses.append([float(update(replica_loss, args=batch).sums["loss"]) for batch in batches])
        kernels.append(tower.kernel.numpy())
    # One closure a step, holding all its rows: every row's negatives are the whole batch's.
    assert coordinators[0].slice_rows == [5, 5, 3]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
    assert loops.testing.relative_error(kernels[1], kernels[0]) <= 1e-6
    assert losses[0][1] < losses[0][0]


@pytest.mark.parametrize("mode", ["exact", "async"])
def test_the_recommenders_and_the_lm_are_accepted_in_both_modes_the_gan_in_exact(mode):
    servers = type("ParameterServerStrategyV2", (), {})()
    for kind in (loops.RatingLoop, loops.RetrievalLoop, loops.LanguageModelLoop):
        loop_execution.check_can_place(kind, Placement.of(servers, mode))
    loop_execution.check_can_place(loops.GANLoop, Placement.of(servers, "exact"))


def gan():
    return loops.GANLoop(
        generator_fn=lambda: None,
        discriminator_fn=lambda: None,
        generator_optimizer_fn=lambda: None,
        discriminator_optimizer_fn=lambda: None,
    )


def dqn():
    return rl.DQNLoop(environment=cartpole.CartPole(), model_fn=lambda: None)


GAN_REASON = (
    "GANLoop does not train under ParameterServerStrategy with parameter_server_mode='async' "
    "(a GAN step is n_critic critic updates and then a generator update, each reading the "
    "weights the one before it wrote: on asynchronous workers other steps' updates land "
    "between them). Use --parameter_server_mode=exact (the default), or "
    "--strategy=multi_worker_mirrored or mirrored."
)
RL_REASON = (
    "DQNLoop does not train under ParameterServerStrategy{mode}(an RL loop makes its own "
    "data: each step moves its environments, whose state every replica holds and writes in "
    "the step, and a parameter-server worker's part of a step cannot write it (exact mode: "
    "it only computes gradients; async mode: each worker would step the environments on "
    "its own)). Use --strategy=multi_worker_mirrored or mirrored."
)


@pytest.mark.parametrize(
    "make, train_data, mode, reason",
    [
        (gan, tiny_batches(), "async", GAN_REASON),
        (dqn, None, "exact", RL_REASON.format(mode=" ")),
        (dqn, None, "async", RL_REASON.format(mode=" with parameter_server_mode='async' ")),
    ],
    ids=["gan-async", "rl-exact", "rl-async"],
)
def test_the_gan_async_and_rl_say_why_not_and_the_fix_before_any_work(
    make, train_data, mode, reason
):
    with pytest.raises(ValueError) as raised:
        loops.Trainer(
            make(),
            strategy=PARAMETER_SERVER,
            train_data=train_data,
            parameter_server_mode=mode,
        )
    assert str(raised.value) == reason
