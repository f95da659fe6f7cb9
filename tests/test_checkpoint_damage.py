"""A damaged model_dir never restarts a run from scratch or costs an intact checkpoint."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import tiny_batches


def make_loop(model_dir, lines=None):
    def model_fn():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=3)),
            ]
        )

    progress = loops.testing.quiet_progress()
    if lines is not None:
        progress.line = lines.append
    return loops.Trainer(
        loops.ClassifierLoop(model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.SGD(0.01)),
        strategy=loops.testing.replica_strategy(1),
        train_data=tiny_batches(),
        steps_per_loop=2,
        checkpoint_every=2,
        max_checkpoints=5,
        model_dir=model_dir,
        progress=progress,
    )


@pytest.fixture
def trained_dir(tmp_path):
    """A model_dir with checkpoints at steps 2, 4 and 6."""
    loop = make_loop(str(tmp_path))
    loop.train(6)
    loop.close()
    return str(tmp_path)


def checkpoint_bytes(model_dir, steps):
    """File name -> bytes of every file of the checkpoints at `steps`."""
    files = {}
    for step in steps:
        for path in glob.glob(os.path.join(model_dir, "checkpoints", f"ckpt-{step}.*")):
            with open(path, "rb") as stream:
                files[os.path.basename(path)] = stream.read()
    return files


def resume(model_dir):
    lines = []
    loop = make_loop(model_dir, lines)
    return loop, "\n".join(lines)


def state_file(model_dir):
    return os.path.join(model_dir, "checkpoints", "checkpoint")


@pytest.mark.parametrize(
    "damage, restored_step, said",
    [
        ("delete the newest index", 4, "ckpt-6.index is missing"),
        ("truncate the newest data", 4, "ckpt-6 is damaged (its files do not read"),
        ("delete the state file", 6, "state file"),
        ("garble the state file", 6, "state file"),
        ("fill the state file with binary bytes", 6, "state file"),
        ("point the state file at a missing checkpoint", 6, "state file"),
    ],
)
def test_resumes_from_the_newest_intact_checkpoint(trained_dir, damage, restored_step, said):
    checkpoints = os.path.join(trained_dir, "checkpoints")
    if damage == "delete the newest index":
        os.remove(os.path.join(checkpoints, "ckpt-6.index"))
    elif damage == "truncate the newest data":
        (data,) = glob.glob(os.path.join(checkpoints, "ckpt-6.data-*"))
        with open(data, "r+b") as stream:
            stream.truncate(os.path.getsize(data) // 2)
    elif damage == "delete the state file":
        os.remove(state_file(trained_dir))
    elif damage == "garble the state file":
        with open(state_file(trained_dir), "w") as stream:
            stream.write("model_checkpoint_path: {{{ not a proto")
    elif damage == "fill the state file with binary bytes":
        with open(state_file(trained_dir), "wb") as stream:
            stream.write(b"\x80\x81\xff\x00 not text")
    else:
        with open(state_file(trained_dir), "w") as stream:
            stream.write(
                'model_checkpoint_path: "ckpt-99"\nall_model_checkpoint_paths: "ckpt-99"\n'
            )
    older = checkpoint_bytes(trained_dir, [2, 4])
    loop, output = resume(trained_dir)
    assert loop.state.step == restored_step
    assert said in output
    assert (
        f"restored {os.path.join(checkpoints, f'ckpt-{restored_step}')} at step {restored_step}"
        in output
    )
    loop.train(10)
    loop.close()
    assert loop.state.step == 10
    # Training on never touched the older checkpoints, and the state file reads again.
    assert checkpoint_bytes(trained_dir, [2, 4]) == older
    _, output = resume(trained_dir)
    assert "restored" in output and "at step 10" in output and "damaged" not in output


def test_refuses_when_no_checkpoint_reads_and_changes_nothing(trained_dir):
    checkpoints = os.path.join(trained_dir, "checkpoints")
    for index in glob.glob(os.path.join(checkpoints, "ckpt-*.index")):
        with open(index, "r+b") as stream:
            stream.truncate(10)
    before = checkpoint_bytes(trained_dir, [2, 4, 6])
    with pytest.raises(
        loops.DamagedCheckpointError,
        match=r"holds checkpoint files, but none can be read \(.*ckpt-6: its files "
        r"do not read.*ckpt-2: .*point --model_dir at a new directory",
    ):
        make_loop(trained_dir)
    assert checkpoint_bytes(trained_dir, [2, 4, 6]) == before
    # The refused loop gave its lock back.
    assert not os.path.exists(os.path.join(trained_dir, ".lock"))


def test_a_state_file_that_does_not_read_with_no_checkpoint_is_dropped(tmp_path):
    os.makedirs(os.path.join(tmp_path, "checkpoints"))
    with open(state_file(str(tmp_path)), "wb") as stream:
        stream.write(b"\x80\x81\xff\x00 not text")
    loop, output = resume(str(tmp_path))
    assert f"the checkpoint state file {state_file(str(tmp_path))} did not read" in output
    assert loop.state.step == 0
    loop.train(2)
    loop.close()
    _, output = resume(str(tmp_path))
    assert "at step 2" in output and "did not read" not in output


def test_a_killed_save_leaves_nothing_the_next_run_keeps(trained_dir):
    checkpoints = os.path.join(trained_dir, "checkpoints")
    os.makedirs(os.path.join(checkpoints, "ckpt-8_temp"))
    with open(os.path.join(trained_dir, ".results.abc.tmp"), "w") as stream:
        stream.write("{")
    os.makedirs(os.path.join(trained_dir, ".export-123-abc"))
    loop, _ = resume(trained_dir)
    assert loop.state.step == 6
    assert sorted(name for name in os.listdir(trained_dir) if name.startswith(".")) == [".lock"]
    assert not glob.glob(os.path.join(checkpoints, "*_temp"))
    loop.close()
    assert not os.path.exists(os.path.join(trained_dir, ".lock"))


def test_results_and_config_get_the_users_file_mode(trained_dir):
    previous = os.umask(0o022)
    try:
        loop, _ = resume(trained_dir)
        loop.train(8)
        loop.close()
    finally:
        os.umask(previous)
    for name in ("results.json", "config.json"):
        assert oct(os.stat(os.path.join(trained_dir, name)).st_mode & 0o777) == oct(0o644), name


def test_unwritable_model_dirs_get_a_sentence(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(
        ValueError,
        match=f"model_dir '{blocker}/run' cannot be written .*Pass a "
        "--model_dir in a writable place",
    ):
        make_loop(str(blocker / "run"))
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.access(read_only, os.W_OK):  # root writes anywhere: make the write fail another way
        read_only.chmod(0o755)
        (read_only / ".lock").mkdir()
    with pytest.raises(ValueError, match=f"model_dir '{read_only}' cannot be written"):
        make_loop(str(read_only))


def test_a_failed_save_names_the_directory_and_keeps_the_older_checkpoints(trained_dir):
    loop, _ = resume(trained_dir)
    before = checkpoint_bytes(trained_dir, [2, 4, 6])
    checkpoints = os.path.join(trained_dir, "checkpoints")
    # Where the next save would put its temporary shards, a file: the write fails.
    with open(os.path.join(checkpoints, "ckpt-8_temp"), "w") as stream:
        stream.write("")
    with pytest.raises(
        OSError,
        match=f"Could not write a checkpoint into {checkpoints} .*the "
        "checkpoints already there are intact",
    ):
        loop.train(8)
    loop.close()
    assert checkpoint_bytes(trained_dir, [2, 4, 6]) == before


# A parameter server gone during a save, as TensorFlow groups it: the class is the first
# root error's, which need not be UnavailableError.
LOST_SERVER = (
    "2 root error(s) found.\n  (0) UNAVAILABLE: failed to connect to all addresses; last "
    "error: UNKNOWN: ipv4:127.0.0.1:42797: Failed to connect to remote host: Connection "
    "refused\nAdditional GRPC error information from remote target /job:ps/replica:0/task:0 "
    "while calling /tensorflow.eager.EagerService/Enqueue"
)


def test_a_save_that_lost_a_server_is_not_worded_as_a_disk_problem(tmp_path, monkeypatch):
    from loops.cluster import lost_task
    from loops.model_dir.checkpoints import Checkpointer

    checkpointer = Checkpointer(
        strategy=tf.distribute.get_strategy(),
        directory=str(tmp_path),
        items={"weight": tf.Variable(1.0)},
        step_counter=tf.Variable(4, dtype=tf.int64),
        max_to_keep=3,
    )
    assert checkpointer.save().endswith("ckpt-4")
    tf_config = {
        "cluster": {"chief": ["127.0.0.1:40000"], "ps": ["127.0.0.1:42797"]},
        "task": {"type": "chief", "index": 0},
    }
    for error_class in (tf.errors.UnknownError, tf.errors.UnavailableError):

        def refuse(*_, error_class=error_class, **__):
            raise error_class(None, None, LOST_SERVER)

        monkeypatch.setattr(tf.train.CheckpointManager, "save", refuse)
        # Raised as it is, for the Trainer's sentence naming the server (ClusterTaskLostError).
        with pytest.raises(error_class) as raised:
            checkpointer.save()
        sentence = lost_task.lost_task_sentence(raised.value.message, tf_config)
        assert sentence.startswith(
            "chief_0 lost ps_0 at 127.0.0.1:42797: it stopped answering (its process died, its "
            "host went down, or the network between them failed), so the run stopped; every "
            "step up to the last checkpoint is saved."
        )
    # A full disk on a server's shard comes from a remote target too, and is still the disk's.
    full = "Additional GRPC error information from remote target /job:ps/replica:0/task:0"

    def no_space(*_, **__):
        raise tf.errors.ResourceExhaustedError(None, None, f"No space left on device\n{full}")

    monkeypatch.setattr(tf.train.CheckpointManager, "save", no_space)
    with pytest.raises(OSError) as raised:
        checkpointer.save()
    assert str(raised.value) == (
        f"Could not write a checkpoint into {tmp_path} (No space left on device). Free space "
        "or make the directory writable (or pass another --model_dir); the checkpoints "
        "already there are intact."
    )


def test_no_checkpoint_ever_holds_a_nonfinite_variable(tmp_path):
    class PoisonAfterStep4(loops.Action):
        def after_loop(self, loop, step, train_metrics):
            if step == 4:
                loop.definition.model.layers[-1].kernel.assign(
                    np.full((64, 10), np.inf, np.float32)
                )

    loop = make_loop(str(tmp_path))
    loop.controller.actions = (PoisonAfterStep4(),)
    with pytest.raises(
        loops.NonFiniteError,
        match=r"Refusing to save a checkpoint at step 4: 1 variable \(.*kernel\) is "
        "not finite",
    ):
        loop.train(8)
    loop.close()
    names = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "checkpoints/*.index")))
    assert names == ["ckpt-2.index"]


class InfiniteAfterStep2(keras.optimizers.schedules.LearningRateSchedule):
    """0.01 for two steps, then inf: the loss and gradients stay finite, the update does not."""

    def __call__(self, step):
        return tf.where(step >= 2, float("inf"), 0.01)

    def get_config(self):
        return {}


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_an_update_that_is_not_finite_stops_the_run_at_its_last_finite_checkpoint(tmp_path, policy):
    def model_fn():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )

    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.SGD(InfiniteAfterStep2())
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=tiny_batches(),
        steps_per_loop=4,
        checkpoint_every=1,
        on_nonfinite=policy,
        model_dir=str(tmp_path),
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(
        loops.NonFiniteError,
        match=r"After step 3, 2 variables \(.*\) are not finite .* an update itself "
        r"was not finite\. .* back at its last checkpoint \(step 2\)",
    ):
        loop.train(6)
    loop.close()
    assert loop.state.step == 2
    assert all(np.all(np.isfinite(value)) for value in loops.testing.loop_weights(loop).values())
    prefixes = sorted(p[: -len(".index")] for p in glob.glob(str(tmp_path / "checkpoints/*.index")))
    assert [os.path.basename(p) for p in prefixes] == ["ckpt-1", "ckpt-2"]
    for prefix in prefixes:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.all(np.isfinite(value)), (prefix, name)


def test_the_settings_a_checkpoint_records_are_read_without_building_anything(tmp_path):
    """What refuses another global batch size before the trainer is built: the newest
    checkpoint's record, or None where the restore must decide (none, or it does not read)."""
    from loops.run.checkpoint_keeper import SETTINGS_RECORD, SettingsRecord, recorded_settings

    model_dir, directory = str(tmp_path), tmp_path / "checkpoints"
    assert recorded_settings(model_dir) is None
    record = SettingsRecord()
    checkpoint = tf.train.Checkpoint(**{SETTINGS_RECORD: record})
    for step, batch_size in ((4, 64), (8, 32)):
        record.settings = {"global_batch_size": batch_size}
        checkpoint.write(str(directory / f"ckpt-{step}"))
    assert recorded_settings(model_dir) == {"global_batch_size": 32}
    (directory / "ckpt-8.index").write_bytes(b"damaged")
    assert recorded_settings(model_dir) is None
    tf.train.Checkpoint(other=tf.Variable(1.0)).write(str(directory / "ckpt-12"))
    assert recorded_settings(model_dir) is None  # written before the record existed
