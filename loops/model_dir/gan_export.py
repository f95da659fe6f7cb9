"""The GAN's export: its generator as a SavedModel that takes noise and gives samples
(`export_generator`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from loops.model_dir import export


def export_generator(generator: keras.Model, export_dir: str) -> str:
    """Saves a GAN generator with a `serve` signature: noise in, samples out.

    A client draws the noise itself (float32, shaped like the generator's
    input, e.g. from a standard normal as in training), so the same noise
    gives the same samples.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory.
    """

    def serve(noise):
        return {"samples": tf.cast(generator(noise, training=False), tf.float32)}

    signature = tf.TensorSpec([None, *generator.input_shape[1:]], tf.float32, name="noise")
    return export.save(export.Server(generator, serve, signature), export_dir)
