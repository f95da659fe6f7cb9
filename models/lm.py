"""A small decoder-only Transformer over bytes: int32 tokens in, next-token logits out."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


def _dense_initializer(layer_seed: int):
    return keras.initializers.GlorotUniform(seed=layer_seed)


def _embedding_initializer(layer_seed: int):
    # Small embeddings keep the first residual stream near the LayerNorm scale.
    return keras.initializers.RandomNormal(stddev=0.02, seed=layer_seed)


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position, 0 to sequence_length - 1, to (batch, length, width)."""

    def __init__(self, sequence_length: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.sequence_length = sequence_length
        self.seed = seed

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            shape=(self.sequence_length, input_shape[-1]),
            initializer=_embedding_initializer(self.seed),
            name="position_embeddings",
        )

    def call(self, inputs):
        length = inputs.shape[1]
        if length is not None and length > self.sequence_length:
            raise ValueError(
                f"The model takes at most {self.sequence_length} tokens, got {length}; pass the "
                f"last {self.sequence_length} (generate does) or build it with a larger "
                "sequence_length."
            )
        return inputs + self.position_embeddings[: ops.shape(inputs)[1]]

    def get_config(self):
        return {**super().get_config(), "sequence_length": self.sequence_length, "seed": self.seed}


class CausalSelfAttention(keras.layers.Layer):
    """Multi-head self-attention in which position t attends to positions 0..t only.

    Not keras.layers.MultiHeadAttention: it rebuilds its one kernel initializer
    for the query, key and value projections, so a seeded initializer would
    start all three from the same matrix.
    """

    def __init__(self, num_heads: int, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.seed = seed

    def build(self, input_shape):
        width = input_shape[-1]
        # No bias: a key bias adds the same score to all of a query's keys, which the
        # softmax cancels, so its gradient is rounding noise that Adam turns into full
        # steps (and that differs with the replica count). The others add little.
        self.query_key_value = keras.layers.Dense(
            3 * width,
            use_bias=False,
            kernel_initializer=_dense_initializer(self.seed),
            dtype=self.dtype_policy,
            name="query_key_value",
        )
        self.output_projection = keras.layers.Dense(
            width,
            kernel_initializer=_dense_initializer(self.seed + 1),
            dtype=self.dtype_policy,
            name="output_projection",
        )
        self.query_key_value.build(input_shape)
        self.output_projection.build(input_shape)

    def call(self, inputs):
        batch_size, length, width = ops.shape(inputs)
        head_width = width // self.num_heads
        heads = ops.reshape(
            self.query_key_value(inputs), (batch_size, length, 3, self.num_heads, head_width)
        )
        query, key, value = ops.unstack(heads, 3, axis=2)
        # Scaling the query rather than the scores touches length times fewer numbers.
        query = query * ops.cast(head_width**-0.5, query.dtype)
        # Scores and softmax in float32: float16 overflows on the masked entries.
        scores = ops.cast(ops.einsum("bqhd,bkhd->bhqk", query, key), "float32")
        visible = ops.tril(ops.ones((length, length), "bool"))
        # keras.ops.softmax warns on one key (a one-token input), which causality makes normal.
        weights = tf.nn.softmax(ops.where(visible, scores, -1e9), axis=-1)
        attended = ops.einsum("bhqk,bkhd->bqhd", ops.cast(weights, value.dtype), value)
        return self.output_projection(ops.reshape(attended, (batch_size, length, width)))

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "seed": self.seed}


def transformer_lm(
    *,
    vocab_size: int = 256,
    sequence_length: int = 128,
    width: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> keras.Model:
    """A decoder-only Transformer: (batch, length) int32 tokens -> (batch, length, vocab) logits.

    Token and learned position embeddings, `num_layers` pre-LayerNorm blocks of
    causal self-attention and a 4x-wide gelu MLP, a final LayerNorm and a dense
    head. The logits at position t depend on tokens 0..t only; `length` may be
    anything up to `sequence_length`. No dropout.

    Args:
        vocab_size: number of token values (256 for bytes).
        sequence_length: the most tokens one call takes (the position table's size).
        width: the residual stream's width; a multiple of `num_heads`.
        num_layers: Transformer blocks.
        num_heads: attention heads per block.
        seed: the initial weights are a function of it alone.

    Returns:
        A functional keras.Model whose logits are float32 under any dtype policy.

    Raises:
        ValueError: a size is below 1, or `width` is not a multiple of `num_heads`.
    """
    sizes = {
        "vocab_size": vocab_size,
        "sequence_length": sequence_length,
        "width": width,
        "num_layers": num_layers,
        "num_heads": num_heads,
    }
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"transformer_lm needs {name} >= 1, got {value}.")
    if width % num_heads:
        nearest = num_heads * max(1, round(width / num_heads))
        raise ValueError(
            f"width {width} is not a multiple of num_heads {num_heads}; each head takes an "
            f"equal share of the width, so pick e.g. width={nearest}."
        )
    if num_layers > 99:
        raise ValueError(
            f"transformer_lm supports at most 99 layers, got num_layers={num_layers}; pass fewer."
        )

    def layer_seed(index: int) -> int:
        # Explicit per-layer seeds make the initial weights a function of `seed`
        # alone, so loops built with 1 and N replicas start from the same point.
        # Indices: 0 and 1 the embeddings, 10 * (block + 1) + 0..3 a block's
        # layers, 999 the head; below 1000, so two seeds never share a layer seed.
        return seed * 1000 + index

    tokens = keras.Input((None,), dtype="int32", name="tokens")
    stream = keras.layers.Embedding(
        vocab_size,
        width,
        embeddings_initializer=_embedding_initializer(layer_seed(0)),
        name="token_embedding",
    )(tokens)
    stream = PositionEmbedding(sequence_length, layer_seed(1), name="position_embedding")(stream)
    for block in range(num_layers):
        index = 10 * (block + 1)
        attended = CausalSelfAttention(
            num_heads, layer_seed(index), name=f"block_{block}_attention"
        )(keras.layers.LayerNormalization(name=f"block_{block}_attention_norm")(stream))
        stream = keras.layers.Add(name=f"block_{block}_attention_residual")([stream, attended])
        hidden = keras.layers.Dense(
            4 * width,
            activation="gelu",
            kernel_initializer=_dense_initializer(layer_seed(index + 2)),
            name=f"block_{block}_mlp_hidden",
        )(keras.layers.LayerNormalization(name=f"block_{block}_mlp_norm")(stream))
        mlp_output = keras.layers.Dense(
            width,
            kernel_initializer=_dense_initializer(layer_seed(index + 3)),
            name=f"block_{block}_mlp",
        )(hidden)
        stream = keras.layers.Add(name=f"block_{block}_mlp_residual")([stream, mlp_output])
    stream = keras.layers.LayerNormalization(name="final_norm")(stream)
    # Logits stay float32 under a mixed dtype policy (loops.mixed_precision): the
    # softmax needs float32 range and digits.
    logits = keras.layers.Dense(
        vocab_size,
        kernel_initializer=_dense_initializer(layer_seed(999)),
        dtype="float32",
        name="logits",
    )(stream)
    return keras.Model(tokens, logits, name="transformer_lm")
