"""What every kind's export shares: the module a SavedModel holds (`Server`) and the atomic
write of an export (`save`: staged beside its directory, refused with a weight that is not
finite, its files and the run's marker written with it, then renamed into place; the staging
folders of exports killed midway removed). Each kind's export is its own module beside this
one: `classifier_export`, `gan_export`, `lm_export`, `ctr_export`, `recommender_export`."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from loops.core.own_files import current_umask
from loops.model_dir import run_outputs
from loops.model_dir.checkpoints import FinitenessCheck, describe_names, write_error_reason
from loops.vocabulary.errors import NonFiniteWeightsError


class Server(tf.Module):
    """Holds a model (so its variables are saved) and one traced serving function."""

    def __init__(self, model: keras.Model, serve: Callable, input_signature: tf.TensorSpec):
        super().__init__()
        self.model = model
        self.serve = tf.function(serve, input_signature=[input_signature])


def save(
    server: tf.Module,
    export_dir: str,
    *,
    signatures: dict | None = None,
    files: dict[str, str] | None = None,
) -> str:
    """Saves `server` (its `model` checked finite first) next to `export_dir`, then renames: a
    crash never leaves half an export.

    `signatures` default to `server.serve` as serving_default; `files` (name -> text) are
    written into the export beside the SavedModel, and the run's marker with them
    (`run_outputs.marker_files`).

    Returns:
        export_dir.

    Raises:
        ValueError: export_dir exists and holds no SavedModel.
        NonFiniteWeightsError: a weight of the model is NaN or inf.
        OSError: the export could not be written (a full disk, a read-only folder).
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
    remove_abandoned_staging(parent, prefix)
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


def remove_abandoned_staging(parent: str, prefix: str) -> None:
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
