"""A network's outputs in float32, so losses and sampling stay float32 under mixed precision."""

from __future__ import annotations

import tensorflow as tf


def float32(model_outputs):
    """`model_outputs` (a tensor or a structure of them), each cast to float32."""
    return tf.nest.map_structure(lambda output: tf.cast(output, tf.float32), model_outputs)
