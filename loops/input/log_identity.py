"""What a run trained on, recorded with it so that a resume on other data is refused: a
recommender's interaction log (path, size, content hash, id maps), its split and the model
kind; a click-through run's feature table and spec (or the generated log's settings), its
split and the model.

A run's checkpoint holds a row of each user and item index, so the same file
with its ids permuted, another held-out set or another kind of model would
go on training other users' rows, or test on rows it trained on. `identity`
is JSON (config.json and the checkpoint keep it); `changes` names each part
of it that differs. Hashes are streamed (a large log is read in chunks) and
nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from loops.input.interaction_logs import Interactions

_CHUNK_BYTES = 1 << 20
# The flag of each setting of the split, and its key in an identity's "split".
_SPLIT_KEYS = {
    "split": "how",
    "test_fraction": "test_fraction",
    "validation_fraction": "validation_fraction",
    "seed": "seed",
    "shuffle_window": "shuffle_window",  # a sharded log's stream (None for any other)
}
# What a record from before validation splits (loops 5.2) means: no validation rows.
_NO_VALIDATION = {"validation_fraction": 0.0, "validation_rows": 0}


def identity(
    model: str,
    interactions: Interactions,
    train: Interactions,
    test: Interactions,
    *,
    path: str | None,
    how: str,
    test_fraction: float,
    seed: int,
    validation: Interactions | None = None,
    validation_fraction: float = 0.0,
) -> dict[str, Any]:
    """The model kind, the log and the split a run trains on, as JSON.

    Args:
        model: the kind of model ("retrieval", "rating").
        interactions, train, test: the whole log read from `path` (or generated when
            `path` is None) and its split.
        how, test_fraction, seed: the split's settings (`interaction_logs.split`); the
            seed counts for a random split only.
        validation, validation_fraction: the rows carved from the training rows for
            validation (`interaction_logs.split_validation`); None and 0.0 for none.
    """
    return {
        "model": model,
        "log": log_identity(interactions, path),
        "split": {
            "how": how,
            "test_fraction": test_fraction,
            "validation_fraction": validation_fraction,
            "seed": seed if how == "random" else None,
            "train_rows": len(train),
            "validation_rows": 0 if validation is None else len(validation),
            "test_rows": len(test),
        },
    }


def table_identity(
    model: str,
    *,
    files: Mapping[str, str],
    generated: Mapping[str, Any],
    test_fraction: float,
    validation_fraction: float,
    seed: int,
) -> dict[str, Any]:
    """The model, the files read (or the generator's settings) and the random split a run
    over a feature table trains on, as JSON; read from the files alone (no split is drawn).

    Args:
        model: the --model.
        files: flag -> the file it names ({"data": table, "spec": its spec}); {} for
            generated rows.
        generated: flag -> value of the generator's settings ({} for a file's rows).
        test_fraction, validation_fraction, seed: the random split's settings.
    """
    return {
        "model": model,
        "files": {flag: file_record(path) for flag, path in files.items()},
        "generated": dict(generated),
        "split": {
            "how": "random",
            "test_fraction": test_fraction,
            "validation_fraction": validation_fraction,
            "seed": seed,
        },
    }


def file_record(path: str) -> dict[str, Any]:
    """The file's absolute path, size and SHA-256."""
    return {
        "path": os.path.abspath(path),
        "bytes": os.path.getsize(path),
        "sha256": file_sha256(path),
    }


def shards_record(root: str, shards: Mapping[str, Any]) -> dict[str, Any]:
    """A sharded log as `file_record` records a file: its root, its bytes and the SHA-256 of
    its shards' identities (`loops.input.sharded_logs.ShardedLog.identity`: names, sizes and
    checksums), so that a shard changed, added or gone is another log."""
    text = json.dumps(dict(shards), sort_keys=True).encode("utf-8")
    return {
        "path": os.path.abspath(root),
        "bytes": sum(shard["size"] for shard in shards["shards"]),
        "sha256": hashlib.sha256(text).hexdigest(),
    }


def log_identity(interactions: Interactions, path: str | None) -> dict[str, Any]:
    """The file's absolute path, size and SHA-256 (of its rows' arrays for a log with no
    file), the user and item counts, and the SHA-256 of each id map (the raw ids in index
    order: which user or item each embedding row belongs to)."""
    if path is None:
        rows = [
            interactions.users,
            interactions.items,
            interactions.ratings,
            interactions.timestamps,
        ]
        content = hashlib.sha256()
        for array in rows:
            content.update(np.ascontiguousarray(array).tobytes())
        where, size, digest = None, sum(array.nbytes for array in rows), content.hexdigest()
    else:
        where, size, digest = os.path.abspath(path), os.path.getsize(path), file_sha256(path)
    return {
        "path": where,
        "source": None if path is not None else interactions.source,
        "bytes": size,
        "sha256": digest,
        "users": interactions.num_users,
        "items": interactions.num_items,
        "user_ids_sha256": ids_sha256(interactions.user_ids),
        "item_ids_sha256": ids_sha256(interactions.item_ids),
    }


def file_sha256(path: str) -> str:
    """The SHA-256 of the file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def ids_sha256(ids: np.ndarray) -> str:
    """The SHA-256 of raw ids in index order: whole numbers as 8-byte integers, names as
    lines of UTF-8 (no id holds a line break), each kind hashed apart from the other."""
    if ids.dtype.kind in "iu":
        return hashlib.sha256(b"int64:" + ids.astype("<i8").tobytes()).hexdigest()
    text = "\n".join(str(value) for value in ids.tolist())
    return hashlib.sha256(b"str:" + text.encode()).hexdigest()


def changes(was: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each difference of `now` from `was` (two `identity` records) that a resume cannot take,
    in words: "X here and Y in the run". The same content under another path is none."""
    found = []
    if now.get("model") != was.get("model"):
        found.append(
            f"--model={now.get('model')} here and --model={was.get('model')} in the run (its "
            "checkpoint holds the other kind's embeddings and optimizer slots)"
        )
    found += _log_changes(was.get("log") or {}, now.get("log") or {})
    found += _table_changes(was, now)
    found += _split_changes(was.get("split") or {}, now.get("split") or {})
    return found


def _log_changes(was: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    content = ("bytes", "sha256", "source")
    if all(now.get(key) == was.get(key) for key in content):
        found = []
    elif now.get("path") and now.get("path") == was.get("path"):
        found = [
            f"the log {now['path']} changed since the run read it ({_content(now)} here and "
            f"{_content(was)} in the run)"
        ]
    else:
        found = [f"{_log_name(now)} here and {_log_name(was)} in the run"]
    for role in ("user", "item"):
        count, ids = f"{role}s", f"{role}_ids_sha256"
        if now.get(count) != was.get(count) or now.get(ids) != was.get(ids):
            found.append(
                f"its {role} ids map to other rows ({now.get(count)} {role}s, id map "
                f"sha256 {_short(now.get(ids))} here and {was.get(count)}, "
                f"{_short(was.get(ids))} in the run)"
            )
    return found


def _table_changes(was: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The files' or the generator's changes of two `table_identity` records; none for two
    recommender records (which hold neither)."""
    was_files, now_files = was.get("files") or {}, now.get("files") or {}
    if bool(was_files) != bool(now_files):
        return [f"{_table_name(now)} here and {_table_name(was)} in the run"]
    found = []
    for flag in sorted(set(was_files) | set(now_files)):
        before, after = was_files.get(flag) or {}, now_files.get(flag) or {}
        if all(after.get(key) == before.get(key) for key in ("bytes", "sha256")):
            continue  # the same content, perhaps moved
        if after.get("path") == before.get("path"):
            found.append(
                f"--{flag}={after.get('path')} changed since the run read it "
                f"({_content(after)} here and {_content(before)} in the run)"
            )
        else:
            found.append(
                f"--{flag}={after.get('path')} ({_content(after)}) here and "
                f"--{flag}={before.get('path')} ({_content(before)}) in the run"
            )
    was_generated, now_generated = was.get("generated") or {}, now.get("generated") or {}
    found += [
        f"--{flag}={now_generated.get(flag)} here and --{flag}={was_generated.get(flag)} in the run"
        for flag in sorted(set(was_generated) | set(now_generated))
        if now_generated.get(flag) != was_generated.get(flag)
    ]
    return found


def _table_name(record: Mapping[str, Any]) -> str:
    """A table identity's rows in words: the files it read, or the generated log's settings."""
    files = record.get("files") or {}
    if files:
        return " and ".join(
            f"--{flag}={file.get('path')} ({_content(file)})"
            for flag, file in sorted(files.items())
        )
    settings = ", ".join(
        f"--{flag}={value}" for flag, value in sorted((record.get("generated") or {}).items())
    )
    return f"the generated log ({settings})"


def _split_changes(was: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    was, now = {**_NO_VALIDATION, **was}, {**_NO_VALIDATION, **now}
    # The seed draws a random split only: another split names no seed.
    names = (
        ("split", "test_fraction", "validation_fraction")
        if now.get("how") != was.get("how")
        else _SPLIT_KEYS
    )
    found = [
        f"--{name}={now.get(_SPLIT_KEYS[name])} here and --{name}={was.get(_SPLIT_KEYS[name])} "
        "in the run"
        for name in names
        if now.get(_SPLIT_KEYS[name]) != was.get(_SPLIT_KEYS[name])
    ]
    rows = ("train_rows", "validation_rows", "test_rows")
    if not found and any(now.get(key) != was.get(key) for key in rows):
        found.append(
            f"the split gives {now.get('train_rows')} train, {now.get('validation_rows')} "
            f"validation and {now.get('test_rows')} test rows here and "
            f"{was.get('train_rows')}, {was.get('validation_rows')} and "
            f"{was.get('test_rows')} in the run"
        )
    return found


def _log_name(log: Mapping[str, Any]) -> str:
    """The log by its path (or as generated), size and content hash."""
    name = f"the log {log['path']}" if log.get("path") else "the generated log"
    return f"{name} ({_content(log)})"


def _content(log: Mapping[str, Any]) -> str:
    return f"{log.get('bytes')} bytes, sha256 {_short(log.get('sha256'))}"


def _short(digest: Any) -> str:
    """The first 12 hex digits: enough to tell two contents apart in a sentence."""
    return str(digest)[:12] if digest else "unrecorded"


def refusal(model_dir: str, found: list[str], now: Mapping[str, Any] | None = None) -> str:
    """The sentence that refuses to go on from `model_dir`'s checkpoints, naming `found`;
    `now` (this run's identity) says whether the run read a feature table or a log."""
    if now is not None and "files" in now:
        files, generated = now.get("files") or {}, now.get("generated") or {}
        data = ", ".join(f"--{flag}" for flag in (*files, *generated))
        if files:
            data += " (the same files, unchanged)"
        return (
            f"The checkpoints in {model_dir} were trained on another model, data or split: "
            f"{'; '.join(found)}. Going on would restore weights built for other columns or "
            f"train and test on other rows. Pass the run's own --model, {data}, --test_fraction, "
            "--validation_fraction and --seed, or a new --model_dir to train on this data."
        )
    return (
        f"The checkpoints in {model_dir} were trained on another model, log or split: "
        f"{'; '.join(found)}. Going on would train and test rows that belong to other "
        "users, items or splits. Pass the run's own --model, --data (the same file, "
        "unchanged), --split, --test_fraction, --validation_fraction and --seed, or a new "
        "--model_dir to train on this data."
    )
