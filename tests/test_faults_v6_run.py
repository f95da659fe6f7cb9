"""A run preempted at its last step and rerun keeps one record of its best evaluation: the kept
best's, in the run's own last checkpoint too (issue 64, item 15)."""

import contextlib
import json
import os
import subprocess

import pytest
import tensorflow as tf

import loops
from conftest import Counter, make_trainer
from loops.run.faults import preemption

# The eval loss at each step (evaluations every 2 steps): step 10's 2.0 is the best; step
# 12's 2.5 beats only the record of step 4.
SCRIPT = {2: 5.0, 4: 3.0, 6: 4.0, 8: 3.5, 10: 2.0, 12: 2.5}
BEST_KEY = "action_keep_best/best/.ATTRIBUTES/VARIABLE_VALUE"


class ScriptedLoop(Counter):
    def run_evaluation(self, run):
        return {"loss": SCRIPT[self.step], "num_examples": 10}


def scripted(model_dir):
    return make_trainer(
        ScriptedLoop,
        strategy=loops.testing.replica_strategy(2),
        model_dir=model_dir,
        eval_every=2,
        steps_per_loop=2,
        actions=[loops.KeepBest("loss")],
    )


def test_a_rerun_of_a_run_preempted_at_its_last_step_saves_the_best_it_finds(tmp_path, monkeypatch):
    first = scripted(str(tmp_path))
    # A preemption noted during the last inner loop: the run saves step 10 unevaluated.
    monkeypatch.setattr(
        preemption.PreemptionWatcher, "should_stop", lambda self: first.state.step >= 10
    )
    first.train(10)
    first.close()
    assert first.state.preempted and first.state.step == 10
    monkeypatch.undo()
    assert tf.train.load_checkpoint(str(tmp_path / "checkpoints")).get_tensor(BEST_KEY) == 3.0

    rerun = scripted(str(tmp_path))
    rerun.train(10)  # nothing to train: it evaluates step 10 and keeps it as the best
    rerun.close()
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert (record["step"], record["value"]) == (10, 2.0)
    # The run's own checkpoint of step 10 holds the same record (before: 3.0, step 4's).
    assert tf.train.load_checkpoint(str(tmp_path / "checkpoints")).get_tensor(BEST_KEY) == 2.0

    longer = scripted(str(tmp_path))
    longer.train(12)  # 2.5 at step 12 is no better than the kept 2.0
    longer.close()
    record = json.loads((tmp_path / "best" / "best.json").read_text())
    assert (record["step"], record["value"]) == (10, 2.0)
    assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("ckpt-10")


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 64 KiB file system that a file already fills (item 12)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mount_point], check=True)
    try:
        with contextlib.suppress(OSError), open(mount_point / "filler", "wb") as filler:
            while True:
                filler.write(b"x" * 4096)
                filler.flush()
        yield mount_point
    finally:
        subprocess.run(["umount", mount_point], check=True)


def test_a_checkpoint_on_a_full_disk_says_so_in_whole_words_and_leaves_no_temp_folder(full_disk):
    from loops.model_dir.checkpoints import Checkpointer

    directory = full_disk / "best"
    checkpointer = Checkpointer(
        strategy=tf.distribute.get_strategy(),
        directory=str(directory),
        items={"weights": tf.Variable(tf.ones([64, 64]))},
        step_counter=tf.Variable(10, dtype=tf.int64),
        max_to_keep=1,
    )
    with pytest.raises(OSError) as raised:
        checkpointer.save()
    # Before: "...; No s)", TensorFlow's message cut at 200 characters, and ckpt-10_temp.
    assert str(raised.value) == (
        f"Could not write a checkpoint into {directory} (No space left on device). Free space "
        "or make the directory writable (or pass another --model_dir); the checkpoints "
        "already there are intact."
    )
    assert not [name for name in os.listdir(directory) if name.startswith("ckpt-10")]


def test_an_export_to_a_full_disk_says_where_and_how_much_and_keeps_nothing(full_disk):
    import keras

    from loops.model_dir.classifier_export import export_classifier

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten()])
    model.add(keras.layers.Dense(256))  # 16,640 weights: 65 KB, more than the disk has
    export_dir = full_disk / "export"
    with pytest.raises(OSError) as raised:
        export_classifier(model, str(export_dir))
    # Before: TensorFlow's ResourceExhaustedError and its traceback.
    assert str(raised.value) == (
        f"Could not write the export to {export_dir} (No space left on device); it needs "
        "about 0.1 MB free beside it (its weights, and its graph) and nothing of it was kept. "
        "Free space or pass another --export_dir; the run's checkpoints are intact, and the "
        "same command exports again without training."
    )
    assert sorted(os.listdir(full_disk)) == ["filler"]  # no export, no staging folder


def test_workers_agree_on_a_preemption_through_one_traced_function():
    import signal
    import types

    strategy = loops.testing.replica_strategy(2)
    placement = types.SimpleNamespace(strategy=strategy, workers_stop_together=True)
    with preemption.PreemptionWatcher(placement) as watcher:
        assert [watcher.should_stop() for _ in range(3)] == [False] * 3
        os.kill(os.getpid(), signal.SIGTERM)
        assert watcher.should_stop() and watcher.should_stop()
    # Before: strategy.run of a new lambda, eagerly, at every boundary: a warning of its
    # overhead and a new trace each time (TensorFlow's retracing warning), on every worker.
    assert watcher._signalled_anywhere.experimental_get_tracing_count() == 1


def test_an_export_holds_its_marker_before_it_is_renamed_into_place(tmp_path):
    import keras

    from loops.model_dir import run_outputs
    from loops.model_dir.classifier_export import export_classifier

    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten()])
    model.add(keras.layers.Dense(2))
    with run_outputs.exports_of(str(tmp_path / "run")):
        path = export_classifier(model, str(tmp_path / "served"))
    # Written with the SavedModel, in its staging folder (before: just after the rename).
    assert run_outputs.export_writer(path) == os.path.realpath(tmp_path / "run")
    unmarked = export_classifier(model, str(tmp_path / "other"))
    assert run_outputs.export_writer(unmarked) is None  # outside exports_of: no marker
