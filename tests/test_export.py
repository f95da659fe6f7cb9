"""The exported classifier reloads outside and inside a strategy and serves the same outputs."""

import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import tiny_examples
from loops.export import export_classifier
from test_loop import make_loop


def test_export_reloads_with_and_without_a_strategy_and_matches_the_model(tmp_path):
    loop = make_loop(loops.testing.replica_strategy(2), model="cnn")
    loop.train(3)
    images, _ = tiny_examples(21, seed=4)
    expected = loop.model(images, training=False).numpy()
    path = export_classifier(loop.model, str(tmp_path / "export"))

    outside = tf.saved_model.load(path)
    served = outside.signatures["serving_default"](images=tf.constant(images))
    np.testing.assert_allclose(served["logits"].numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(served["probabilities"].numpy(),
                               tf.nn.softmax(expected).numpy(), rtol=1e-6, atol=1e-6)

    with loops.testing.replica_strategy(2).scope():
        inside = tf.saved_model.load(path)
    np.testing.assert_allclose(inside.serve(tf.constant(images))["logits"].numpy(), expected,
                               rtol=1e-6, atol=1e-6)


def test_export_replaces_an_old_export_but_not_other_files(tmp_path):
    loop = make_loop(loops.testing.replica_strategy(1))
    export_classifier(loop.model, str(tmp_path / "export"))
    export_classifier(loop.model, str(tmp_path / "export"))
    assert tf.saved_model.contains_saved_model(str(tmp_path / "export"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    with pytest.raises(ValueError, match="holds no SavedModel; refusing to replace it"):
        export_classifier(loop.model, str(tmp_path / "notes"))
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"
