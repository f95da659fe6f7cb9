"""Continues byte-level prompts with a language model, greedily or by seeded sampling, in TF ops."""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf


def encode(text: str | bytes) -> np.ndarray:
    """The UTF-8 bytes of `text` as int32 tokens, shape (number of bytes,).

    For one prompt to `generate`, add the batch axis: `encode(text)[None]`.
    """
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


def decode(tokens: Sequence[int] | np.ndarray | tf.Tensor) -> str:
    """The text of one sequence of byte tokens; invalid UTF-8 becomes U+FFFD.

    Raises:
        ValueError: `tokens` is not one sequence, or holds a value outside 0-255.
    """
    values = np.asarray(tokens)
    if values.ndim != 1:
        raise ValueError(
            f"decode takes one sequence of tokens, got shape {values.shape}; decode each row "
            "of a batch on its own."
        )
    outside = values[(values < 0) | (values > 255)]
    if outside.size:
        raise ValueError(
            f"Byte tokens are 0-255, got {outside[0]}; decode only what a byte-level model "
            "produced."
        )
    return values.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def generate(
    model: keras.Model,
    prompt_tokens: tf.Tensor | np.ndarray,
    length: int | tf.Tensor,
    *,
    sequence_length: int,
    temperature: float = 0.0,
    seed: tf.Tensor | None = None,
) -> tf.Tensor:
    """Appends `length` tokens to each prompt, one model call per token.

    Each new token comes from the logits at the last position of the model
    run over the last `sequence_length` tokens so far: their argmax when
    `temperature` is 0, else a draw from softmax(logits / temperature) seeded
    by `stateless_fold_in(seed, i)` for the i-th new token (from 0), so a seed
    gives the same text eagerly, in a tf.function, in a SavedModel and on any
    number of replicas. Runs eagerly or traced (`length` may be a tensor);
    with a tf.distribute strategy, call it in cross-replica context (outside
    `strategy.run`).

    Args:
        model: maps (batch, up to sequence_length) int32 tokens to
            (batch, same length, vocabulary) logits, causally.
        prompt_tokens: int (batch, prompt_length) tokens, prompt_length >= 1.
        length: how many tokens to append, >= 0.
        sequence_length: the most tokens the model takes in one call.
        temperature: 0 for greedy decoding, > 0 to sample.
        seed: a shape [2] integer tensor; required when temperature > 0.

    Returns:
        int32 (batch, prompt_length + length): the prompts and their continuations.

    Raises:
        ValueError: a bad argument (the message says which and what to pass).
        tf.errors.InvalidArgumentError: a tensor `length` is negative, or a
            prompt of unknown static length is empty.
    """
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}.")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(
            f"temperature must be a finite number >= 0, got {temperature}; pass 0 for greedy "
            "decoding."
        )
    tokens = _checked_prompt(prompt_tokens)
    length = _checked_length(length)
    seed = _checked_seed(temperature, seed)
    return _decode(model, tokens, length, sequence_length, temperature, seed)


def _checked_seed(temperature: float, seed: tf.Tensor | None) -> tf.Tensor | None:
    """`seed` as a tensor when sampling; raises ValueError for a missing or bad one."""
    if temperature > 0:
        if seed is None:
            raise ValueError(
                f"Sampling (temperature {temperature}) needs a seed, a shape [2] integer "
                "tensor such as tf.constant([0, 1]); or pass temperature=0 for greedy decoding."
            )
        seed = tf.convert_to_tensor(seed)
        if seed.shape != (2,) or not seed.dtype.is_integer:
            raise ValueError(
                f"seed must be a shape [2] integer tensor such as tf.constant([0, 1]), got "
                f"{seed.dtype.name} of shape {seed.shape}."
            )
    return seed


def _checked_prompt(prompt_tokens: tf.Tensor | np.ndarray) -> tf.Tensor:
    """The prompts as int32 (batch, prompt_length); raises ValueError for bad ones."""
    tokens = tf.convert_to_tensor(prompt_tokens)
    if tokens.shape.rank != 2 or not tokens.dtype.is_integer:
        raise ValueError(
            f"prompt_tokens must be integer tokens of shape (batch, prompt_length), got "
            f"{tokens.dtype.name} of shape {tokens.shape}; for one prompt pass encode(text)[None]."
        )
    if tokens.shape[1] == 0:
        raise ValueError(
            "prompt_tokens is empty (prompt_length 0); the model needs at least one token to "
            "continue, e.g. a newline (10)."
        )
    tokens = tf.cast(tokens, tf.int32)
    # The assertions need no control dependencies: eagerly they raise at once,
    # and a tf.function runs every stateful op.
    if tokens.shape[1] is None:
        tf.debugging.assert_positive(
            tf.shape(tokens)[1], message="generate: prompt_tokens must hold at least one token."
        )
    return tokens


def _checked_length(length: int | tf.Tensor) -> tf.Tensor:
    """`length` as an int32 tensor; raises ValueError (or asserts, for a tensor) if negative."""
    if tf.is_tensor(length):
        tf.debugging.assert_non_negative(length, message="generate: length must be >= 0.")
    elif length < 0:
        raise ValueError(f"length must be >= 0 new tokens, got {length}.")
    return tf.cast(length, tf.int32)


def _decode(
    model: keras.Model,
    tokens: tf.Tensor,
    length: tf.Tensor,
    sequence_length: int,
    temperature: float,
    seed: tf.Tensor | None,
) -> tf.Tensor:
    """Appends `length` tokens to `tokens` in a tf.while_loop (see `generate`)."""

    def next_token(index: tf.Tensor, context: tf.Tensor) -> tf.Tensor:
        window = context[:, -sequence_length:]
        logits = tf.cast(model(window, training=False)[:, -1, :], tf.float32)
        if temperature == 0:
            return tf.argmax(logits, axis=-1, output_type=tf.int32)[:, None]
        token_seed = tf.random.experimental.stateless_fold_in(seed, index)
        return tf.random.stateless_categorical(
            logits / temperature, 1, seed=token_seed, dtype=tf.int32
        )

    def append(index: tf.Tensor, context: tf.Tensor):
        return index + 1, tf.concat([context, next_token(index, context)], axis=1)

    _, tokens = tf.while_loop(
        lambda index, _: index < length,
        append,
        (tf.constant(0, tf.int32), tokens),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([tokens.shape[0], None])),
    )
    return tokens
