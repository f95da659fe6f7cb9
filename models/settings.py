"""The settings of the example models, declared once
(`loops.vocabulary.settings.Setting`): a binary's flags.

Nothing here imports TensorFlow or Keras: a binary declares its flags from these
before --help, which answers without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from loops.vocabulary.host_memory import in_units, memory_bytes
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


def transformer_weights(values: dict[str, Any], *, sequence_length: int, vocab_size: int) -> int:
    """The weights of `loops_models.lm.transformer_lm` with the TRANSFORMER_LM settings
    `values`: the token and position embeddings; each block's two LayerNorms, bias-free query,
    key and value projection, output projection and 4x-wide MLP; the final LayerNorm and the
    head (float32 under any dtype policy)."""
    width, layers = values["width"], values["num_layers"]
    block = 12 * width * width + 10 * width
    return width * (2 * vocab_size + sequence_length + 2) + layers * block + vocab_size


def check_transformer_weights_fit(
    values: dict[str, Any],
    *,
    sequence_length: int,
    vocab_size: int,
    copies: int = 1,
    memory: int | None = None,
) -> None:
    """Refuses a --width or --num_layers whose weights, held `copies` times (the weights and
    the optimizer's slots), cannot fit in `memory` bytes (default: `memory_bytes()`; 0
    checks nothing): like `check_recommender_fits`, a lower bound of what training needs.

    Raises:
        ValueError: the settings, what their weights need, and the largest that fit.
    """
    memory = memory_bytes() if memory is None else memory
    width, layers, heads = values["width"], values["num_layers"], values["num_heads"]

    def held(width: int, layers: int) -> int:
        sizes = {"width": width, "num_layers": layers}
        weights = transformer_weights(sizes, sequence_length=sequence_length, vocab_size=vocab_size)
        return _WEIGHT_BYTES * copies * weights

    needed = held(width, layers)
    if not memory or needed <= memory:
        return
    fixes = []
    widest = _largest_fitting(lambda size: held(size, layers) <= memory, width) // heads * heads
    if widest >= heads:  # a multiple of --num_heads
        fixes.append(f"--width<={widest}")
    if (fewest := _largest_fitting(lambda count: held(width, count) <= memory, layers)) >= 1:
        fixes.append(f"--num_layers<={fewest}")
    fix = " or ".join(fixes) or "a smaller --width and fewer --num_layers"
    weights = needed // (_WEIGHT_BYTES * copies)
    raise ValueError(
        f"--width={width} --num_layers={layers} is more than this machine can train: the "
        f"language model's {weights:,} weights, held {_times(copies)} (the weights and the "
        f"optimizer's slots) at {_WEIGHT_BYTES} bytes, need {in_units(needed)}, and it has "
        f"{in_units(memory)} of memory; pass {fix}."
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
        "bias rows it looked up (>= 0); retrieval with --normalize_towers=false: each row's "
        "loss adds l2 times the squared lengths of its user's and its item's embeddings "
        "(unit-length towers take none).",
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
        "negatives",
        "model",
        "retrieval: each row's negatives; in_batch: the other items of the global batch, "
        "corrected for how often each is sampled (logQ); catalogue: every item of the log, "
        "the full softmax (the item tower runs on every item each step: for a catalogue of "
        "thousands, not millions).",
        "enum",
        default="in_batch",
        choices=("in_batch", "catalogue"),
    ),
    Setting(
        "normalize_towers",
        "model",
        "retrieval: the towers' embeddings are unit length (the dot product a cosine); "
        "false: raw embeddings, whose lengths can carry an item's popularity (regularize "
        "them with --l2).",
        "bool",
        default=True,
    ),
    Setting(
        "user_history",
        "model",
        "Both models: a user's vector also reads the items they interacted with in training "
        "(SVD++'s implicit term for rating; for retrieval the user tower's input beside the "
        "id), from a dense users x items table: for logs of thousands of items, not millions.",
        "bool",
        default=False,
    ),
    Setting(
        "top_k",
        "model",
        "The items the export returns a user (both models; at most the log's items) and, for "
        "retrieval, the cut-off K of Recall@K and NDCG@K.",
        "integer",
        default=10,
        lower_bound=1,
    ),
    Setting(
        "dynamic_ids",
        "model",
        "Make the user and item tables (embeddings and biases) loops.DynamicTables over the "
        "log's raw ids, of --id_capacity rows each: an id gets a row after --id_admit_after "
        "sightings in training and the least frequently seen rows are evicted when a table is "
        "full (docs/library.md, 'Dynamic tables'); trained by --table_optimizer, which must "
        "then name a row rule (sgd, adagrad or rowwise_adagrad). Rows start by id "
        "(--rows_by_id).",
        "bool",
        default=False,
    ),
    Setting(
        "id_capacity",
        "model",
        "--dynamic_ids: the rows of each user and each item table; 0: one for every id of "
        "the log (its users, its items), so nothing is evicted.",
        "integer",
        default=0,
        lower_bound=0,
    ),
    Setting(
        "id_admit_after",
        "model",
        "--dynamic_ids: the sightings in training an id needs for a row; before, it scores "
        "with zeros (no embedding, no bias).",
        "integer",
        default=1,
        lower_bound=1,
    ),
    Setting(
        "rows_by_id",
        "model",
        "Start each table row from a function of --seed and the raw id it holds "
        "(loops.initial_rows, what a dynamic table gives an id it admits), not from its "
        "position in the log's vocabulary: with it a run equals one with --dynamic_ids whose "
        "tables hold every id, and an id starts the same in a log of other ids.",
        "bool",
        default=False,
    ),
)


def recommender_table_rows(values: dict[str, Any], num_ids: int) -> int:
    """The rows of a recommender table over `num_ids` ids: --id_capacity's with --dynamic_ids
    (one more, the zero row of ids without one), else one an id."""
    if not values.get("dynamic_ids"):
        return num_ids
    return (values["id_capacity"] or num_ids) + 1


# loops.bin.ctr: `loops_models.ctr`'s builders (wide_and_deep, dcn_v2, dlrm).
CTR: tuple[Setting, ...] = (
    Setting(
        "model",
        "model",
        "wide_and_deep: a linear model of every column beside an MLP over the numeric "
        "columns and the embeddings; dcn_v2: full-rank cross layers, then an MLP; dlrm: the "
        "dot product of every pair of embeddings (the numeric columns' through a bottom "
        "MLP), then an MLP (needs a numeric column).",
        "enum",
        default="dcn_v2",
        choices=("wide_and_deep", "dcn_v2", "dlrm"),
    ),
    Setting(
        "embedding_dim",
        "model",
        "Width of each categorical and multi-hot column's embedding.",
        "integer",
        default=8,
        lower_bound=1,
    ),
    Setting(
        "hidden_units",
        "model",
        "The width of each hidden layer of the MLP (dlrm: of its top MLP; its bottom MLP has "
        "one layer of this width).",
        "integer",
        default=64,
        lower_bound=1,
    ),
    Setting(
        "hidden_layers",
        "model",
        "The hidden layers of the MLP (dlrm: of its top MLP).",
        "integer",
        default=2,
        lower_bound=1,
    ),
    Setting(
        "cross_layers",
        "model",
        "dcn_v2: its cross layers.",
        "integer",
        default=2,
        lower_bound=1,
    ),
)


# Bytes of one weight: every weight of the recommenders is a float32.
_WEIGHT_BYTES = 4


def check_recommender_fits(
    values: dict[str, Any],
    *,
    num_users: int,
    num_items: int,
    copies: int = 1,
    memory: int | None = None,
) -> None:
    """Refuses RECOMMENDER settings whose weights cannot fit in `memory` bytes.

    Training holds `copies` of every weight (the weights and the optimizer's
    slots: `loops.bin.training_settings.weight_copies`). That is a lower bound
    of what it needs (gradients and activations come on top), so a model
    refused here could never train, before it is built; one allowed may still
    be too large for an accelerator's memory.

    Args:
        values: the RECOMMENDER settings (model, embedding_dim, hidden_units).
        num_users, num_items: the log's index spaces (the tables' rows).
        copies: the copies of each weight training holds.
        memory: the bytes to fit in (default: `memory_bytes()`); 0 checks nothing.

    Raises:
        ValueError: the settings, what their weights need, and the largest that fit.
    """
    memory = memory_bytes() if memory is None else memory
    history = num_users * num_items * _WEIGHT_BYTES
    if values.get("user_history") and memory and history > memory // 2:
        raise ValueError(
            f"--user_history builds a dense table of {num_users:,} users x {num_items:,} items, "
            f"{in_units(history)}, more than half of this machine's {in_units(memory)} of "
            "memory; pass --user_history=false (it is meant for logs of thousands of items)."
        )
    model, dim = values["model"], values["embedding_dim"]
    hidden = values["hidden_units"] if model == "rating" else 0  # retrieval has no MLP
    num_users = recommender_table_rows(values, num_users)
    num_items = recommender_table_rows(values, num_items)

    def weights(embedding_dim: int, hidden_units: int) -> int:
        return recommender_weights(
            model, embedding_dim, hidden_units, num_users=num_users, num_items=num_items
        )

    fitting = memory // (_WEIGHT_BYTES * copies)
    needed = weights(dim, hidden)
    if not memory or needed <= fitting:
        return
    flags = f"--embedding_dim={dim}" + (f" --hidden_units={hidden}" if hidden else "")
    held = "once (no optimizer slots)"
    if copies > 1:
        held = f"{copies} times (the weights and the optimizer's {copies - 1} slots)"
    raise ValueError(
        f"{flags} is more than this machine can train: the {model} model's {needed:,} weights "
        f"for {num_users:,} users and {num_items:,} items, held {held} at {_WEIGHT_BYTES} "
        f"bytes, need {in_units(needed * copies * _WEIGHT_BYTES)}, and it has "
        f"{in_units(memory)} of memory; pass {_recommender_fix(weights, dim, hidden, fitting)}."
    )


def _recommender_fix(
    weights: Callable[[int, int], int], dim: int, hidden: int, fitting: int
) -> str:
    """The largest --embedding_dim (or --hidden_units) that fits with the other as given; both
    smaller where neither alone does; a smaller log where not even the smallest model fits."""
    fixes = []
    if (largest := _largest(lambda d: weights(d, hidden), fitting, least=1)) >= 1:
        fixes.append(f"--embedding_dim<={largest}")
    if hidden:
        largest = _largest(lambda h: weights(dim, h), fitting, least=1)
        if largest >= 1 or weights(dim, 0) <= fitting:
            fixes.append(f"--hidden_units<={max(largest, 0)}")
    if fixes:
        return " or ".join(fixes)
    if weights(1, 0) <= fitting:
        largest = _largest(lambda d: weights(d, 0), fitting, least=1)
        return (
            "a smaller --embedding_dim and --hidden_units (e.g. "
            f"--embedding_dim<={largest} --hidden_units=0)"
        )
    return "a log with fewer users and items (not even --embedding_dim=1 fits)"


def recommender_weights(
    model: str, embedding_dim: int, hidden_units: int, *, num_users: int, num_items: int
) -> int:
    """The weights of `loops_models.recommender`'s model as loops.bin.recommender builds it:
    retrieval's two id tables; rating's id tables, bias tables, MLP (or the one Dense over both
    embeddings without hidden units) and global bias."""
    ids = num_users + num_items
    if model == "retrieval":
        return ids * embedding_dim
    width = 2 * embedding_dim  # the MLP's input: both embeddings
    if hidden_units:
        mlp = width * hidden_units + hidden_units + hidden_units + 1
    else:
        mlp = width + 1
    return ids * (embedding_dim + 1) + mlp + 1


def _largest(weights: Callable[[int], int], fitting: int, *, least: int) -> int:
    """The largest size >= `least` whose `weights(size)` (linear from `least` on) is at most
    `fitting`; below `least` when none is."""
    slope = weights(least + 1) - weights(least)
    return least + (fitting - weights(least)) // slope


# loops.bin.ctr's model sizes, as flags, in the order a sentence offers to shrink them.
_CTR_SIZES = ("embedding_dim", "hidden_units", "hidden_layers", "cross_layers")


def ctr_weights(
    model: str,
    *,
    numeric_columns: int,
    table_rows: Sequence[int],
    embedding_dim: int,
    hidden_units: int,
    hidden_layers: int,
    cross_layers: int,
) -> tuple[int, int]:
    """(its tables' weights, its other weights) of `loops_models.ctr.build_model(model, ...)`
    over `numeric_columns` numeric columns and a table of each of `table_rows` rows, as
    loops.bin.ctr builds it."""
    ids, rows = len(table_rows), sum(table_rows)

    def mlp(width: int) -> int:  # the hidden layers over `width` numbers, then the logit
        first = width * hidden_units + hidden_units
        rest = (hidden_layers - 1) * (hidden_units * hidden_units + hidden_units)
        return first + rest + hidden_units + 1

    width = numeric_columns + ids * embedding_dim  # the numbers and embeddings side by side
    if model == "wide_and_deep":  # beside a one-wide embedding of each id and a weight a number
        wide = numeric_columns + 1 if numeric_columns else 0
        return rows * (embedding_dim + 1), wide + mlp(width)
    if model == "dcn_v2":
        return rows * embedding_dim, cross_layers * (width * width + width) + mlp(width)
    # dlrm: a bottom layer and one to an embedding-wide vector, then the top MLP over that
    # vector beside the dot products of every pair of it and the embeddings.
    bottom = numeric_columns * hidden_units + hidden_units + hidden_units * embedding_dim
    pairs = (ids + 1) * ids // 2
    return rows * embedding_dim, bottom + embedding_dim + mlp(embedding_dim + pairs)


def check_ctr_fits(
    values: dict[str, Any],
    *,
    numeric_columns: int,
    tables: dict[str, int],
    copies: tuple[int, int],
    source: str,
    hashed: Sequence[str] = (),
    memory: int | None = None,
) -> None:
    """Refuses CTR settings whose weights over `tables` cannot fit in `memory` bytes, before
    the model is built: like `check_recommender_fits`, a lower bound of what training needs.

    Args:
        values: the CTR settings (model, embedding_dim, hidden_units, hidden_layers,
            cross_layers).
        numeric_columns: the table's numeric columns.
        tables: each categorical and multi-hot column's table rows, by name.
        copies: the copies of (each table weight, each other weight) training holds: the
            weights and their optimizer's slots (`loops.bin.training_settings`).
        source: what the tables are of, for the sentence ("--spec=ctr.json").
        hashed: the columns whose rows are their spec's hash_buckets (a fix to offer).
        memory: the bytes to fit in (default: `memory_bytes()`); 0 checks nothing.

    Raises:
        ValueError: the settings, what their weights need, and the largest sizes that fit.
    """
    memory = memory_bytes() if memory is None else memory
    model = values["model"]
    sizes = {name: values[name] for name in _CTR_SIZES}

    def held(sizes: dict[str, int], tables: dict[str, int]) -> int:
        weights = ctr_weights(
            model, numeric_columns=numeric_columns, table_rows=list(tables.values()), **sizes
        )
        return _WEIGHT_BYTES * (weights[0] * copies[0] + weights[1] * copies[1])

    needed = held(sizes, tables)
    if not memory or needed <= memory:
        return
    in_tables, other = ctr_weights(
        model, numeric_columns=numeric_columns, table_rows=list(tables.values()), **sizes
    )
    shown = [name for name in _CTR_SIZES if model == "dcn_v2" or name != "cross_layers"]
    fixes = []
    for name in shown:
        largest = _largest_fitting(
            lambda size, name=name: held({**sizes, name: size}, tables) <= memory, sizes[name]
        )
        if largest >= 1:
            fixes.append(f"--{name}<={largest}")
    if hashed:
        column = max(hashed, key=lambda name: tables[name])
        largest = _largest_fitting(
            lambda rows: held(sizes, {**tables, column: rows}) <= memory, tables[column]
        )
        if largest >= 1:
            fixes.append(f'"hash_buckets": {largest} (or fewer) for column {column!r}')
    fix = " or ".join(fixes) or "smaller sizes and fewer table rows (no one of them alone fits)"
    flags = " ".join(f"--{name}={sizes[name]}" for name in shown)
    held_times = f"held {_times(copies[1])}"
    if copies[0] != copies[1]:
        held_times = f"held {_times(copies[0])} in the tables and {_times(copies[1])} elsewhere"
    raise ValueError(
        f"--model={model} {flags} over {source} is more than this machine can train: its "
        f"{in_tables + other:,} weights ({in_tables:,} of them in tables of "
        f"{sum(tables.values()):,} rows), {held_times} (the weights and their optimizer's "
        f"slots) at {_WEIGHT_BYTES} bytes, need {in_units(needed)}, and it has "
        f"{in_units(memory)} of memory; pass {fix}."
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _largest_fitting(fits: Callable[[int], bool], given: int) -> int:
    """The largest size in 1..given - 1 that `fits` (true up to some size, false from it on,
    and false at `given`); 0 when not even 1 does."""
    low, high = 0, given  # fits(low) (or low 0), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
