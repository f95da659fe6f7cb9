"""Exports trained models as SavedModels: a classifier, a GAN generator, a text generator, a
recommender and a click-through model."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping

import keras
import numpy as np
import tensorflow as tf

from loops.core.own_files import current_umask
from loops.core.text_generation import generate
from loops.input.feature_tables import FittedFeatures
from loops.model_dir import id_vocabulary, run_outputs, signature_names
from loops.model_dir.checkpoints import FinitenessCheck, describe_names, write_error_reason
from loops.model_dir.prepared_rows import PreparedRows
from loops.model_dir.raw_features import RawFeatures
from loops.vocabulary.errors import NonFiniteWeightsError
from loops.vocabulary.whole_numbers import check_whole


class _Server(tf.Module):
    """Holds a model (so its variables are saved) and one traced serving function."""

    def __init__(self, model: keras.Model, serve: Callable, input_signature: tf.TensorSpec):
        super().__init__()
        self.model = model
        self.serve = tf.function(serve, input_signature=[input_signature])


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
    return _save(_Server(model, serve, signature), export_dir)


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
    return _save(_Server(generator, serve, signature), export_dir)


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
    return _save(_Server(model, serve, signature), export_dir)


def export_ctr(
    model: keras.Model,
    export_dir: str,
    *,
    files: dict[str, str] | None = None,
    fitted: FittedFeatures | None = None,
    cardinalities: Mapping[str, int] | None = None,
) -> str:
    """Saves a click-through model with a `serve` signature: its columns in, the click
    probability out.

    With `fitted` (the vocabularies, hash buckets and scales of a feature table's training
    rows), the default signature takes the raw columns (`RawFeatures`: numbers
    float64 [n], categories string [n], multi-hot values string [n] joined by the column's
    separator; a value training did not keep goes to its out-of-vocabulary row) and
    `serve_prepared` the prepared ones; a crossed column is no input of it, the columns it
    crosses are (`RawFeatures` joins them). Without `fitted`, the default
    signature takes the model's inputs, prepared as in training
    (`loops.input.feature_tables`: numeric float32 [n] normalized, categorical int32 [n]
    rows, multi-hot int32 [n, length] rows padded with -1). Each input is named
    `signature_names.served_name` of its column (native-country -> native_country).

    Each signature gives `logits` and `probabilities`, float32 [n], and `valid_row`, bool
    [n]: False for a row the model cannot score, whose logit and probability are NaN (never
    a number that reads as a prediction): a raw number training refuses (NaN, inf, a negative
    in a `normalize=log` column) or one beyond float32 once scaled, a prepared number that is
    not finite, a categorical row outside [0, rows) (-1 included) or a multi-hot one outside
    it but the padding -1. Keras and placed tables answer alike. `files` (name -> text) are
    saved beside the SavedModel, e.g. `FittedFeatures.to_json`.

    Args:
        cardinalities: each id column's table rows (CTRFeatures'); needed without `fitted`
            (which holds them) when the model has an id column.

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory; an id column of
            no known rows; two columns served under one name (`signature_names`).
    """
    tables = fitted.cardinalities() if fitted is not None else cardinalities or {}
    rows = PreparedRows(model, tables)
    dtypes = {column.name: column.dtype for column in model.inputs}
    served = signature_names.served_names(list(dtypes), "serve_prepared")
    raw_features = RawFeatures(fitted) if fitted is not None else None
    raw_signature = raw_features.signature() if raw_features is not None else None
    nan = tf.constant(np.nan, tf.float32)

    def scored(columns, takes=None):
        columns = {name: tf.cast(values, dtypes[name]) for name, values in columns.items()}
        safe, valid = rows.checked(columns)
        valid = valid if takes is None else valid & takes
        logits = tf.reshape(tf.cast(model(safe, training=False), tf.float32), [-1])
        logits = tf.where(valid, logits, nan)
        return {"logits": logits, "probabilities": tf.sigmoid(logits), "valid_row": valid}

    signature = {
        column.name: tf.TensorSpec(column.shape, column.dtype, name=served[column.name])
        for column in model.inputs
    }
    server = _Server(model, lambda columns: scored(columns), signature)
    if raw_features is None:
        return _save(server, export_dir, files=files)
    server.raw_features = raw_features
    server.serve_raw = tf.function(
        lambda columns: scored(raw_features(columns), raw_features.takes(columns)),
        input_signature=[raw_signature],
        autograph=False,  # no control flow on tensors to convert
    )
    signatures = {"serving_default": server.serve_raw, "serve_prepared": server.serve}
    return _save(server, export_dir, signatures=signatures, files=files)


class _RecommenderServer(tf.Module):
    """Holds a recommender's model, its id tables and its two traced serving functions."""

    def __init__(self, model: keras.Model, vocabulary: _Vocabulary, top_items, pairs):
        super().__init__()
        self.model = model
        # Attributes of the module, so the tables are saved (and initialized on load).
        self.user_table, self.item_table = vocabulary.user_table, vocabulary.item_table
        users = tf.TensorSpec([None], vocabulary.user_type, name="users")
        items = tf.TensorSpec([None], vocabulary.item_type, name="items")
        # No AutoGraph (nothing to convert): in a long process its cache of converted
        # functions was seen to hand a definition's bound method another method's
        # conversion ("tf__train_step() takes 2 positional arguments but 3 were given").
        self.serve = tf.function(top_items, input_signature=[users], autograph=False)
        self.score_pairs = tf.function(pairs, input_signature=[users, items], autograph=False)


class _Vocabulary:
    """The raw ids of the model's rows, their lookup tables and the popularity fallback."""

    def __init__(self, user_ids, item_ids, item_counts, top_k: int):
        self.user_ids = id_vocabulary.checked_ids("user_ids", user_ids)
        self.item_ids = id_vocabulary.checked_ids("item_ids", item_ids)
        counts = np.asarray(item_counts)
        if counts.shape != self.item_ids.shape or counts.dtype.kind not in "iu" or counts.min() < 0:
            raise ValueError(
                f"item_counts must hold a whole count >= 0 for each of the {len(self.item_ids)} "
                f"items, got {counts.dtype.name} of shape {counts.shape}"
                + (f" holding {counts.min()}" if counts.shape == self.item_ids.shape else "")
                + "; pass Interactions.item_counts() of the training log."
            )
        check_whole("top_k", top_k)
        if top_k > len(self.item_ids):
            raise ValueError(
                f"top_k={top_k} is more than the {len(self.item_ids)} items of the corpus; "
                f"pass top_k <= {len(self.item_ids)}."
            )
        # The most trained items first; among equal counts the lower index.
        self.popular = tf.constant(np.argsort(-counts, kind="stable")[:top_k], tf.int32)
        self.user_type = id_vocabulary.tensor_type(self.user_ids)
        self.item_type = id_vocabulary.tensor_type(self.item_ids)
        self.user_table = id_vocabulary.lookup_table(self.user_ids)
        self.item_table = id_vocabulary.lookup_table(self.item_ids)
        self.item_values = tf.constant(self.item_ids, self.item_type)

    def user_rows(self, users: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return _rows(self.user_table, users)

    def item_rows(self, items: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return _rows(self.item_table, items)


def _rows(table: tf.lookup.StaticHashTable, ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(int32 rows, bool known): each id's row of the model, row 0 where the id is unknown
    (its result is then replaced: an unknown id never reads another id's row)."""
    index = id_vocabulary.lookup(table, ids)
    return tf.cast(tf.maximum(index, 0), tf.int32), index >= 0


def export_recommender(
    model: keras.Model,
    export_dir: str,
    *,
    score_all_items: Callable[[tf.Tensor], tf.Tensor],
    score_pairs: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    top_k: int,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    item_counts: np.ndarray,
) -> str:
    """Saves a recommender that serves the log's own ids, with two signatures.

    Ids are sent and returned as the log has them (`Interactions.user_ids`,
    `item_ids`): int64 when they are whole numbers, else strings. Index i of
    the model's tables is `user_ids[i]` (`item_ids[i]`); the export and
    `ids.json` in it (`loops.model_dir.id_vocabulary.read_ids`) hold that map.
    A string id sent is read as the log's reader reads one (`id_vocabulary.lookup`):
    the blanks around it dropped, its accents composed or not alike, so the log's
    own bytes find their id.

    `serving_default`: `users` [n] -> `items` [n, top_k] (the item ids, highest
    score first, over the whole corpus: a client drops the items a user has),
    `scores` float32 [n, top_k], and `known_user` bool [n]. A user id the log
    does not hold (-1 included, unless the log has it) gets the `top_k` items
    with the most training interactions (`item_counts`; ties: the lower
    index), NaN scores and `known_user` False: never another user's list.
    `score_pairs`: `users` [n], `items` [n] -> `scores` float32 [n],
    `known_user` and `known_item` bool [n]; a pair with an unknown id scores
    NaN. Lists of unequal length are refused (InvalidArgumentError: "score_pairs
    takes one item a user ..."); an empty batch gives empty outputs.

    Args:
        model: the model holding every weight the scores read (saved with them).
        score_all_items: int32 user rows [n] -> float32 scores [n, num_items].
        score_pairs: (int32 user rows [n], int32 item rows [n]) -> float32 scores [n].
        top_k: the items returned a user (at most the corpus).
        user_ids, item_ids: the raw id of each user and item row, int or str, each once.
        item_counts: [num_items] each item's training interactions (the fallback's order).

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory; bad ids (two a
            request cannot tell apart among them), counts or top_k; a score_all_items that
            scores another number of items than item_ids.
    """
    vocabulary = _Vocabulary(user_ids, item_ids, item_counts, top_k)
    _check_scores_every_item(score_all_items, len(vocabulary.item_ids))
    nan = tf.constant(np.nan, tf.float32)

    def top_items(users):
        rows, known = vocabulary.user_rows(users)
        best = tf.math.top_k(score_all_items(rows), k=top_k)
        items = tf.where(known[:, None], best.indices, vocabulary.popular[None, :])
        return {
            "items": tf.gather(vocabulary.item_values, items),
            "scores": tf.where(known[:, None], best.values, nan),
            "known_user": known,
        }

    def pairs(users, items):
        same_length = tf.debugging.assert_equal(
            tf.size(users),
            tf.size(items),
            message="score_pairs takes one item a user: send users and items of one length "
            "(pair i is users[i], items[i])",
        )
        with tf.control_dependencies([same_length]):
            user_rows, known_user = vocabulary.user_rows(users)
            item_rows, known_item = vocabulary.item_rows(items)
        scores = score_pairs(user_rows, item_rows)
        return {
            "scores": tf.where(known_user & known_item, scores, nan),
            "known_user": known_user,
            "known_item": known_item,
        }

    server = _RecommenderServer(model, vocabulary, top_items, pairs)
    signatures = {"serving_default": server.serve, "score_pairs": server.score_pairs}
    ids = id_vocabulary.ids_json(vocabulary.user_ids, vocabulary.item_ids)
    return _save(server, export_dir, signatures=signatures, files={id_vocabulary.ID_FILE: ids})


def _check_scores_every_item(score_all_items: Callable, num_items: int) -> None:
    scored = int(score_all_items(tf.zeros([1], tf.int32)).shape[-1])
    if scored != num_items:
        raise ValueError(
            f"score_all_items scores {scored} items and item_ids names {num_items}; pass the "
            "raw id of each item row of the model (Interactions.item_ids of its log)."
        )


def _save(
    server: tf.Module,
    export_dir: str,
    *,
    signatures: dict | None = None,
    files: dict[str, str] | None = None,
) -> str:
    """Saves next to `export_dir`, then renames: a crash never leaves half an export.

    `files` (name -> text) are written into the export beside the SavedModel.
    """
    if os.path.exists(export_dir) and not tf.saved_model.contains_saved_model(export_dir):
        raise ValueError(
            f"export_dir {export_dir!r} exists and holds no SavedModel; refusing to replace "
            "it. Pass a new directory or remove it."
        )
    bad = FinitenessCheck(server.model).nonfinite_names()
    if bad:
        raise NonFiniteWeightsError(
            f"Refusing to export to {export_dir}: {describe_names(bad)} not finite (NaN or inf)."
        )
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    prefix = staging_prefix(export_dir)
    _remove_abandoned_staging(parent, prefix)
    staging = tempfile.mkdtemp(dir=parent, prefix=f"{prefix}{os.getpid()}-")
    try:
        os.chmod(staging, 0o777 & ~current_umask())
        if signatures is None:
            signatures = {"serving_default": server.serve}
        try:
            tf.saved_model.save(server, staging, signatures=signatures)
            for name, text in {**(files or {}), **run_outputs.marker_files()}.items():
                with open(os.path.join(staging, name), "x", encoding="utf-8") as stream:
                    stream.write(text)
        except (OSError, tf.errors.OpError) as error:
            raise OSError(_unwritten_export(export_dir, server.model, error)) from error
        if os.path.exists(export_dir):
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return export_dir


def _unwritten_export(export_dir: str, model: keras.Model, error: BaseException) -> str:
    """The sentence of an export that could not be written (a full disk, a read-only
    folder): where, why, about how much space it needs, and that nothing else is lost."""
    weights = sum(
        int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size
        for variable in model.variables
    )
    return (
        f"Could not write the export to {export_dir} ({write_error_reason(error)}); it needs "
        f"about {max(weights / 2**20, 0.1):.1f} MB free beside it (its weights, and its graph) "
        "and nothing of it was kept. Free space or pass another --export_dir; the run's "
        "checkpoints are intact, and the same command exports again without training."
    )


def staging_prefix(export_dir: str) -> str:
    """`.export-NAME-OWNER-`: the start of the staging folders' names of exports to
    `export_dir` from this host (then `PID-` and 8 random characters), OWNER a digest of
    the host and the export's absolute path, so no other export's staging folder matches."""
    target = os.path.abspath(export_dir)
    owner = hashlib.sha256(f"{socket.gethostname()}\0{target}".encode()).hexdigest()[:12]
    return f".export-{os.path.basename(target)[:64]}-{owner}-"


def _remove_abandoned_staging(parent: str, prefix: str) -> None:
    """Removes the staging folders of earlier exports to this export's directory whose
    process is gone (killed mid-export); another export's, or a live one's, stay."""
    for name in os.listdir(parent):
        match = re.fullmatch(r"(\d+)-\w{8}", name[len(prefix) :])
        if name.startswith(prefix) and match and not _process_alive(int(match.group(1))):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
