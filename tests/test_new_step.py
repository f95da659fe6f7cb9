"""A new kind of step, written here on the public API only, gets the whole outer loop for free.

WeightedRegression is the whole of what a researcher writes: what it builds,
its replica loss, and its typed outputs. The tests show that it then has
1-vs-N replica parity, progress lines, TensorBoard summaries, checkpoints and
exact resume, the non-finite policy, gradient accumulation and mixed
precision, without writing any of them.
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import make_trainer, read_results


class WeightedRegression(loops.Loop):
    """Least squares where each example counts by its weight: sum(w * e^2) / sum(w) globally."""

    def build(self):
        self.model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(
                    4,
                    activation="tanh",
                    kernel_initializer=keras.initializers.GlorotUniform(seed=1),
                ),
                keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
            ]
        )
        self.optimizer = keras.optimizers.Adam(0.05)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=10.0)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def _replica_loss(self, x, y, w):
        weight_sum = loops.global_count(tf.reduce_sum(w))  # over ALL replicas
        # In float32 whatever the model computes in (mixed precision).
        error = tf.squeeze(tf.cast(self.model(x, training=True), tf.float32), -1) - y
        return tf.math.divide_no_nan(tf.reduce_sum(w * error**2), weight_sum), {
            "weight": tf.reduce_sum(w)
        }

    def train_step(self, iterator):
        result = self.update(self._replica_loss, args=next(iterator))
        return {
            "loss": loops.Mean(result.sums["loss"], weight=result.sums["weight"]),
            "weight": loops.Sum(result.sums["weight"]),
            **result.outputs,
        }

    def eval_step(self, batch):
        def replica_sums(x, y, w):
            error = tf.squeeze(tf.cast(self.model(x), tf.float32), -1) - y
            return {"loss": tf.reduce_sum(w * error**2), "weight": tf.reduce_sum(w)}

        sums = loops.sum_over_replicas(self.strategy, self.strategy.run(replica_sums, args=batch))
        return {"loss": loops.Ratio(sums["loss"], sums["weight"])}


class BranchingRegression(WeightedRegression):
    """The same step with Python control flow on tensors in its loss and its step, as a
    researcher may write them: AutoGraph converts a user's step and loss, though it calls
    loops' own functions between them as written (`tf_private.leave_unconverted_by_autograph`)."""

    def _replica_loss(self, x, y, w):
        weight_sum = loops.global_count(tf.reduce_sum(w))
        error = tf.squeeze(tf.cast(self.model(x, training=True), tf.float32), -1) - y
        loss = tf.math.divide_no_nan(tf.reduce_sum(w * error**2), weight_sum)
        if tf.reduce_min(w) < 0.0:  # never taken: the weights are >= 0
            loss = 2.0 * loss
        return loss, {"weight": tf.reduce_sum(w)}

    def train_step(self, iterator):
        result = self.update(self._replica_loss, args=next(iterator))
        passes = tf.constant(0.0)
        for _ in tf.range(3):
            passes += 1.0
        return {
            "loss": loops.Mean(result.sums["loss"], weight=result.sums["weight"]),
            "weight": loops.Sum(result.sums["weight"]),
            "passes": loops.Sum(passes),
            **result.outputs,
        }


def data(poison_row=None):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32) + 0.1).astype(np.float32)
    w = rng.uniform(0.0, 2.0, size=40).astype(np.float32)
    if poison_row is not None:
        x[poison_row, 0] = np.nan
    # Batches of 12: the fourth is a partial batch of 4 rows.
    return lambda: tf.data.Dataset.from_tensor_slices((x, y, w)).batch(12)


def build(strategy, **args):
    return make_trainer(
        WeightedRegression,
        strategy=strategy,
        train_data=data(),
        eval_data=data(),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **args,
    )


def test_replica_parity_on_weighted_partial_batches():
    runs = loops.testing.assert_replica_parity(build, num_steps=8, replica_counts=(1, 2, 4))
    assert runs[1]["logs"]["loss"][-1] < 0.75 * runs[1]["logs"]["loss"][0]  # it learns
    assert runs[4]["eval"]["loss"] < runs[1]["logs"]["loss"][0]


def test_a_users_step_and_loss_keep_their_python_control_flow_on_tensors():
    reference = loops.testing.train_run(build, loops.testing.replica_strategy(1), num_steps=4)
    for replicas in (1, 2):
        branching = loops.testing.train_run(
            lambda strategy: make_trainer(
                BranchingRegression,
                strategy=strategy,
                train_data=data(),
                eval_data=data(),
                steps_per_loop=3,
                progress=loops.testing.quiet_progress(),
            ),
            loops.testing.replica_strategy(replicas),
            num_steps=4,
        )
        assert list(branching["logs"]["passes"]) == [3.0] * 4
        loops.testing.assert_runs_agree(
            branching,
            reference,
            rtol=1e-6,
            label=f"branching on {replicas} replicas vs plain on 1",
            compare_logs=["loss", "weight"],
        )


def test_progress_summaries_checkpoints_and_exact_resume(tmp_path):
    uninterrupted = build(loops.testing.replica_strategy(2))
    uninterrupted.train(8)
    model_dir = str(tmp_path / "run")
    first = build(loops.testing.replica_strategy(2), model_dir=model_dir, checkpoint_every=3)
    first.train(5)
    first.close()
    saved = os.listdir(os.path.join(model_dir, "checkpoints"))
    assert "ckpt-3.index" in saved and "ckpt-5.index" in saved
    resumed = build(loops.testing.replica_strategy(2), model_dir=model_dir, checkpoint_every=3)
    assert resumed.state.step == 5
    resumed.train(8)
    resumed.close()
    loops.testing.assert_close(
        loops.testing.loop_weights(resumed),
        loops.testing.loop_weights(uninterrupted),
        rtol=1e-6,
        label="resumed vs uninterrupted",
    )
    progress = resumed.run_context.progress.stream.getvalue()
    assert "restored" in progress and "step 8/8 | loss" in progress
    results = read_results(model_dir)
    assert results["global_step"] == 8 and results["eval"]["loss"] < 2.0
    assert glob.glob(os.path.join(model_dir, "summaries", "train", "events.*"))


def test_gradient_accumulation_on_weighted_partial_batches():
    # Batches of 12 and 4 rows, cut into 3 micro-batches per replica: weighted
    # micro-batches of 2, 1 and 0 rows. Each is weighted by its own sum of w.
    whole = loops.testing.train_run(build, loops.testing.replica_strategy(1), num_steps=8)
    for replicas, grad_accum_steps in [(1, 3), (2, 3), (4, 2)]:
        run = loops.testing.train_run(
            lambda strategy, k=grad_accum_steps: build(strategy, grad_accum_steps=k),
            loops.testing.replica_strategy(replicas),
            num_steps=8,
        )
        loops.testing.assert_runs_agree(
            run, whole, rtol=1e-5, label=f"{replicas} replicas x {grad_accum_steps} vs 1 x 1"
        )
    # 8 steps of batches of 12, 12, 12, 4 rows: two epochs, each weight twice.
    epoch_weight = sum(float(np.sum(w)) for _, _, w in data()().as_numpy_iterator())
    np.testing.assert_allclose(np.sum(whole["logs"]["weight"]), 2 * epoch_weight, rtol=1e-5)


def test_mixed_float16_gets_a_loss_scale_the_step_does_not_write():
    loop = build(loops.testing.replica_strategy(2), mixed_precision="mixed_float16")
    logs = loop.train(8)
    assert loop.definition.model.layers[0].compute_dtype == "float16"
    assert loop.definition.model.layers[0].kernel.dtype == "float32"
    scales, overflows = logs["loss_scale"].tolist(), logs["overflow"].tolist()
    assert scales[0] == 2.0**15
    # Each overflow is skipped and halves the next step's scale; nothing else moves it.
    for step in range(1, 8):
        assert scales[step] == scales[step - 1] / (2 if overflows[step - 1] else 1), scales
    assert logs["nonfinite"].tolist() == [0] * 8 and loop.state.skipped_steps == 0
    assert np.all(np.isfinite(logs["loss"])) and logs["loss"][-1] < logs["loss"][0]


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_a_nan_on_one_replica_follows_the_policy(policy, tmp_path):
    loop = loops.Trainer(
        WeightedRegression(),
        strategy=loops.testing.replica_strategy(2),
        train_data=data(poison_row=12 + 7),
        steps_per_loop=4,
        on_nonfinite=policy,
        model_dir=str(tmp_path),
        checkpoint_every=1,
        progress=loops.testing.quiet_progress(),
    )
    if policy == "stop":
        with pytest.raises(loops.NonFiniteError, match="Step 2: .* back at its last checkpoint"):
            loop.train(4)
        assert loop.state.step == 1
    else:
        logs = loop.train(4)
        assert logs["nonfinite"].tolist() == [0, 1, 0, 0] and loop.state.skipped_steps == 1
    assert all(np.all(np.isfinite(v)) for v in loops.testing.loop_weights(loop).values())
    loop.close()
