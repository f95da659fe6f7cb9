"""The classifier's export: a SavedModel that takes raw images and gives logits and
probabilities (`export_classifier`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from loops.model_dir import export


def export_classifier(model: keras.Model, export_dir: str, *, input_dtype=tf.uint8) -> str:
    """Saves `model` with a `serve` signature: raw images in, logits and probabilities out.

    The preprocessing lives in the model (the classifiers scale pixels
    themselves), so a client sends images as they come, of `input_dtype`.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory.
    """

    def serve(images):
        logits = tf.cast(model(images, training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}

    signature = tf.TensorSpec([None, *model.input_shape[1:]], input_dtype, name="images")
    return export.save(export.Server(model, serve, signature), export_dir)
