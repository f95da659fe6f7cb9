"""A recommender run records its interaction log's identity (path, size, content hash, id maps),
its split and its model kind, and a resume or an evaluation that changes any of them is
refused before the Trainer is built, naming what changed; a relative --data is recorded as
the absolute path, which an evaluator started elsewhere reads."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from conftest import run_python
from loops.input import interaction_logs, log_identity
from loops.model_dir import run_config

# 8 users with 3 interactions each, over 11 items: (user, item, rating, timestamp).
ROWS = [
    (user, (7 * user + k) % 11, 1 + (user + k) % 5, 1000 + 10 * user + k)
    for user in range(8)
    for k in range(3)
]


def write_log(path, user_name=lambda user: f"u{user}"):
    """A CSV log of ROWS at `path`, user u named `user_name(u)`; the path as a str."""
    lines = [f"{user_name(u)},i{i},{r},{t}\n" for u, i, r, t in ROWS]
    path.write_text("user,item,rating,timestamp\n" + "".join(lines))
    return str(path)


def identity_of(
    path, model="rating", split="random", test_fraction=0.2, seed=0, validation_fraction=0.1
):
    """The identity the recommender binary records for these flags."""
    log = interaction_logs.read_interactions(path)
    train, test = interaction_logs.split(log, how=split, test_fraction=test_fraction, seed=seed)
    validation = None
    if validation_fraction:
        train, validation = interaction_logs.split_validation(
            train, how=split, validation_fraction=validation_fraction, seed=seed
        )
    return log_identity.identity(
        model,
        log,
        train,
        test,
        path=path,
        how=split,
        test_fraction=test_fraction,
        seed=seed,
        validation=validation,
        validation_fraction=validation_fraction,
    )


def refusal(model_dir, was, now):
    """check_resume's sentence against a checkpoint recording `was`; None when it goes on."""
    try:
        accepted = run_config.check_resume(
            model_dir,
            {run_config.RESUME_IDENTITY: now},
            checkpoint_record={run_config.RESUME_IDENTITY: was},
        )
    except ValueError as error:
        return str(error)
    assert accepted == {}
    return None


def short(path):
    """The first 12 hex digits of the file's SHA-256, as a refusal names a content."""
    with open(path, "rb") as stream:
        return hashlib.sha256(stream.read()).hexdigest()[:12]


FIX = (
    "Going on would train and test rows that belong to other users, items or splits. Pass "
    "the run's own --model, --data (the same file, unchanged), --split, --test_fraction, "
    "--validation_fraction and --seed, or a new --model_dir to train on this data."
)


def test_the_identity_holds_the_absolute_path_size_content_hash_id_maps_and_split(
    tmp_path, monkeypatch
):
    write_log(tmp_path / "log.csv")
    monkeypatch.chdir(tmp_path)
    recorded = identity_of("log.csv")
    content = (tmp_path / "log.csv").read_bytes()
    user_ids = "\n".join(f"u{user}" for user in range(8)).encode()
    item_ids = "\n".join(sorted(f"i{item}" for item in range(11))).encode()
    assert recorded == {
        "model": "rating",
        "log": {
            "path": str(tmp_path / "log.csv"),
            "source": None,
            "bytes": len(content),
            "sha256": hashlib.sha256(content).hexdigest(),
            "users": 8,
            "items": 11,
            "user_ids_sha256": hashlib.sha256(b"str:" + user_ids).hexdigest(),
            "item_ids_sha256": hashlib.sha256(b"str:" + item_ids).hexdigest(),
        },
        "split": {
            "how": "random",
            "test_fraction": 0.2,
            "validation_fraction": 0.1,
            "seed": 0,
            "train_rows": 17,
            "validation_rows": 2,
            "test_rows": 5,
        },
    }
    # The seed draws a random split only; the time split holds each user's last 0.34 (1 of 3)
    # for test and the latest half of the 2 left (1) for validation.
    time_split = identity_of(
        "log.csv", split="time", test_fraction=0.34, seed=5, validation_fraction=0.5
    )
    assert time_split["split"] == {
        "how": "time",
        "test_fraction": 0.34,
        "validation_fraction": 0.5,
        "seed": None,
        "train_rows": 8,
        "validation_rows": 8,
        "test_rows": 8,
    }
    # Whole-number ids hash as 8-byte integers in index order, names apart from numbers.
    assert (
        log_identity.ids_sha256(np.array([3, 7], np.int64))
        == hashlib.sha256(b"int64:" + np.array([3, 7], "<i8").tobytes()).hexdigest()
    )
    hashes = {
        log_identity.ids_sha256(ids)
        for ids in (np.array([3, 7]), np.array([7, 3]), np.array(["3", "7"]))
    }
    assert len(hashes) == 3


def test_a_log_rewritten_with_permuted_ids_is_refused_naming_the_changed_content(tmp_path):
    path = write_log(tmp_path / "log.csv")
    was, before = identity_of(path), short(path)
    write_log(tmp_path / "log.csv", user_name=lambda user: f"u{(user + 1) % 8}")
    now = identity_of(path)
    # The same users, items and size: only the content tells the logs apart.
    assert {key: now["log"][key] for key in ("bytes", "users", "user_ids_sha256")} == {
        key: was["log"][key] for key in ("bytes", "users", "user_ids_sha256")
    }
    size = os.path.getsize(path)
    assert refusal(str(tmp_path), was, now) == (
        f"The checkpoints in {tmp_path} were trained on another model, log or split: the log "
        f"{path} changed since the run read it ({size} bytes, sha256 {short(path)} here and "
        f"{size} bytes, sha256 {before} in the run). " + FIX
    )


def test_another_split_fraction_seed_model_or_log_is_refused_naming_each_change(tmp_path):
    path = write_log(tmp_path / "log.csv")
    was = identity_of(path)
    model_dir = str(tmp_path)
    start = f"The checkpoints in {model_dir} were trained on another model, log or split: "
    time_split = identity_of(path, split="time", test_fraction=0.34, validation_fraction=0.5)
    assert refusal(model_dir, was, time_split) == (
        start + "--split=time here and --split=random in the run; --test_fraction=0.34 here "
        "and --test_fraction=0.2 in the run; --validation_fraction=0.5 here and "
        "--validation_fraction=0.1 in the run. " + FIX
    )
    # Another validation share trains on other rows: a resume with it is refused, and a
    # record from before validation splits (none) goes on only with --validation_fraction=0.
    assert refusal(model_dir, was, identity_of(path, validation_fraction=0.2)) == (
        start + "--validation_fraction=0.2 here and --validation_fraction=0.1 in the run. " + FIX
    )
    old = identity_of(path, validation_fraction=0)
    for key in ("validation_fraction", "validation_rows"):
        del old["split"][key]
    assert refusal(model_dir, old, identity_of(path, validation_fraction=0)) is None
    assert refusal(model_dir, old, was) == (
        start + "--validation_fraction=0.1 here and --validation_fraction=0.0 in the run. " + FIX
    )
    assert refusal(model_dir, was, identity_of(path, seed=3)) == (
        start + "--seed=3 here and --seed=0 in the run. " + FIX
    )
    assert refusal(model_dir, was, identity_of(path, model="retrieval")) == (
        start + "--model=retrieval here and --model=rating in the run (its checkpoint holds "
        "the other kind's embeddings and optimizer slots). " + FIX
    )
    # Another file with other users: its content, its user ids and (another size) its split.
    other = write_log(tmp_path / "other.csv", user_name=lambda user: f"v{user}")
    now = identity_of(other, test_fraction=0.25)
    size = os.path.getsize(path)
    user_ids = (now["log"]["user_ids_sha256"][:12], was["log"]["user_ids_sha256"][:12])
    assert refusal(model_dir, was, now) == (
        f"{start}the log {other} ({size} bytes, sha256 {short(other)}) here and the log "
        f"{path} ({size} bytes, sha256 {short(path)}) in the run; its user ids map to other "
        f"rows (8 users, id map sha256 {user_ids[0]} here and 8, {user_ids[1]} in the run); "
        "--test_fraction=0.25 here and --test_fraction=0.2 in the run. " + FIX
    )


def test_the_same_log_goes_on_also_copied_elsewhere_and_config_json_speaks_for_an_old_checkpoint(
    tmp_path,
):
    path = write_log(tmp_path / "log.csv")
    was = identity_of(path)
    assert refusal(str(tmp_path), was, identity_of(path)) is None
    copy = str(tmp_path / "copy.csv")
    shutil.copyfile(path, copy)
    assert refusal(str(tmp_path), was, identity_of(copy)) is None
    # The checkpoint keeps the identity beside the batch size; a checkpoint without one
    # (written before it was recorded) is compared with config.json's.
    config = {"global_batch_size": 8, run_config.RESUME_IDENTITY: was, "data": path}
    assert run_config.exact_only_settings(config) == {
        "global_batch_size": 8,
        run_config.RESUME_IDENTITY: was,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"--model=retrieval here and --model=rating in the run"):
        run_config.check_resume(
            str(tmp_path), {run_config.RESUME_IDENTITY: identity_of(path, model="retrieval")}
        )


def test_each_checkpoint_keeps_the_identity_and_it_is_read_without_building_anything(tmp_path):
    import tensorflow as tf

    from loops.run.checkpoint_keeper import SETTINGS_RECORD, SettingsRecord, recorded_settings

    path = write_log(tmp_path / "log.csv")
    settings = {"global_batch_size": 8, run_config.RESUME_IDENTITY: identity_of(path)}
    record = SettingsRecord()
    # tf.Module's attribute tracking wraps the dicts inside; the record holds plain JSON.
    record.settings = settings
    tf.train.Checkpoint(**{SETTINGS_RECORD: record}).write(str(tmp_path / "checkpoints/ckpt-2"))
    assert record.settings == recorded_settings(str(tmp_path)) == settings


# One process, the binary's main called in turn (the binaries' flags share absl's one
# registry, so not in pytest's process): a run on a relative --data; a resume on the log
# rewritten with permuted ids (refused, no Trainer built); a resume on the original log; an
# evaluator started in another directory, given no --data.
BINARY_RUNS = r"""
import json, os, shutil, sys
from absl import app, flags
from absl.testing import flagsaver
from loops.bin import recommender
from loops.run.trainer import Trainer

def main(*argv):
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        try:
            recommender.main(flags.FLAGS(["loops-recommender", *argv]))
        except app.UsageError as error:
            return str(error)
    return None

def steps(run_dir):
    with open(os.path.join(run_dir, "results.json")) as stream:
        return [entry["step"] for entry in json.load(stream)["history"]]

def no_trainer(*arguments, **keywords):
    raise AssertionError("the Trainer was built before the refusal")

run_dir, elsewhere = sys.argv[1:3]
common = ["--model=rating", f"--model_dir={run_dir}", "--steps_per_loop=2", "--eval_every=2",
          "--checkpoint_every=2", "--global_batch_size=8", "--embedding_dim=4"]
found = {"first": main("--data=log.csv", "--train_steps=4", *common)}
found["first_steps"] = steps(run_dir)
shutil.copyfile("log.csv", "original.csv")
shutil.copyfile("permuted.csv", "log.csv")
built = Trainer.__init__
Trainer.__init__ = no_trainer
found["permuted"] = main("--data=log.csv", "--train_steps=8", *common)
Trainer.__init__ = built
shutil.copyfile("original.csv", "log.csv")
found["resumed"] = main("--data=log.csv", "--train_steps=8", *common)
found["resumed_steps"] = steps(run_dir)
os.chdir(elsewhere)
found["evaluator"] = main("--mode=evaluate_checkpoints", f"--model_dir={run_dir}",
                          "--train_steps=8")
print("FOUND " + json.dumps(found))
"""


def test_the_binary_refuses_a_permuted_log_goes_on_with_the_same_and_its_evaluator_reads_it(
    tmp_path,
):
    work, elsewhere, run_dir = tmp_path / "work", tmp_path / "elsewhere", tmp_path / "run"
    work.mkdir()
    elsewhere.mkdir()
    path = write_log(work / "log.csv")
    write_log(work / "permuted.csv", user_name=lambda user: f"u{(user + 1) % 8}")
    done = run_python(BINARY_RUNS, str(run_dir), str(elsewhere), cwd=str(work))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.split("FOUND ", 1)[1])
    size = os.path.getsize(path)
    assert found == {
        "first": None,
        "first_steps": [2, 4],
        "permuted": (
            f"The checkpoints in {run_dir} were trained on another model, log or split: the "
            f"log {path} changed since the run read it ({size} bytes, sha256 "
            f"{short(work / 'permuted.csv')} here and {size} bytes, sha256 {short(path)} in "
            "the run). " + FIX
        ),
        "resumed": None,
        "resumed_steps": [2, 4, 6, 8],
        "evaluator": None,
    }
    config = json.loads((run_dir / "config.json").read_text())
    assert config["data"] == path  # absolute, though given as log.csv
    assert config[run_config.RESUME_IDENTITY] == identity_of(path)
    from loops.run.checkpoint_keeper import recorded_settings

    assert recorded_settings(str(run_dir)) == {
        "global_batch_size": 8,
        run_config.RESUME_IDENTITY: identity_of(path),
    }
    took = [line for line in done.stdout.splitlines() if line.startswith("evaluator: took")]
    assert took == [
        f"evaluator: took the run's settings from {run_dir}/config.json: --data={path}, "
        "--model=rating, --embedding_dim=4"
    ]
    evaluations = json.loads((run_dir / "evaluator" / "history.json").read_text())
    results = json.loads((run_dir / "results.json").read_text())
    trained = {entry["step"]: entry["rmse"] for entry in results["history"]}
    # The 3 checkpoints kept, each with the trainer's numbers.
    assert [entry["step"] for entry in evaluations["evaluations"]] == [4, 6, 8]
    for entry in evaluations["evaluations"]:
        assert entry["metrics"]["rmse"] == pytest.approx(trained[entry["step"]], rel=1e-6)


def test_a_generated_log_is_known_by_its_rows_hash_and_another_seed_is_refused(tmp_path):
    from loops_data.interactions import generated_log

    def generated(seed):
        log = generated_log(num_users=20, num_items=10, num_interactions=100, seed=seed)
        train, test = interaction_logs.split(log, seed=seed)
        recorded = log_identity.identity(
            "retrieval", log, train, test, path=None, how="random", test_fraction=0.2, seed=seed
        )
        return log, recorded

    log, was = generated(0)
    rows = b"".join(
        array.tobytes() for array in (log.users, log.items, log.ratings, log.timestamps)
    )
    assert {key: was["log"][key] for key in ("path", "source", "bytes", "sha256")} == {
        "path": None,
        "source": log.source,
        "bytes": len(rows),
        "sha256": hashlib.sha256(rows).hexdigest(),
    }
    assert generated(0)[1] == was
    now = generated(1)[1]
    assert refusal(str(tmp_path), was, now) == (
        f"The checkpoints in {tmp_path} were trained on another model, log or split: the "
        f"generated log ({now['log']['bytes']} bytes, sha256 {now['log']['sha256'][:12]}) "
        f"here and the generated log ({len(rows)} bytes, sha256 {was['log']['sha256'][:12]}) "
        "in the run; --seed=1 here and --seed=0 in the run. " + FIX
    )
