"""The evaluator beside training: each checkpoint a run keeps is evaluated once, as it appears,
with the numbers of an in-process evaluation of that checkpoint, without the run's lock."""

import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import app, flags
from absl.testing import flagsaver

import loops
import loops_data as data
import loops_models as models
from conftest import ROOT, SUBPROCESS_ENV, read_results, run_module, tiny_batches
from loops.bin import classifier as classifier_binary
from loops.cli import flags as loop_flags
from loops.core import reporting
from loops.kinds.lm import LanguageModelLoop
from loops.model_dir import checkpoints
from loops.run.sidecar import HISTORY_FILE, evaluator_directory
from loops_models import lm as lm_models

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
    return loops.Trainer(
        loops.ClassifierLoop(model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.Adam(0.01)),
        strategy=loops.testing.replica_strategy(replicas),
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
    tf.train.Checkpoint(model=loop.definition.model).read(prefix).expect_partial()
    return loop.definition.run_evaluation(loop.run_context)


def eval_scalars(directory):
    """tag -> {step: value} of the eval scalars in `directory` (not its pictures and texts)."""
    scalars = {}
    for path in glob.glob(os.path.join(directory, "eval", "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = tf.make_ndarray(value.tensor)
                if number.ndim == 0 and number.dtype.kind == "f":
                    scalars.setdefault(value.tag, {})[event.step] = float(number)
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
    for entry in history:
        assert entry["written"] == os.path.getmtime(entry["checkpoint"] + ".index")
        assert entry["time"] >= entry["written"]
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
    loop.run_context.progress.line = rotate_step_8_away
    history = loops.evaluate_checkpoints(loop, run_dir, train_steps=TRAIN_STEPS, poll_seconds=0.05)
    assert [entry["step"] for entry in history] == KEPT_STEPS
    assert "metrics" in history[0] and "metrics" in history[2]
    assert history[1]["skipped"] == (
        "deleted before it was read (the trainer keeps only its newest checkpoints, "
        "max_checkpoints)"
    )
    assert "metrics" not in history[1] and "written" not in history[1]
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
    with pytest.raises(ValueError, match="needs a Trainer made with model_dir=None"):
        loops.evaluate_checkpoints(make_loop(model_dir=str(tmp_path / "own")), run_dir)
    nothing = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
            optimizer_fn=lambda: keras.optimizers.SGD(0.1),
        ),
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
        "The evaluator's Trainer must be made like the run's (the same model and "
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


# ---- Loops that evaluate some other way than one pass over eval_data. ----


def summaries(directory, run):
    """tag -> {step: value} of the scalars and texts in the event files of `directory/run`."""
    values = {}
    for path in glob.glob(os.path.join(directory, run, "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                values.setdefault(value.tag, {})[event.step] = (
                    array.item().decode() if array.dtype == object else float(array)
                )
    return values


def test_a_language_models_evaluator_writes_its_metrics_and_samples_like_the_trainer(tmp_path):
    tokens = np.random.default_rng(3).integers(32, 127, size=(24, 13)).astype(np.int32)
    lengths = np.full([24], 13, np.int32)

    def make_lm(model_dir=None):
        return loops.Trainer(
            LanguageModelLoop(
                model_fn=lambda: lm_models.transformer_lm(
                    vocab_size=128, sequence_length=12, width=16, num_layers=1, num_heads=2, seed=5
                ),
                optimizer_fn=lambda: keras.optimizers.Adam(0.01),
                sequence_length=12,
                sample_prompts=("def ",),
                sample_length=6,
            ),
            strategy=loops.testing.replica_strategy(1),
            train_data=lambda: tf.data.Dataset.from_tensor_slices((tokens, lengths)).batch(8),
            eval_data=lambda: tf.data.Dataset.from_tensor_slices((tokens, lengths)).batch(8),
            steps_per_loop=3,
            eval_every=3,
            checkpoint_every=3,
            model_dir=model_dir,
            progress=loops.testing.quiet_progress(),
        )

    run_dir = str(tmp_path / "run")
    trainer = make_lm(run_dir)
    trainer.train(6)
    trainer.close()
    history = loops.evaluate_checkpoints(make_lm(), run_dir, train_steps=6, poll_seconds=0.05)
    assert [entry["step"] for entry in history] == [3, 6]
    for entry, expected in zip(history, read_results(run_dir)["history"]):
        assert entry["step"] == expected.pop("step")
        assert sorted(entry["metrics"]) == sorted(expected)
        assert entry["metrics"] == pytest.approx(expected, rel=1e-6)
    # The loop's own summaries of an evaluation (its samples) go to MODEL_DIR/evaluator too.
    samples = summaries(evaluator_directory(run_dir), "samples")
    assert sorted(samples) == ["greedy/0", "sampled/0"]
    assert samples == summaries(os.path.join(run_dir, "summaries"), "samples")
    assert samples["greedy/0"][6].startswith("```\ndef ")
    # Without a model_dir of its own, the loop writes no sample files.
    assert not glob.glob(os.path.join(evaluator_directory(run_dir), "**", "*.txt"), recursive=True)


def test_the_gan_binary_evaluates_its_checkpoints_beside_its_training(tmp_path):
    model_dir = str(tmp_path / "run")
    shared = ["--strategy=default", f"--model_dir={model_dir}", "--train_steps=20"]
    shared += ["--global_batch_size=64", "--seed=3"]
    # Started together, as a sidecar is; the trainer keeps its newest 3 checkpoints.
    trainer, evaluator = (
        subprocess.Popen(
            [sys.executable, "-m", "loops.bin.gan", *shared, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=SUBPROCESS_ENV,
            cwd=ROOT,
        )
        for extra in (
            ["--steps_per_loop=5", "--checkpoint_every=5", "--eval_every=5"],
            ["--mode=evaluate_checkpoints", "--evaluator_timeout=300"],
        )
    )
    outputs = [process.communicate(timeout=600)[0] for process in (trainer, evaluator)]
    assert trainer.returncode == 0, outputs[0][-3000:]
    assert evaluator.returncode == 0, outputs[1][-3000:]
    kept = [
        step for step, _ in checkpoints.listed_checkpoints(os.path.join(model_dir, "checkpoints"))
    ]
    assert kept == [10, 15, 20]
    with open(os.path.join(evaluator_directory(model_dir), HISTORY_FILE)) as stream:
        history = json.load(stream)["evaluations"]
    steps = [entry["step"] for entry in history]
    skipped = [entry["step"] for entry in history if "skipped" in entry]
    # Every kept checkpoint was evaluated. Step 5's was evaluated too, or the trainer rotated
    # it away first: then it is recorded and said as skipped, or (found after) not listed.
    assert steps in ([5, 10, 15, 20], [10, 15, 20]) and skipped in ([], [5])
    assert ("evaluator: skipped ckpt-5: deleted before it was read" in outputs[1]) == bool(skipped)
    trainer_history = {entry.pop("step"): entry for entry in read_results(model_dir)["history"]}
    for entry in history:
        if "skipped" in entry:
            continue
        assert sorted(entry["metrics"]) == [
            "high_quality_fraction",
            "modes_covered",
            "raw_high_quality_fraction",
            "raw_modes_covered",
        ]
        assert entry["metrics"] == pytest.approx(trainer_history[entry["step"]], rel=1e-6)
    assert outputs[1].splitlines()[-1].startswith("evaluator: the run ended at step 20; handled")
    assert "exported SavedModel" not in outputs[1]


RL_RUN = [
    "--algorithm=ppo",
    "--num_envs=4",
    "--rollout_length=8",
    "--global_batch_size=16",
    "--train_steps=4",
    "--steps_per_loop=2",
    "--checkpoint_every=2",
    "--eval_every=2",
    "--eval_episodes=3",
]


def test_the_rl_binary_evaluates_its_checkpoints_by_greedy_episodes(tmp_path):
    model_dir = str(tmp_path / "run")
    trained = run_module("loops.bin.rl", f"--model_dir={model_dir}", *RL_RUN)
    assert trained.returncode == 0, trained.stderr[-3000:]
    done = run_module(
        "loops.bin.rl", f"--model_dir={model_dir}", "--mode=evaluate_checkpoints", *RL_RUN
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(evaluator_directory(model_dir), HISTORY_FILE)) as stream:
        history = json.load(stream)["evaluations"]
    assert [entry["step"] for entry in history] == [2, 4]
    trainer = {entry["step"]: entry for entry in read_results(model_dir)["history"]}
    for entry in history:
        # The trainer's own evaluation ran on 2 replicas; the episodes are the same.
        assert entry["metrics"] == pytest.approx(
            {name: trainer[entry["step"]][name] for name in entry["metrics"]}, rel=1e-6
        )
        assert entry["metrics"]["episodes_ended"] == 3


def test_the_rl_binary_needs_eval_episodes_to_evaluate_checkpoints(tmp_path):
    done = run_module("loops.bin.rl", "--mode=evaluate_checkpoints", f"--model_dir={tmp_path}")
    assert done.returncode == 1
    assert "--eval_episodes is 0: pass e.g. --eval_episodes=10" in done.stderr
    assert not os.listdir(tmp_path)


# ---- The mode flag of the binaries (the shared flags, here through loops-classifier's). ----

EVALUATOR_TF_CONFIG = json.dumps(
    {
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "evaluator", "index": 0},
    }
)
WORKER_TF_CONFIG = json.dumps(
    {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 1}}
)


@pytest.mark.parametrize(
    "argv, tf_config, mode, strategy",
    [
        ([], None, "train", "mirrored"),
        (["--mode=evaluate_checkpoints"], None, "evaluate_checkpoints", "mirrored"),
        (["--strategy=multi_worker_mirrored"], WORKER_TF_CONFIG, "train", "multi_worker_mirrored"),
        # The same command as the workers, on the evaluator task: it evaluates, on its own.
        (
            ["--strategy=multi_worker_mirrored"],
            EVALUATOR_TF_CONFIG,
            "evaluate_checkpoints",
            "default",
        ),
        (
            ["--mode=evaluate_checkpoints", "--strategy=parameter_server"],
            None,
            "evaluate_checkpoints",
            "default",
        ),
        (
            ["--mode=evaluate_checkpoints", "--strategy=one_device"],
            None,
            "evaluate_checkpoints",
            "one_device",
        ),
    ],
)
def test_the_mode_and_the_evaluators_strategy_follow_the_flags_and_tf_config(
    monkeypatch, argv, tf_config, mode, strategy
):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["loops-classifier", "--model_dir=/run", *argv])
        assert loop_flags.mode() == mode
        assert loop_flags.strategy_name() == strategy
        arguments = loop_flags.loop_arguments("a strategy", "/run", actions=["an export"])
    model_dir = arguments["config"].controller.model_dir
    if mode == "train":
        assert model_dir == "/run" and arguments["actions"] == ["an export"]
    else:
        # An evaluator's loop has no model_dir (no lock, no restore) and no actions (no export).
        assert model_dir is None and arguments["actions"] == []


@pytest.mark.parametrize(
    "argv, tf_config, message",
    [
        (
            ["--mode=evaluate_checkpoints"],
            None,
            "--mode=evaluate_checkpoints evaluates the checkpoints of the run in --model_dir; "
            "pass the trainer's --model_dir.",
        ),
        (
            ["--mode=train", "--model_dir=/run"],
            EVALUATOR_TF_CONFIG,
            "TF_CONFIG names this task 'evaluator', which evaluates the checkpoints of the "
            "cluster's run; drop --mode=train (an evaluator task runs "
            "--mode=evaluate_checkpoints).",
        ),
    ],
)
def test_an_evaluator_without_a_run_or_a_training_evaluator_task_is_refused(
    monkeypatch, argv, tf_config, message
):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    with flagsaver.flagsaver(), pytest.raises(app.UsageError) as raised:
        flags.FLAGS.unparse_flags()
        classifier_binary.main(flags.FLAGS(["loops-classifier", *argv]))
    assert str(raised.value) == message


# ---- An evaluator task beside a 2-worker cluster, through loops-launch. ----


def test_an_evaluator_task_evaluates_every_checkpoint_the_chief_kept_then_exits(
    tmp_path, digits_dir
):
    model_dir = str(tmp_path / "run")
    # 3 checkpoints, all kept (max_checkpoints 3), each with the trainer's own evaluation.
    classifier = ["--strategy=multi_worker_mirrored", "--num_replicas=1"]
    classifier += [f"--model_dir={model_dir}", f"--data_dir={digits_dir}", "--train_steps=120"]
    classifier += ["--steps_per_loop=20", "--checkpoint_every=40", "--eval_every=40"]
    classifier += ["--global_batch_size=64"]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "loops.cluster.launch", "--num_workers=2", "--evaluator", "--"]
        + ["loops.bin.classifier", *classifier],
        capture_output=True,
        text=True,
        env={name: value for name, value in SUBPROCESS_ENV.items() if name != "TF_CONFIG"},
        cwd=ROOT,
        timeout=600,
    )
    print(f"2 workers and an evaluator: {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert re.search(r"^\[launch\] evaluator_0 pid \d+$", done.stderr, re.M)  # no address
    assert "[launch] evaluator_0 finished" in done.stderr
    assert "[worker_0] step 120/120" in done.stdout and "[worker_1] step 120/120" in done.stdout

    kept = checkpoints.listed_checkpoints(os.path.join(model_dir, "checkpoints"))
    assert [step for step, _ in kept] == [40, 80, 120]
    with open(os.path.join(evaluator_directory(model_dir), HISTORY_FILE)) as stream:
        history = json.load(stream)["evaluations"]
    assert [(entry["step"], entry["checkpoint"]) for entry in history] == kept
    # It exited after the final checkpoint, and said so.
    results = read_results(model_dir)
    assert results["global_step"] == 120 and results["num_replicas"] == 2
    assert (
        "[evaluator_0] evaluator: the run ended at step 120; handled 3 checkpoint(s) now, 3 in all"
    ) in done.stdout

    # Each equals an evaluation of that checkpoint here, in this process, on 1 replica ...
    spec = data.dataset_spec("digits", digits_dir)
    reference = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.build_classifier(
                "mlp", input_shape=spec.input_shape, num_classes=spec.num_classes, seed=0
            ),
            optimizer_fn=lambda: keras.optimizers.Adam(2e-3),
        ),
        strategy=loops.testing.replica_strategy(1),
        eval_data=lambda: data.global_batches(
            "digits", "test", global_batch_size=64, data_dir=digits_dir
        ),
        progress=loops.testing.quiet_progress(),
    )
    trainer_history = {entry.pop("step"): entry for entry in results["history"]}
    for entry in history:
        expected = in_process_evaluation(reference, entry["checkpoint"])
        assert entry["metrics"]["num_examples"] == expected["num_examples"] == 360
        assert entry["metrics"] == pytest.approx(expected, rel=1e-6, abs=0)
        # ... and the chief's own evaluation at that step, on 2 workers.
        assert entry["metrics"] == pytest.approx(trainer_history[entry["step"]], rel=RTOL)
    assert history[-1]["metrics"]["accuracy"] >= 0.9  # it really learned
