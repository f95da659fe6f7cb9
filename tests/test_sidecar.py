"""The evaluator beside training: each checkpoint a run keeps is evaluated once, as it appears,
with the numbers of an in-process evaluation of that checkpoint, without the run's lock."""

import fcntl
import glob
import json
import os
import re
import shutil
import time

import keras
import pytest
import tensorflow as tf

import loops
from conftest import read_results, tiny_batches
from loops import checkpoints, reporting
from loops.sidecar import HISTORY_FILE, evaluator_directory

TRAIN_STEPS = 10
KEPT_STEPS = [6, 8, 10]  # checkpoints every 2 steps, the newest 3 kept
RTOL = 1e-5  # the trainer's own evaluation ran on 2 replicas, the evaluator's on 1


def make_loop(*, model_dir=None, replicas=1, width=16, lines=None):
    def model_fn():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(
                    width, "relu", kernel_initializer=keras.initializers.GlorotUniform(seed=1)
                ),
                keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=2)),
            ]
        )

    progress = loops.testing.quiet_progress()
    if lines is not None:
        progress.line = lines.append
    return loops.ClassifierLoop(
        strategy=loops.testing.replica_strategy(replicas),
        model_fn=model_fn,
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        train_data=tiny_batches(global_batch_size=8, count=40, shuffle_seed=1),
        eval_data=tiny_batches(global_batch_size=8, count=21, seed=5),
        steps_per_loop=2,
        eval_every=2,
        checkpoint_every=2,
        max_checkpoints=3,
        model_dir=model_dir,
        progress=progress,
    )


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run's model_dir: 10 steps on 2 replicas, its checkpoints of steps 6, 8 and 10 kept."""
    model_dir = str(tmp_path_factory.mktemp("run"))
    trainer = make_loop(model_dir=model_dir, replicas=2)
    trainer.train(TRAIN_STEPS)
    trainer.close()
    return model_dir


@pytest.fixture
def run_dir(finished_run, tmp_path):
    """A copy of the finished run for one test to evaluate."""
    copy = str(tmp_path / "run")
    shutil.copytree(finished_run, copy)
    return copy


def in_process_evaluation(loop, prefix):
    """The metrics of `loop` (no model_dir) given the weights of the checkpoint `prefix`."""
    tf.train.Checkpoint(model=loop.model).read(prefix).expect_partial()
    return loop.run_evaluation()


def eval_scalars(directory):
    """tag -> {step: value} of the eval summaries in `directory`."""
    scalars = {}
    for path in glob.glob(os.path.join(directory, "eval", "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def trainer_files(model_dir):
    """Path -> (size, mtime) of every file of the run outside MODEL_DIR/evaluator."""
    files = {}
    for parent, folders, names in os.walk(model_dir):
        if parent == model_dir:
            folders[:] = [name for name in folders if name != reporting.EVALUATOR_DIRECTORY]
        for name in names:
            status = os.stat(os.path.join(parent, name))
            files[os.path.join(parent, name)] = (status.st_size, status.st_mtime_ns)
    return files


def test_every_kept_checkpoint_is_evaluated_once_with_an_in_process_evaluations_numbers(run_dir):
    kept = checkpoints.listed_checkpoints(os.path.join(run_dir, "checkpoints"))
    assert [step for step, _ in kept] == KEPT_STEPS
    # A live trainer holds the run's lock: the evaluator never needs it.
    with open(os.path.join(run_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        files_before = trainer_files(run_dir)
        lines = []
        loop = make_loop(lines=lines)
        history = loops.evaluate_checkpoints(
            loop, run_dir, train_steps=TRAIN_STEPS, poll_seconds=0.05
        )
    assert loop.executor.eval_function.experimental_get_tracing_count() == 1
    assert [(entry["step"], entry["checkpoint"]) for entry in history] == kept
    trainer_history = {entry["step"]: entry for entry in read_results(run_dir)["history"]}
    reference = make_loop()
    for entry in history:
        expected = in_process_evaluation(reference, entry["checkpoint"])
        assert sorted(entry["metrics"]) == ["accuracy", "loss", "num_examples"]
        assert entry["metrics"] == pytest.approx(expected, rel=1e-6, abs=0)
        # And the trainer's own evaluation at that step, in memory, on 2 replicas.
        assert entry["metrics"] == pytest.approx(
            {name: trainer_history[entry["step"]][name] for name in expected}, rel=RTOL
        )
    assert [line for line in lines if line.startswith("eval at step")] == [
        f"eval at step {step} | {reporting.format_metrics(entry['metrics'])}"
        for step, entry in zip(KEPT_STEPS, history)
    ]
    assert lines[-1].startswith(
        f"evaluator: the run ended at step {TRAIN_STEPS}; handled 3 checkpoint(s) now, 3 in all"
    )
    # History and TensorBoard scalars, at each checkpoint's step, in MODEL_DIR/evaluator only.
    directory = evaluator_directory(run_dir)
    with open(os.path.join(directory, HISTORY_FILE)) as stream:
        assert json.load(stream) == {"model_dir": run_dir, "evaluations": history}
    scalars = eval_scalars(directory)
    assert sorted(scalars["loss"]) == KEPT_STEPS
    for entry in history:
        assert scalars["loss"][entry["step"]] == pytest.approx(entry["metrics"]["loss"])
    assert trainer_files(run_dir) == files_before

    # Started again, it goes on after the last checkpoint it handled: nothing is new.
    lines = []
    again = loops.evaluate_checkpoints(
        make_loop(lines=lines), run_dir, train_steps=TRAIN_STEPS, poll_seconds=0.05
    )
    assert again == history
    assert not [line for line in lines if line.startswith("eval at step")]
    assert "handled 0 checkpoint(s) now, 3 in all" in lines[-1]


def test_a_checkpoint_deleted_before_it_is_read_is_skipped_with_a_note(run_dir):
    def rotate_step_8_away(line):
        # The trainer's rotation deletes the files of a listed checkpoint meanwhile.
        lines.append(line)
        if line.startswith("eval at step 6"):
            for path in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-8.*")):
                os.remove(path)

    lines = []
    loop = make_loop()
    loop.progress.line = rotate_step_8_away
    history = loops.evaluate_checkpoints(loop, run_dir, train_steps=TRAIN_STEPS, poll_seconds=0.05)
    assert [entry["step"] for entry in history] == KEPT_STEPS
    assert "metrics" in history[0] and "metrics" in history[2]
    assert history[1]["skipped"] == (
        "deleted before it was read (the trainer keeps only its newest checkpoints, "
        "max_checkpoints)"
    )
    assert "metrics" not in history[1]
    assert (
        "evaluator: skipped ckpt-8: deleted before it was read (the trainer keeps only its "
        "newest checkpoints, max_checkpoints)"
    ) in lines
    assert sorted(eval_scalars(evaluator_directory(run_dir))["loss"]) == [6, 10]


def test_no_new_checkpoint_before_the_run_ends_times_out_and_a_rerun_goes_on(run_dir):
    # The run was asked for 12 steps but stopped at 10 (results.json: 10, no stop reason):
    # it has not ended, and no checkpoint comes.
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        loops.evaluate_checkpoints(
            make_loop(), run_dir, train_steps=12, poll_seconds=0.05, timeout_seconds=0.5
        )
    waited = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith(
        f"No new checkpoint in {os.path.join(run_dir, 'checkpoints')} for 0.5 s, and the run "
        "has not ended (the newest it handled is step 10; results.json does not say it ended)."
    )
    assert "run the evaluator again to go on from there" in message
    assert waited < 30  # 0.5 s after the last evaluation, plus three evaluations
    history_path = os.path.join(evaluator_directory(run_dir), HISTORY_FILE)
    with open(history_path) as stream:
        assert [entry["step"] for entry in json.load(stream)["evaluations"]] == KEPT_STEPS

    # Without train_steps, results.json decides: the run ended at 10, all handled.
    lines = []
    history = loops.evaluate_checkpoints(make_loop(lines=lines), run_dir, poll_seconds=0.05)
    assert [entry["step"] for entry in history] == KEPT_STEPS
    assert "the run ended at step 10; handled 0 checkpoint(s) now" in lines[-1]


def test_wrong_loops_and_arguments_are_refused_with_the_fix(run_dir, tmp_path):
    with pytest.raises(ValueError, match="needs a loop built with model_dir=None"):
        loops.evaluate_checkpoints(make_loop(model_dir=str(tmp_path / "own")), run_dir)
    nothing = loops.ClassifierLoop(
        model_fn=lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        optimizer_fn=lambda: keras.optimizers.SGD(0.1),
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(ValueError, match="ClassifierLoop has nothing to evaluate: it has no"):
        loops.evaluate_checkpoints(nothing, run_dir)
    with pytest.raises(ValueError, match="timeout_seconds must be a number of seconds > 0"):
        loops.evaluate_checkpoints(make_loop(), run_dir, timeout_seconds=0)
    with pytest.raises(ValueError, match="train_steps must be a whole number >= 1"):
        loops.evaluate_checkpoints(make_loop(), run_dir, train_steps=0)
    # A loop built unlike the run's (another width) names the checkpoint and the fix.
    with pytest.raises(ValueError) as raised:
        loops.evaluate_checkpoints(make_loop(width=8), run_dir, train_steps=TRAIN_STEPS)
    assert re.match(r"The checkpoint \S+ckpt-6 does not match this loop", str(raised.value))
    assert str(raised.value).endswith(
        "The evaluator's loop must be built like the run's (the same model and loop "
        "settings; a binary: the same flags as the trainer)."
    )


def test_the_trainers_restore_leaves_a_live_evaluators_unfinished_writes_alone(tmp_path):
    directory = tmp_path / reporting.EVALUATOR_DIRECTORY
    directory.mkdir()
    evaluators = directory / f"{reporting.TEMPORARY_PREFIX}abc.tmp"
    trainers = tmp_path / f"{reporting.TEMPORARY_PREFIX}def.tmp"
    evaluators.write_text("{")
    trainers.write_text("{")
    reporting.remove_unfinished_writes(str(tmp_path))
    assert evaluators.exists() and not trainers.exists()


def test_a_second_evaluator_of_the_same_run_is_refused(run_dir):
    # Another process holds the evaluator's own lock (not the run's).
    lock_path = os.path.join(evaluator_directory(run_dir), ".lock")
    os.makedirs(os.path.dirname(lock_path))
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match=f"The evaluator of {run_dir} cannot start: "):
            loops.evaluate_checkpoints(make_loop(), run_dir)
