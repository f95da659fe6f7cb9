"""The language model's export: a SavedModel that continues a prompt by greedy generation,
with TensorFlow alone (`export_text_generator`)."""

from __future__ import annotations

import keras
import tensorflow as tf

from loops.core.text_generation import generate
from loops.model_dir import export


def export_text_generator(model: keras.Model, export_dir: str, *, sequence_length: int) -> str:
    """Saves a byte-level language model with a `serve` signature: text in, continued text out.

    A client sends `prompt` (a scalar string of any bytes) and `length` (a
    scalar int32, >= 0) and gets `text`: the prompt followed by `length` bytes
    chosen greedily by `loops.core.text_generation.generate` over the model's last
    `sequence_length` tokens. An empty prompt is continued as if it were a
    newline, the start of a line; the newline is not part of `text`. The
    SavedModel runs with TensorFlow alone.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory.
    """
    byte_strings = tf.constant([bytes([value]) for value in range(256)])
    newline = tf.constant([ord("\n")], tf.int32)

    def serve(request):
        prompt_tokens = tf.cast(tf.io.decode_raw(request["prompt"], tf.uint8), tf.int32)
        context = tf.cond(tf.size(prompt_tokens) > 0, lambda: prompt_tokens, lambda: newline)
        tokens = generate(model, context[None], request["length"], sequence_length=sequence_length)
        continuation = tf.gather(byte_strings, tokens[0, tf.size(context) :])
        return {"text": request["prompt"] + tf.strings.reduce_join(continuation)}

    signature = {
        "prompt": tf.TensorSpec([], tf.string, name="prompt"),
        "length": tf.TensorSpec([], tf.int32, name="length"),
    }
    return export.save(export.Server(model, serve, signature), export_dir)
