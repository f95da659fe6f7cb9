"""Exports a trained classifier as a SavedModel that serves raw images."""

from __future__ import annotations

import os
import shutil
import tempfile

import keras
import tensorflow as tf


class _ClassifierServer(tf.Module):
    def __init__(self, model: keras.Model, input_signature: tf.TensorSpec):
        super().__init__()
        self.model = model
        self.serve = tf.function(self._serve, input_signature=[input_signature])

    def _serve(self, images):
        logits = tf.cast(self.model(images, training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits)}


def export_classifier(model: keras.Model, export_dir: str, *, input_dtype=tf.uint8) -> str:
    """Saves `model` with a `serve` signature: raw images in, logits and probabilities out.

    The preprocessing lives in the model (the classifiers scale pixels
    themselves), so a client sends images as they come, of `input_dtype`.
    The SavedModel is written next to `export_dir` and renamed into place, so
    a crash never leaves a half-written export where the old one was.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory.
    """
    if os.path.exists(export_dir) and not tf.saved_model.contains_saved_model(export_dir):
        raise ValueError(
            f"export_dir {export_dir!r} exists and holds no SavedModel; refusing to replace "
            "it. Pass a new directory or remove it.")
    signature = tf.TensorSpec([None, *model.input_shape[1:]], input_dtype, name="images")
    server = _ClassifierServer(model, signature)
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=".export-")
    try:
        tf.saved_model.save(server, staging, signatures={"serving_default": server.serve})
        if os.path.exists(export_dir):
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return export_dir
