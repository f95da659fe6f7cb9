"""Mixed precision: 16-bit compute, float32 variables, and a loss scale all replicas agree on."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from test_classifier_binary import run_in_process

import loops
import loops_models as models
from conftest import make_trainer, read_results, run_module, tiny_batches
from loops.core.mixed_precision import DynamicLossScale
from loops.model_dir.classifier_export import export_classifier

INITIAL_SCALE = 2.0**15


def batches_with_bad_example_on_replica_2(value, count=24):
    """Global batches of 8; in the second, row 4 (replica 2 of 4 holds rows 4-5) is `value`."""
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(count, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=(count,))
    images[8 + 4] = value
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)


def make_loop(train_data, *, mixed_precision="mixed_float16", num_replicas=4, **kwargs):
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(num_replicas),
        train_data=train_data,
        steps_per_loop=4,
        mixed_precision=mixed_precision,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def assert_untouched(before, after):
    """Every checkpointed variable but the step counter and the loss scale is bit-identical."""
    compared = [
        key for key in before if key != "global_step" and not key.startswith("update_states/")
    ]
    assert any(key.startswith("optimizer/") for key in compared)  # slots are compared too
    for key in compared:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_inf_on_one_replica_of_four_skips_the_step_on_all_and_halves_the_scale():
    loop = make_loop(batches_with_bad_example_on_replica_2(np.inf), on_nonfinite="skip")
    loop.train(1)
    before = loops.testing.loop_weights(loop)  # also checks that all 4 replicas agree
    logs = loop.train(2)
    assert_untouched(before, loops.testing.loop_weights(loop))
    assert logs["nonfinite"].tolist() == [1.0]
    assert logs["overflow"].tolist() == [0.0]
    assert logs["loss_scale"].tolist() == [INITIAL_SCALE]
    assert loop.definition.loss_scale.scale.numpy() == INITIAL_SCALE / 2
    assert loop.definition.loss_scale.finite_steps.numpy() == 0

    logs = loop.train(4)
    assert logs["nonfinite"].tolist() == [0.0, 0.0]
    assert logs["loss_scale"].tolist() == [INITIAL_SCALE / 2] * 2
    assert loop.state.skipped_steps == 1
    assert all(np.all(np.isfinite(w)) for w in loops.testing.loop_weights(loop).values())
    assert loop.state.last_train_metrics["loss_scale"] == INITIAL_SCALE / 2


def test_float16_overflow_on_one_replica_lowers_the_scale_without_stopping_the_run():
    # 3e4 is finite in float32 and its loss is finite, but the scaled gradients of
    # that example overflow float16: a matter for the loss scale, not for on_nonfinite.
    loop = make_loop(batches_with_bad_example_on_replica_2(3e4), on_nonfinite="stop")
    loop.train(1)
    before = loops.testing.loop_weights(loop)
    logs = loop.train(2)
    assert_untouched(before, loops.testing.loop_weights(loop))
    assert logs["overflow"].tolist() == [1.0]
    assert logs["nonfinite"].tolist() == [0.0]
    assert np.isfinite(logs["loss"][0])
    logs = loop.train(3)
    assert logs["overflow"].tolist() == [0.0]
    assert logs["loss_scale"].tolist() == [INITIAL_SCALE / 2]
    assert loop.state.skipped_steps == 0


def test_scale_doubles_after_growth_steps_finite_steps():
    loop = make_loop(tiny_batches(8, 24), num_replicas=2, loss_scale_growth_steps=3)
    logs = loop.train(7)
    assert logs["nonfinite"].tolist() == [0.0] * 7
    assert logs["loss_scale"].tolist() == [INITIAL_SCALE] * 3 + [INITIAL_SCALE * 2] * 3 + [
        INITIAL_SCALE * 4
    ]
    assert loop.definition.loss_scale.finite_steps.numpy() == 1


def test_scale_update_rule_floor_and_ceiling():
    scale = DynamicLossScale(initial_scale=2.0, growth_steps=1)
    halvings = [scale.update(skipped=tf.constant(1.0), loss=tf.constant(1.0)) for _ in range(2)]
    assert [float(logs["loss_scale"]) for logs in halvings] == [2.0, 1.0]
    assert scale.scale.numpy() == 1.0  # never below 1
    # At scale 1 no lower scale can help: the skipped step is nonfinite, not an overflow.
    assert [float(halvings[1]["overflow"]), float(halvings[1]["nonfinite"])] == [0.0, 1.0]
    top = DynamicLossScale(initial_scale=float(np.finfo(np.float32).max), growth_steps=1)
    top.update(skipped=tf.constant(0.0), loss=tf.constant(1.0))
    assert np.isfinite(top.scale.numpy())  # doubling into inf would stick there


@pytest.mark.parametrize(
    "policy, compute_dtype",
    [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16"), ("none", "float32")],
)
def test_variables_stay_float32_and_hidden_layers_compute_in_16_bits(policy, compute_dtype):
    loop = make_loop(tiny_batches(8, 16), mixed_precision=policy, num_replicas=2)
    loop.train(2)
    hidden = [
        layer for layer in loop.definition.model.layers if isinstance(layer, keras.layers.Dense)
    ]
    assert [layer.compute_dtype for layer in hidden] == [compute_dtype] * 2 + ["float32"]
    assert hidden[-1].name == "logits"
    assert {v.dtype for v in loop.definition.model.variables} == {"float32"}
    assert {v.dtype for v in loop.definition.optimizer.variables if v.dtype != "int64"} == {
        "float32"
    }
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored
    assert loop.definition.model(np.zeros((1, 8, 8, 1), np.float32)).dtype == "float32"
    assert "loss_scale" not in loop.definition.checkpoint_items()  # the loop saves it, unlisted
    assert ("update_states" in loop.saved_items()) == (policy == "mixed_float16")


def test_mixed_model_exports_float32_outputs(tmp_path):
    loop = make_loop(tiny_batches(8, 16), num_replicas=2)
    loop.train(2)
    images = np.random.default_rng(3).integers(0, 256, size=(5, 8, 8, 1), dtype=np.uint8)
    # Traced, as the export is: eager float16 kernels round between ops that a
    # graph fuses (oneDNN), a difference of float16's own size.
    expected = tf.function(lambda x: loop.definition.model(x, training=False))(images).numpy()
    served = tf.saved_model.load(export_classifier(loop.definition.model, str(tmp_path / "export")))
    outputs = served.signatures["serving_default"](images=tf.constant(images))
    assert outputs["logits"].dtype == tf.float32 and outputs["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(outputs["logits"].numpy(), expected, rtol=1e-6, atol=1e-6)


def test_resume_continues_the_loss_scale(tmp_path):
    def build(model_dir=None):
        # 5 batches an epoch: the bad second batch does not come back within 6 steps.
        return make_loop(
            batches_with_bad_example_on_replica_2(np.inf, count=40),
            num_replicas=2,
            on_nonfinite="skip",
            loss_scale_growth_steps=3,
            model_dir=model_dir,
        )

    uninterrupted = build()
    uninterrupted_logs = uninterrupted.train(6)

    first = build(str(tmp_path))
    first.train(3)
    first.close()
    resumed = build(str(tmp_path))
    assert resumed.state.step == 3
    assert resumed.definition.loss_scale.scale.numpy() == INITIAL_SCALE / 2
    assert resumed.definition.loss_scale.finite_steps.numpy() == 1
    logs = resumed.train(6)
    assert (
        logs["loss_scale"].tolist()
        == uninterrupted_logs["loss_scale"][3:].tolist()
        == [INITIAL_SCALE / 2, INITIAL_SCALE / 2, INITIAL_SCALE]
    )
    loops.testing.assert_close(
        loops.testing.loop_weights(resumed),
        loops.testing.loop_weights(uninterrupted),
        rtol=1e-6,
        label="resumed vs uninterrupted",
    )


def test_bad_settings_are_named():
    with pytest.raises(
        ValueError,
        match="mixed_precision must be one of none, mixed_bfloat16, mixed_float16, got 'float16'",
    ):
        make_loop(tiny_batches(), mixed_precision="float16", num_replicas=1)
    with pytest.raises(
        ValueError,
        match="loss_scale_growth_steps=10 applies only to mixed_precision='mixed_float16'",
    ):
        make_loop(
            tiny_batches(),
            mixed_precision="mixed_bfloat16",
            num_replicas=1,
            loss_scale_growth_steps=10,
        )
    with pytest.raises(ValueError, match="growth_steps must be a whole number >= 1"):
        make_loop(tiny_batches(), num_replicas=1, loss_scale_growth_steps=0)
    with pytest.raises(
        flags.IllegalFlagValueError,
        match="value should be one of <none|mixed_bfloat16|mixed_float16>",
    ):
        run_in_process("--mixed_precision=float16")


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_binary_trains_digits_in_mixed_precision(tmp_path, digits_dir, policy):
    model_dir = str(tmp_path / "run")
    done = run_module(
        "loops.bin.classifier",
        f"--mixed_precision={policy}",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(model_dir)
    assert results["global_step"] == 600
    print(
        f"{policy}: test accuracy {results['eval']['accuracy']:.4f}, "
        f"train metrics {results['train']}"
    )
    assert results["eval"]["accuracy"] >= 0.93  # float32: 0.972; both 16-bit runs measured 0.972
    assert ("loss_scale" in results["train"]) == (policy == "mixed_float16")
    served = tf.saved_model.load(os.path.join(model_dir, "export")).signatures["serving_default"](
        images=tf.zeros([2, 8, 8, 1], tf.uint8)
    )
    assert served["logits"].dtype == tf.float32 and served["probabilities"].dtype == tf.float32
