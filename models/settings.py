"""The settings of the example models, declared once
(`loops.vocabulary.settings.Setting`): a binary's flags.

Nothing here imports TensorFlow or Keras: a binary declares its flags from these
before --help, which answers without them.
"""

from __future__ import annotations

import math
import os
from typing import Any

from loops.vocabulary.settings import Setting, satisfies

# loops.bin.classifier: `loops_models.classifiers.build_classifier(model, l2=..., ...)`.
CLASSIFIER: tuple[Setting, ...] = (
    Setting("model", "model", "Classifier network.", "enum", default="mlp", choices=("mlp", "cnn")),
    Setting(
        "l2",
        "model",
        "L2 weight regularization factor (>= 0).",
        "float",
        default=0.0,
        lower_bound=0.0,
    ),
    Setting(
        "batch_norm",
        "model",
        "Synchronized batch normalization after hidden layers.",
        "bool",
        default=False,
    ),
    Setting(
        "dropout",
        "model",
        "Dropout rate in [0, 1) after the hidden layers (mlp) or before the head "
        "(cnn); masks differ per replica and per step, and match for any "
        "replica count.",
        "float",
        default=0.0,
        check=satisfies(
            lambda value: 0.0 <= value < 1.0,
            "{name} must lie in [0, 1), e.g. {name}=0.2.",
        ),
    ),
)

# loops.bin.lm: `loops_models.lm.transformer_lm(width=..., num_layers=..., num_heads=...)`.
TRANSFORMER_LM: tuple[Setting, ...] = (
    Setting(
        "width",
        "model",
        "Transformer width (a multiple of --num_heads).",
        "integer",
        default=128,
        lower_bound=1,
    ),
    Setting("num_layers", "model", "Transformer blocks.", "integer", default=2, lower_bound=1),
    Setting(
        "num_heads", "model", "Attention heads per block.", "integer", default=4, lower_bound=1
    ),
)


def check_width_fits_heads(values: dict[str, Any]) -> None:
    """Refuses a --width that --num_heads does not divide.

    Raises:
        ValueError: the width, and a width that fits.
    """
    width, num_heads = values["width"], values["num_heads"]
    if width % num_heads:
        raise ValueError(
            f"--width={width} is not a multiple of --num_heads={num_heads}; "
            f"pass e.g. --width={num_heads * max(1, width // num_heads)}."
        )


# Bytes of one attention probability (float32): the least a score costs while it is kept.
_ATTENTION_PROBABILITY_BYTES = 4


def memory_bytes() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def check_transformer_fits(values: dict[str, Any], *, sequence_length: int, rows: int) -> None:
    """Refuses TRANSFORMER_LM settings that cannot build (`check_width_fits_heads`) or whose
    attention for a replica's `rows` cannot fit in this machine's memory
    (`check_attention_fits`); ValueError with the fix."""
    check_width_fits_heads(values)
    check_attention_fits(values, sequence_length=sequence_length, rows=rows)


def check_attention_fits(
    values: dict[str, Any], *, sequence_length: int, rows: int = 1, memory: int | None = None
) -> None:
    """Refuses a --sequence_length whose attention alone cannot fit in `memory` bytes.

    Training keeps every block's attention probabilities for the backward
    pass: rows x num_heads x sequence_length² float32 numbers per block. That
    is a lower bound of what a step needs (activations, the MLP and the
    optimizer come on top), so a length refused here could never train;
    one allowed may still be too long for an accelerator's memory.

    Args:
        values: the TRANSFORMER_LM settings (num_layers, num_heads).
        sequence_length: --sequence_length.
        rows: the examples one replica holds in a step (1 before the strategy exists).
        memory: the bytes to fit in (default: `memory_bytes()`); 0 checks nothing.

    Raises:
        ValueError: the length, what it needs, and the longest length that fits.
    """
    memory = memory_bytes() if memory is None else memory
    per_score = rows * values["num_layers"] * values["num_heads"] * _ATTENTION_PROBABILITY_BYTES
    needed = per_score * sequence_length**2
    if not memory or needed <= memory:
        return
    longest = math.isqrt(memory // per_score)
    gib = 2**30
    whose, fewer_rows = "one example", ""
    if rows > 1:
        whose, fewer_rows = f"a replica's {rows} rows", ", or a smaller --global_batch_size"
    raise ValueError(
        f"--sequence_length={sequence_length} is more than this machine can train: the "
        f"attention probabilities of {whose} alone ({values['num_layers']} blocks x "
        f"{values['num_heads']} heads x {sequence_length}² x 4 bytes) need "
        f"{needed / gib:,.0f} GiB, and it has {memory / gib:,.0f} GiB of memory; pass "
        f"--sequence_length<={longest} (or fewer --num_layers or --num_heads{fewer_rows})."
    )


# loops.bin.recommender: `loops_models.recommender.id_tower` (retrieval) or `rating_model`.
RECOMMENDER: tuple[Setting, ...] = (
    Setting(
        "model",
        "model",
        "retrieval: two towers (users, items) trained with an in-batch softmax over the "
        "global batch, evaluated by Recall@K and NDCG@K over every item; rating: biases, a "
        "dot product (and an MLP with --hidden_units) fitted to the ratings, evaluated by "
        "RMSE.",
        "enum",
        default="retrieval",
        choices=("retrieval", "rating"),
    ),
    Setting(
        "embedding_dim",
        "model",
        "Width of the user and item embeddings.",
        "integer",
        default=32,
        lower_bound=1,
    ),
    Setting(
        "hidden_units",
        "model",
        "rating: the width of an MLP's hidden layer over both embeddings, added to the dot "
        "product; 0: no MLP (one of 64 overfit the generated log in trials).",
        "integer",
        default=0,
        lower_bound=0,
    ),
    Setting(
        "l2",
        "model",
        "rating: each pair's loss adds l2 times the sum of squares of the embedding and "
        "bias rows it looked up (>= 0).",
        "float",
        default=0.02,
        lower_bound=0.0,
    ),
    Setting(
        "temperature",
        "model",
        "retrieval: the towers' (unit length) dot products are divided by it.",
        "float",
        default=0.1,
        check=satisfies(lambda value: value > 0, "{name} must be > 0, e.g. 0.1."),
    ),
    Setting(
        "top_k",
        "model",
        "retrieval: the cut-off K of Recall@K and NDCG@K, and the items the export returns.",
        "integer",
        default=10,
        lower_bound=1,
    ),
)


def check_top_k_fits(top_k: int, num_items: int) -> None:
    """Refuses a --top_k longer than the item list it cuts (retrieval's Recall@K, NDCG@K).

    Raises:
        ValueError: the flag, the items there are, and the longest K.
    """
    if top_k > num_items:
        raise ValueError(
            f"--top_k={top_k} is more than the {num_items} items of the interaction log, so "
            f"no list could be that long; pass --top_k<={num_items}."
        )
