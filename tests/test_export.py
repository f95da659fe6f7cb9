"""Exported classifiers and GAN generators reload in and out of a strategy and serve the same;
an export removes only its own abandoned staging folders."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_loop import make_loop

import loops
from conftest import run_module, tiny_examples
from loops.model_dir.classifier_export import export_classifier
from loops.model_dir.gan_export import export_generator


def test_export_reloads_with_and_without_a_strategy_and_matches_the_model(tmp_path):
    loop = make_loop(loops.testing.replica_strategy(2), model="cnn")
    loop.train(3)
    images, _ = tiny_examples(21, seed=4)
    expected = loop.definition.model(images, training=False).numpy()
    path = export_classifier(loop.definition.model, str(tmp_path / "export"))

    outside = tf.saved_model.load(path)
    served = outside.signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["logits"].numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        served["probabilities"].numpy(), tf.nn.softmax(expected).numpy(), rtol=1e-6, atol=1e-6
    )

    with loops.testing.replica_strategy(2).scope():
        inside = tf.saved_model.load(path)
    np.testing.assert_allclose(
        inside.serve(tf.constant(images))["logits"].numpy(), expected, rtol=1e-6, atol=1e-6
    )


def test_export_replaces_an_old_export_but_not_other_files(tmp_path):
    loop = make_loop(loops.testing.replica_strategy(1))
    export_classifier(loop.definition.model, str(tmp_path / "export"))
    export_classifier(loop.definition.model, str(tmp_path / "export"))
    assert tf.saved_model.contains_saved_model(str(tmp_path / "export"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="holds no SavedModel; refusing to replace it"):
        export_classifier(loop.definition.model, str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"


def test_an_export_removes_only_its_own_dead_staging_folders(tmp_path):
    import subprocess
    import sys

    from loops.model_dir.export import staging_prefix

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process now gone
    target, other = tmp_path / "export", tmp_path / "other"
    mine = tmp_path / f"{staging_prefix(str(target))}{dead.pid}-abcd_123"
    alive = tmp_path / f"{staging_prefix(str(target))}{os.getpid()}-abcd_123"
    others = [
        tmp_path / f"{staging_prefix(str(other))}{dead.pid}-abcd_123",  # another export's
        tmp_path / f".export-{dead.pid}-abcd_123",  # an older loops' name: whose, unknown
        tmp_path / f"{staging_prefix(str(target))}{dead.pid}-abcd_123-x",  # not a staging name
    ]
    for folder in [mine, alive, *others]:
        folder.mkdir()
    loop = make_loop(loops.testing.replica_strategy(1))
    export_classifier(loop.definition.model, str(target))
    assert tf.saved_model.contains_saved_model(str(target))
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["export", alive.name, *(path.name for path in others)]
    )


def assert_serves_the_generator(path, generator, noise):
    expected = generator(noise, training=False).numpy()
    outside = tf.saved_model.load(path)
    served = outside.signatures["serving_default"](noise=tf.constant(noise))["samples"].numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)
    strategy = loops.testing.replica_strategy(2)
    with strategy.scope():
        inside = tf.saved_model.load(path)
        # In the scope a loaded function runs in replica context only: called
        # directly (cross-replica context) it fails with "Trying to access a
        # placeholder that is not supposed to be executed".
        per_replica = strategy.run(inside.serve, args=(tf.constant(noise),))["samples"]
    for served in strategy.experimental_local_results(per_replica):
        np.testing.assert_allclose(served.numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        inside.serve(tf.constant(noise))["samples"].numpy(), expected, rtol=1e-6, atol=1e-6
    )


def test_generator_export_serves_the_moving_average_outside_and_inside_a_strategy(tmp_path):
    from test_gan import make_gan

    loop = make_gan(loops.testing.replica_strategy(2), ema_decay=0.5)
    loop.train(3)
    noise = (
        np.random.default_rng(0)
        .standard_normal((7, *loop.definition.noise_shape))
        .astype(np.float32)
    )
    trained = [v.numpy() for v in loop.definition.generator.weights]
    raw = loop.definition.generator(noise).numpy()
    with loop.averaged_weights():
        average = loop.definition.generator(noise).numpy()
        # The average differs from the trained generator, so serving the wrong one would fail.
        assert np.max(np.abs(raw - average)) > 1e-3
        path = export_generator(loop.definition.generator, str(tmp_path / "gen"))
        assert_serves_the_generator(path, loop.definition.generator, noise)
    # Out of the context the trained weights are back, bit for bit.
    for before, after in zip(trained, loop.definition.generator.weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_the_gan_binary_exports_the_generator_it_trained(tmp_path):
    from loops.kinds.gan import GANLoop
    from loops_models import gan as gan_models

    model_dir = str(tmp_path / "ring")
    done = run_module(
        "loops.bin.gan",
        f"--model_dir={model_dir}",
        "--train_steps=4",
        "--steps_per_loop=2",
        "--global_batch_size=64",
        "--ema_decay=0.5",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    export = os.path.join(model_dir, "export")
    assert (
        f"exported SavedModel to {export} (signature serving_default: noise -> samples)"
        in done.stdout
    )
    # The same networks restored from the run's checkpoint: its average serves the same samples.
    restored = loops.Trainer(
        GANLoop(
            generator_fn=lambda: gan_models.ring_generator(seed=0),
            discriminator_fn=lambda: gan_models.ring_discriminator(seed=0),
            generator_optimizer_fn=lambda: keras.optimizers.Adam(),
            discriminator_optimizer_fn=lambda: keras.optimizers.Adam(),
        ),
        ema_decay=0.5,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
    )
    assert restored.state.step == 4
    noise = (
        np.random.default_rng(1)
        .standard_normal((5, *restored.definition.noise_shape))
        .astype(np.float32)
    )
    with restored.averaged_weights():
        assert_serves_the_generator(export, restored.definition.generator, noise)
    restored.close()
