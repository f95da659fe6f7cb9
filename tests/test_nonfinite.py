"""A NaN on one replica only is seen by all: the update is skipped or the run stops."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import make_trainer


def batches_with_nan_in_step_2():
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(24, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=(24,))
    # Row 6 of the second global batch of 8: replica 1 of 2 holds it.
    images[8 + 6, 3, 3, 0] = np.nan
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)


def make_loop(on_nonfinite, model_dir=None, **kwargs):
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(2),
        train_data=batches_with_nan_in_step_2(),
        steps_per_loop=4,
        on_nonfinite=on_nonfinite,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def test_skip_leaves_weights_and_optimizer_untouched_by_the_bad_step():
    loop = make_loop("skip")
    loop.train(1)
    after_first = loops.testing.loop_weights(loop)
    logs = loop.train(2)
    after_bad = loops.testing.loop_weights(loop)
    # The NaN reaches the gradients on every kernel; the loss it reaches only where
    # the ReLU keeps it (oneDNN's fused ReLU turns it into 0), so only the flag is asserted.
    assert logs["nonfinite"].tolist() == [1.0]
    for key, value in after_first.items():
        if key != "global_step":
            np.testing.assert_array_equal(after_bad[key], value, err_msg=key)
    logs = loop.train(4)
    assert logs["nonfinite"].tolist() == [0.0, 0.0]
    assert loop.state.skipped_steps == 1
    assert all(np.all(np.isfinite(w)) for w in loops.testing.loop_weights(loop).values())
    assert loop.write_results()["skipped_steps"] == 1


def test_stop_names_the_step_saves_nothing_after_it_and_goes_back_to_the_checkpoint(tmp_path):
    loop = make_loop("stop", model_dir=str(tmp_path), checkpoint_every=1)
    with pytest.raises(
        loops.definition.loop.NonFiniteError,
        match="Step 2: the loss or the gradients .* back at its last checkpoint \\(step 1\\)",
    ):
        loop.train(4)
    assert loop.state.step == 1
    # Training again reads the stream from the checkpoint's position: the same bad batch.
    with pytest.raises(
        loops.definition.loop.NonFiniteError, match="Step 2: .* back at its last checkpoint"
    ):
        loop.train(4)
    assert loop.state.step == 1
    kept = sorted(
        os.path.basename(p)
        for p in tf.train.get_checkpoint_state(
            str(tmp_path / "checkpoints")
        ).all_model_checkpoint_paths
    )
    assert kept == ["ckpt-1"]
    restored = make_loop("stop", model_dir=str(tmp_path))
    assert restored.state.step == 1
    weights = loops.testing.loop_weights(restored)
    assert all(np.all(np.isfinite(w)) for w in weights.values())
    loops.testing.assert_close(
        weights,
        {**loops.testing.loop_weights(loop), "global_step": 1},
        rtol=0,
        label="restored vs stopped",
    )


def test_unknown_policy_is_named():
    with pytest.raises(
        ValueError,
        match="on_nonfinite must be one of \\('stop', 'skip', 'recover'\\), got 'ignore'",
    ):
        make_loop("ignore")


def test_stop_applies_updates_without_waiting_for_the_check():
    # Under "stop" nothing waits for the finiteness check (10-20% of a small step):
    # the bad update reaches the weights, and with no checkpoint to go back to
    # the error says so.
    loop = make_loop("stop")
    assert not loop.step_context.update.nonfinite.skips
    with pytest.raises(
        loops.definition.loop.NonFiniteError,
        match="Step 2: .* no checkpoint to go back to: the weights in memory are not finite",
    ):
        loop.train(4)
    assert loop.state.step == 2
    assert loop.state.skipped_steps == 0
    assert not all(np.all(np.isfinite(w)) for w in loops.testing.loop_weights(loop).values())
    # Training again is refused: the weights are not finite, whether or not the
    # next steps' kernels would show it (oneDNN's fused ReLU turns a NaN into 0).
    with pytest.raises(
        loops.definition.loop.NonFiniteError,
        match="At step 2 the weights were not finite .* cannot train on",
    ):
        loop.train(4)
    assert loop.state.step == 2
