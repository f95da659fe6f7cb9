"""Delta exports: what changed from one export of a model to a later one (each variable's
rows that differ, or the variable whole where that is smaller; the files that differ,
compressed),
written atomically as one link of a chain (`write_delta`), and applied to the export it
follows (`apply_deltas`) to give the later export's variables and files bit for bit, each
link checked by the exports' content fingerprints (`fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from loops.model_dir import checkpoints
from loops.model_dir import export as export_lib

DELTA_FILE = "delta.json"  # in each delta: what it follows, gives and holds
FORMAT = 2  # 2: the changed files zlib-compressed (1: as they are, still applied)
_TENSORS = "tensors"  # the delta's tensors: a TensorFlow checkpoint bundle of this prefix
_FILES = "files"  # the export's files that changed, by their path in the export
_VARIABLES = os.path.join("variables", "variables")
_STAGING = ".delta-"  # then the writer's PID, "-" and 8 random characters


def fingerprint(export_dir: str) -> str:
    """The SHA-256 of an export's content: each variable's key, dtype, shape and values, and
    each other file's path and bytes. Two exports of one fingerprint answer alike; a patched
    export has the fingerprint of the export it stands for."""
    return _fingerprint_of(*_content(export_dir))


def _content(export_dir: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """An export's variables by key and its other files' digests by path, read once for its
    fingerprint and its delta."""
    return _variables(export_dir), _file_digests(export_dir)


def _fingerprint_of(variables: Mapping[str, np.ndarray], files: Mapping[str, str]) -> str:
    """`fingerprint` of an export's `_content`."""
    digest = hashlib.sha256()
    for key, value in sorted(variables.items()):
        digest.update(f"v\0{key}\0{value.dtype.str}\0{value.shape}\0".encode())
        digest.update(_value_bytes(value))
    for name, file_digest in sorted(files.items()):
        digest.update(f"f\0{name}\0{file_digest}\0".encode())
    return digest.hexdigest()


def write_delta(base_export: str, export_dir: str, deltas_dir: str) -> str:
    """Writes into `deltas_dir` the delta from `base_export` to `export_dir` (two exports of
    one model, e.g. yesterday's run and today's continuation of it) and returns its path,
    `deltas_dir/NNNNNN` (one past the newest there). It is staged beside and renamed into
    place whole: a kill while it is written leaves the deltas before it as they were. A delta
    there from the same export to the same one is kept (and returned) in its place; one from
    the same export to another (the run exported again) is removed once the new one is in.

    Raises:
        ValueError: either directory holds no SavedModel.
        OSError: it could not be written (nothing of it is kept).
    """
    for directory in (base_export, export_dir):
        _check_export(directory)
    before, after = _content(base_export), _content(export_dir)
    follows, gives = _fingerprint_of(*before), _fingerprint_of(*after)
    os.makedirs(deltas_dir, exist_ok=True)
    export_lib.remove_abandoned_staging(deltas_dir, _STAGING)
    earlier = [os.path.join(deltas_dir, name) for name in _deltas_in(deltas_dir)]
    superseded = []
    for path in earlier:
        manifest = read_delta(path)
        if manifest["follows"] == follows:
            if manifest["gives"] == gives:
                return path
            superseded.append(path)
    staging = tempfile.mkdtemp(dir=deltas_dir, prefix=f"{_STAGING}{os.getpid()}-")
    try:
        _staged((base_export, before, follows), (export_dir, after, gives), staging)
        newest = int(os.path.basename(earlier[-1])) if earlier else 0
        target = os.path.join(deltas_dir, f"{newest + 1:06d}")
        _fsync_tree(staging)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for path in superseded:
        shutil.rmtree(path, ignore_errors=True)
    return target


def _staged(before: tuple, after: tuple, staging: str) -> dict[str, Any]:
    """Writes the delta from `before` to `after` (each an export's directory, `_content` and
    fingerprint) into `staging`: its tensors, the changed files and delta.json, last."""
    (base_dir, (base, was), follows), (new_dir, (new, now), gives) = before, after
    entries: dict[str, Any] = {}
    tensors: dict[str, np.ndarray] = {}
    sizes = {"rows": 0, "whole": 0, "files": 0}
    touched = 0
    for number, (key, value) in enumerate(sorted(new.items())):
        if key in base and _same(base[key], value):
            continue
        rows = _changed_rows(base.get(key), value)
        entry: dict[str, Any] = {"tensor": f"t{number}", "shape": list(value.shape)}
        if rows is None:
            tensors[f"t{number}/whole"] = value
            entry["whole"] = True
            sizes["whole"] += len(_value_bytes(value))
        else:
            tensors[f"t{number}/rows"] = rows
            tensors[f"t{number}/values"] = value[rows]
            entry["rows"] = int(len(rows))
            touched += len(rows)
            sizes["rows"] += len(_value_bytes(value[rows]))
        entries[key] = entry
    if tensors:
        checkpoints.write_tensors(os.path.join(staging, _TENSORS), tensors)
    changed = sorted(name for name, digest in now.items() if was.get(name) != digest)
    for name in changed:
        # Compressed: a graph (saved_model.pb) changes with every export and shrinks 8-fold.
        target = os.path.join(staging, _FILES, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(os.path.join(new_dir, name), "rb") as source, open(target, "xb") as sink:
            sink.write(zlib.compress(source.read(), 9))
        sizes["files"] += os.path.getsize(target)
    manifest = {
        "format": FORMAT,
        "follows": follows,
        "gives": gives,
        "from_export": os.path.abspath(base_dir),
        "to_export": os.path.abspath(new_dir),
        "variables": entries,
        "removed_variables": sorted(set(base) - set(new)),
        "files": changed,
        "removed_files": sorted(set(was) - set(now)),
        "touched_rows": touched,
        "bytes": sizes,
    }
    with open(os.path.join(staging, DELTA_FILE), "x", encoding="utf-8") as stream:
        json.dump(manifest, stream, indent=1)
    return manifest


def read_delta(path: str) -> dict[str, Any]:
    """A delta's delta.json.

    Raises:
        ValueError: `path` holds no delta (or one of another format), naming it.
    """
    try:
        with open(os.path.join(path, DELTA_FILE), encoding="utf-8") as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{path} holds no delta export ({error}); pass a directory written by "
            "--export_deltas (MODEL_DIR/deltas/NNNNNN) or the deltas/ folder holding them."
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") not in (1, FORMAT):
        raise ValueError(
            f"{path}/{DELTA_FILE} is not a delta of format {FORMAT}; write it again with "
            "this version of loops."
        )
    return manifest


def delta_paths(paths: Iterable[str]) -> list[str]:
    """Each of `paths` as the deltas it names: a delta itself, or a deltas/ folder's deltas
    in their order."""
    found: list[str] = []
    for path in paths:
        if os.path.isfile(os.path.join(path, DELTA_FILE)) or not os.path.isdir(path):
            found.append(path)
        else:
            found.extend(os.path.join(path, name) for name in _deltas_in(path))
    return found


def apply_deltas(export_dir: str, deltas: Sequence[str], output_dir: str) -> dict[str, Any]:
    """Writes into `output_dir` (new; staged and renamed) `export_dir` patched by `deltas`
    (deltas or deltas/ folders, `delta_paths`), applied in the order of their chain: each
    must follow the export as the deltas before it left it (its `follows` fingerprint).
    Returns {"applied": the deltas in order, "fingerprint": the output's}.

    Raises:
        ValueError: a delta that follows no export of the chain (a gap, another model's),
            naming it, the fingerprint it follows and the export's; an output that exists.
    """
    _check_export(export_dir)
    if os.path.exists(output_dir):
        raise ValueError(
            f"--output={output_dir!r} exists; pass a new directory (the patched export is "
            "written whole, never over another)."
        )
    variables, digests = _content(export_dir)
    start = _fingerprint_of(variables, digests)
    chain = _chained(start, export_dir, delta_paths(deltas))
    # Each file of the output: where its bytes are, and whether they are compressed.
    files = {name: (os.path.join(export_dir, name), False) for name in digests}
    for path, manifest in chain:
        _patch(variables, files, path, manifest)
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(dir=parent, prefix=f"{_STAGING}{os.getpid()}-")
    try:
        for name, (source, compressed) in files.items():
            os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
            if not compressed:
                shutil.copyfile(source, os.path.join(staging, name))
                continue
            with open(source, "rb") as packed, open(os.path.join(staging, name), "xb") as sink:
                sink.write(zlib.decompress(packed.read()))
        checkpoints.write_tensors(os.path.join(staging, _VARIABLES), variables)
        got = fingerprint(staging)
        want = chain[-1][1]["gives"] if chain else start
        if got != want:  # a damaged delta: never left in place as if it were the export
            raise ValueError(
                f"{export_dir} patched by {chain[-1][0]} has the fingerprint {got}, and the "
                f"delta says it gives {want}: a delta's files were changed; write it again."
            )
        _fsync_tree(staging)
        os.replace(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"applied": [path for path, _ in chain], "fingerprint": got}


def _chained(start: str, export_dir: str, paths: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """`paths`' deltas in the order of their chain from the fingerprint `start`.

    Raises:
        ValueError: a delta left over that follows none of the chain.
    """
    pending = [(path, read_delta(path)) for path in paths]
    chain: list[tuple[str, dict[str, Any]]] = []
    current = start
    while pending:
        following = [item for item in pending if item[1]["follows"] == current]
        if not following:
            path, manifest = pending[0]
            raise ValueError(
                f"the delta {path} follows the export of fingerprint {manifest['follows'][:16]}"
                f" ({manifest['from_export']}), and {export_dir} patched by the deltas before "
                f"it has {current[:16]}: a gap in the chain or another model's delta. Pass "
                "the export it follows, or every delta from this export on."
            )
        chain.append(following[0])
        pending.remove(following[0])
        current = following[0][1]["gives"]
    return chain


def _patch(variables: dict, files: dict, path: str, manifest: Mapping[str, Any]) -> None:
    """Applies one delta to the export's `variables` (key -> array) and `files` (name ->
    (where its bytes are now, whether they are zlib-compressed there))."""
    reader: Any = None
    if manifest["variables"]:
        reader = tf.train.load_checkpoint(os.path.join(path, _TENSORS))
    for key in manifest["removed_variables"]:
        variables.pop(key, None)
    for key, entry in manifest["variables"].items():
        tensor = entry["tensor"]
        if entry.get("whole"):
            variables[key] = _array(reader.get_tensor(f"{tensor}/whole"))
            continue
        value = _resized(variables[key], entry["shape"])
        value[reader.get_tensor(f"{tensor}/rows")] = _array(reader.get_tensor(f"{tensor}/values"))
        variables[key] = value
    for name in manifest["removed_files"]:
        files.pop(name, None)
    for name in manifest["files"]:
        files[name] = (os.path.join(path, _FILES, name), manifest["format"] >= 2)


def _resized(value: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """A copy of `value` with the first dimension of `shape` (rows added at the end, which
    the delta fills, or the last ones dropped)."""
    if list(value.shape) == list(shape):
        return value.copy()
    resized = np.zeros(shape, value.dtype)
    kept = min(value.shape[0], shape[0])
    resized[:kept] = value[:kept]
    return resized


def _changed_rows(old: np.ndarray | None, new: np.ndarray) -> np.ndarray | None:
    """The rows of `new` that differ from `old` (the added ones included; int32 indices
    where they fit); None where it goes whole: no rows (a scalar), no `old` of its dtype and
    row shape, or where the rows and their indices would take more bytes than it whole."""
    if old is None or new.ndim == 0 or old.dtype != new.dtype or old.shape[1:] != new.shape[1:]:
        return None
    kept = min(len(old), len(new))
    if new.dtype == object:  # strings, compared as the bytes they are
        differs = (old[:kept] != new[:kept]).reshape(kept, -1).any(axis=1)
    else:  # compared as bytes: a NaN equals itself, and -0.0 differs from 0.0
        differs = np.any(_as_bytes(old[:kept]) != _as_bytes(new[:kept]), axis=1)
    index = np.int32 if len(new) < 2**31 else np.int64
    rows = np.concatenate([np.flatnonzero(differs), np.arange(kept, len(new))]).astype(index)
    row_bytes = len(_value_bytes(new[:1])) if len(new) else 0
    sent = len(rows) * (row_bytes + np.dtype(index).itemsize)
    return None if sent >= len(_value_bytes(new)) else rows


def _same(old: np.ndarray, new: np.ndarray) -> bool:
    """Whether two tensors are one: dtype, shape and bytes."""
    return (
        old.dtype == new.dtype and old.shape == new.shape and _value_bytes(old) == _value_bytes(new)
    )


def _as_bytes(rows: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), -1)


def _variables(export_dir: str) -> dict[str, np.ndarray]:
    """Every tensor of the export's variables bundle by key (strings as object arrays)."""
    reader = tf.train.load_checkpoint(os.path.join(export_dir, _VARIABLES))
    return {key: _array(reader.get_tensor(key)) for key in reader.get_variable_to_shape_map()}


def _array(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=object) if isinstance(value, bytes) else np.asarray(value)


def _value_bytes(value: np.ndarray) -> bytes:
    """A tensor's values as bytes: numbers as stored, strings each after its length."""
    if value.dtype == object:
        return b"".join(len(item).to_bytes(8, "little") + item for item in value.ravel())
    return np.ascontiguousarray(value).tobytes()


def _file_digests(export_dir: str) -> dict[str, str]:
    """The SHA-256 of each file of the export but its variables bundle, by relative path."""
    digests = {}
    for root, _, names in os.walk(export_dir):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, export_dir)
            if relative.startswith(_VARIABLES + "."):
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as stream:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(chunk)
            digests[relative] = digest.hexdigest()
    return digests


def _fsync_tree(directory: str) -> None:
    """Flushes every file and folder under `directory` to disk before it is renamed into
    place: a crash after the rename finds it whole."""
    for root, _, names in os.walk(directory, topdown=False):
        for name in [*names, "."]:
            descriptor = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)


def _deltas_in(deltas_dir: str) -> list[str]:
    return sorted(
        name
        for name in os.listdir(deltas_dir)
        if name.isdigit() and os.path.isfile(os.path.join(deltas_dir, name, DELTA_FILE))
    )


def _check_export(directory: str) -> None:
    if not tf.saved_model.contains_saved_model(directory):
        raise ValueError(
            f"{directory} holds no SavedModel; pass the directory of an export (the run's "
            "--export_dir, MODEL_DIR/export by default)."
        )
