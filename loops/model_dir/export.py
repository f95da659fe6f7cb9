"""Exports trained models as SavedModels: a classifier, a GAN generator, a text generator and a
recommender."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable

import keras
import tensorflow as tf

from loops.core.own_files import current_umask
from loops.core.text_generation import generate
from loops.model_dir.checkpoints import FinitenessCheck, describe_names
from loops.vocabulary.errors import NonFiniteWeightsError


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


class _RecommenderServer(tf.Module):
    """Holds a recommender's model and its two traced serving functions."""

    def __init__(self, model: keras.Model, top_items: Callable, pairs: Callable):
        super().__init__()
        self.model = model
        users = tf.TensorSpec([None], tf.int32, name="users")
        items = tf.TensorSpec([None], tf.int32, name="items")
        # No AutoGraph (nothing to convert): in a long process its cache of converted
        # functions was seen to hand a definition's bound method another method's
        # conversion ("tf__train_step() takes 2 positional arguments but 3 were given").
        self.serve = tf.function(top_items, input_signature=[users], autograph=False)
        self.score_pairs = tf.function(pairs, input_signature=[users, items], autograph=False)


def export_recommender(
    model: keras.Model,
    export_dir: str,
    *,
    score_all_items: Callable[[tf.Tensor], tf.Tensor],
    score_pairs: Callable[[tf.Tensor, tf.Tensor], tf.Tensor],
    top_k: int,
) -> str:
    """Saves a recommender with two signatures, both on int32 user (and item) rows.

    `serving_default`: users [n] -> `items` int32 [n, top_k], the highest
    scored items of the whole corpus in descending score, and their `scores`
    [n, top_k] (nothing left out: a client drops the items a user has).
    `score_pairs`: users [n], items [n] -> `scores` [n], each pair's score.

    Args:
        model: the model holding every weight the scores read (saved with them).
        score_all_items: users [n] -> float32 scores [n, num_items].
        score_pairs: (users [n], items [n]) -> float32 scores [n].
        top_k: the items returned a user (at most the corpus).

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and is not a SavedModel directory.
    """

    def top_items(users):
        best = tf.math.top_k(score_all_items(users), k=top_k)
        return {"items": best.indices, "scores": best.values}

    def pairs(users, items):
        return {"scores": score_pairs(users, items)}

    server = _RecommenderServer(model, top_items, pairs)
    signatures = {
        "serving_default": server.serve,
        "score_pairs": server.score_pairs,
    }
    return _save(server, export_dir, signatures=signatures)


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
        tf.saved_model.save(server, staging, signatures=signatures)
        for name, text in (files or {}).items():
            with open(os.path.join(staging, name), "x", encoding="utf-8") as stream:
                stream.write(text)
        if os.path.exists(export_dir):
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return export_dir


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
