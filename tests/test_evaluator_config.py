"""The evaluator checks its settings against the run's config.json: it takes the run's values
where it was given none and refuses, naming each setting, where it was given others."""

import json
import os
import shutil

import keras
import pytest
from absl import app, flags
from absl.testing import flagsaver

import loops
from conftest import read_results, run_module, tiny_batches
from loops.bin import classifier as classifier_binary
from loops.model_dir import run_config
from loops.run.sidecar import HISTORY_FILE, evaluator_directory

# ---- What changes the numbers, and how a difference reads (no run needed). ----


def test_only_whether_there_is_a_weight_average_counts_of_ema_decay():
    run = {"ema_decay": 0.5, "mixed_precision": "none", "seed": 3}
    names = ["ema_decay", "mixed_precision", "seed", "width"]  # the run recorded no width
    here = {"ema_decay": 0.9, "mixed_precision": "none", "seed": 3, "width": 8}
    assert run_config.differences(here, run, names) == []
    here = {"ema_decay": None, "mixed_precision": "mixed_bfloat16", "seed": 3}
    assert run_config.differences(here, run, names) == [
        ("ema_decay", None, 0.5),
        ("mixed_precision", "mixed_bfloat16", "none"),
    ]
    assert run_config.differences({"ema_decay": 0.0}, {"ema_decay": None}, ["ema_decay"]) == []
    found = run_config.differences(
        {"ema_decay": 0.9, "image_size": ["8", "8"], "data_dir": "/here"},
        {"ema_decay": 0.0, "image_size": None, "data_dir": None},
        ["ema_decay", "image_size", "data_dir"],
    )
    assert run_config.describe(found, as_flags=True) == (
        "--ema_decay=0.9 here and --ema_decay=0.0 in the run (the run kept no moving average "
        "to evaluate); --image_size=8,8 here and --image_size unset in the run; "
        "--data_dir=/here here and --data_dir unset in the run"
    )


def test_a_config_json_that_is_no_object_is_refused_and_a_missing_one_is_waited_for(tmp_path):
    model_dir = str(tmp_path)
    assert run_config.read(model_dir) is None
    with pytest.raises(TimeoutError) as raised:
        run_config.wait_for(model_dir, timeout_seconds=0.05, poll_seconds=0.01)
    assert str(raised.value) == (
        f"No {model_dir}/config.json and no checkpoint after 0.05 s: the run has not started "
        f"(its trainer writes config.json as it starts). Start the trainer with "
        f"--model_dir={model_dir}, or give it longer with --evaluator_timeout."
    )
    # Checkpoints without config.json: a run of an older loops, evaluated unchecked.
    os.makedirs(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "checkpoint").write_text("")
    assert run_config.wait_for(model_dir, timeout_seconds=0.05, poll_seconds=0.01) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError) as raised:
        run_config.wait_for(model_dir, timeout_seconds=None)
    assert str(raised.value) == (
        f"{model_dir}/config.json holds no JSON object of settings ([1, 2]), so the evaluator "
        "cannot check that it evaluates what the run trained. The trainer rewrites it when it "
        "starts: rerun the trainer with this --model_dir, or delete the file to evaluate "
        "without the check."
    )


# ---- The binaries: loops-classifier's flags. ----

RUN_FLAGS = ["--strategy=default", "--train_steps=4", "--steps_per_loop=2"]
RUN_FLAGS += ["--checkpoint_every=2", "--eval_every=2", "--global_batch_size=32"]
# Differences from the flags' defaults an evaluator started without them must take.
RUN_SETTINGS = ["--ema_decay=0.5", "--eval_split=train", "--l2=0.01"]


def classifier_main(*argv):
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        classifier_binary.main(flags.FLAGS(["loops-classifier", *argv]))


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory, digits_dir):
    """A classifier binary's model_dir: 4 steps with a weight average, evaluated on train."""
    model_dir = str(tmp_path_factory.mktemp("run"))
    classifier_main(
        f"--model_dir={model_dir}", f"--data_dir={digits_dir}", *RUN_FLAGS, *RUN_SETTINGS
    )
    return model_dir


# Not compared: another batch size only reorders the sums over the eval set.
@pytest.mark.parametrize("batch_size", [[], ["--global_batch_size=50"]])
def test_an_evaluator_given_none_of_the_runs_settings_takes_them_and_the_runs_numbers(
    classifier_run, digits_dir, tmp_path, capsys, batch_size
):
    run_dir = str(tmp_path / "run")
    shutil.copytree(classifier_run, run_dir)
    capsys.readouterr()
    evaluator = ["--mode=evaluate_checkpoints", f"--model_dir={run_dir}"]
    classifier_main(
        *evaluator, f"--data_dir={digits_dir}", "--strategy=default", "--train_steps=4", *batch_size
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"evaluator: took the run's settings from {run_dir}/config.json: "
        "--ema_decay=0.5, --eval_split=train, --l2=0.01"
    )
    with open(os.path.join(evaluator_directory(run_dir), HISTORY_FILE)) as stream:
        history = json.load(stream)["evaluations"]
    trainer = read_results(run_dir)["history"]
    assert [entry["step"] for entry in history] == [entry["step"] for entry in trainer] == [2, 4]
    for entry, expected in zip(history, trainer):
        assert entry["metrics"]["num_examples"] == expected["num_examples"] == 1437  # train
        assert entry["metrics"] == pytest.approx(
            {name: expected[name] for name in entry["metrics"]}, rel=1e-6, abs=1e-6
        )


def test_an_evaluator_given_other_values_than_the_run_refuses_before_building_anything(
    classifier_run, digits_dir
):
    evaluator = ["--mode=evaluate_checkpoints", f"--model_dir={classifier_run}"]
    evaluator += [f"--data_dir={digits_dir}", "--strategy=default"]
    with pytest.raises(app.UsageError) as raised:
        classifier_main(*evaluator, "--l2=0.001", "--eval_split=test", "--ema_decay=0.9")
    # --ema_decay=0.9 evaluates the same averages as the run's 0.5: not refused.
    assert str(raised.value) == (
        f"--mode=evaluate_checkpoints would not evaluate what the run in {classifier_run} "
        f"trained ({classifier_run}/config.json): --eval_split=test here and "
        "--eval_split=train in the run; --l2=0.001 here and --l2=0.01 in the run. Drop "
        "--eval_split --l2 to take the run's values, or pass the run's: --eval_split=train "
        "--l2=0.01."
    )
    assert not os.path.exists(evaluator_directory(classifier_run))


def test_the_evaluator_binary_exits_1_naming_an_ema_decay_that_evaluates_other_weights(
    classifier_run,
):
    done = run_module(
        "loops.bin.classifier",
        "--mode=evaluate_checkpoints",
        f"--model_dir={classifier_run}",
        "--ema_decay=0",
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        f"--mode=evaluate_checkpoints would not evaluate what the run in {classifier_run} "
        f"trained ({classifier_run}/config.json): --ema_decay=0.0 here and --ema_decay=0.5 in "
        "the run (the raw weights would be evaluated, not the run's moving average). Drop "
        "--ema_decay to take the run's value, or pass the run's: --ema_decay=0.5."
    ) in done.stderr
    assert not os.path.exists(evaluator_directory(classifier_run))


# ---- The Python API: the loop is built, so it can only refuse. ----


def make_loop(*, model_dir=None, ema_decay=None, config=None):
    def model_fn():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=1)),
            ]
        )

    return loops.Trainer(
        loops.ClassifierLoop(model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.SGD(0.001)),
        strategy=loops.testing.replica_strategy(1),
        train_data=tiny_batches(global_batch_size=8, count=40),
        eval_data=tiny_batches(global_batch_size=8, count=21, seed=5),
        steps_per_loop=2,
        eval_every=2,
        checkpoint_every=2,
        model_dir=model_dir,
        ema_decay=ema_decay,
        record=config,
        progress=loops.testing.quiet_progress(),
    )


@pytest.fixture(scope="module")
def python_run(tmp_path_factory):
    """A Python run's model_dir: 4 steps with a weight average, its config one entry."""
    model_dir = str(tmp_path_factory.mktemp("python_run"))
    trainer = make_loop(model_dir=model_dir, ema_decay=0.5, config={"eval_set": "tiny"})
    trainer.train(4)
    trainer.close()
    return model_dir


def test_a_python_run_records_the_loop_settings_an_evaluation_depends_on(python_run):
    with open(os.path.join(python_run, "config.json")) as stream:
        recorded = json.load(stream)
    assert {name: recorded[name] for name in ("eval_set", *run_config.EVALUATION_SETTINGS)} == {
        "eval_set": "tiny",
        "ema_decay": 0.5,
        "mixed_precision": "none",
        "seed": 0,
    }


def test_a_python_evaluator_without_the_runs_weight_average_is_refused(python_run):
    with pytest.raises(ValueError) as raised:
        loops.evaluate_checkpoints(make_loop(), python_run, train_steps=4, poll_seconds=0.05)
    assert str(raised.value) == (
        f"The evaluator's ClassifierLoop would not evaluate what the run in {python_run} "
        "trained: ema_decay=None here and ema_decay=0.5 in the run (the raw weights would be "
        "evaluated, not the run's moving average). Build it with the run's values "
        f"(ema_decay=0.5), which {python_run}/config.json records."
    )
    assert not os.path.exists(os.path.join(evaluator_directory(python_run), HISTORY_FILE))


def test_a_python_evaluator_compares_the_config_entries_it_names(python_run):
    other_data = make_loop(ema_decay=0.5, config={"eval_set": "large"})
    with pytest.raises(ValueError) as raised:
        loops.evaluate_checkpoints(
            other_data, python_run, train_steps=4, poll_seconds=0.05, compared_config=["eval_set"]
        )
    assert str(raised.value).startswith(
        f"The evaluator's ClassifierLoop would not evaluate what the run in {python_run} "
        "trained: eval_set='large' here and eval_set='tiny' in the run. Build it with the "
        "run's values (eval_set='tiny'),"
    )
    with pytest.raises(ValueError) as raised:
        loops.evaluate_checkpoints(other_data, python_run, compared_config=["eval_sets"])
    assert str(raised.value) == (
        "compared_config must name keys of the run's config, got ['eval_sets'] (the run's "
        "config holds ['eval_set']); make the Trainer with record= holding each setting to "
        "compare, or leave it out."
    )


def test_a_python_evaluator_with_another_decay_evaluates_the_runs_averages(python_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(python_run, run_dir)
    # The decay only shaped the averages the checkpoints hold: 0.9 evaluates them as 0.5 does.
    history = loops.evaluate_checkpoints(
        make_loop(ema_decay=0.9, config={"eval_set": "tiny"}),
        run_dir,
        train_steps=4,
        poll_seconds=0.05,
        compared_config=["eval_set"],
    )
    trainer = read_results(run_dir)["history"]
    assert [entry["step"] for entry in history] == [entry["step"] for entry in trainer] == [2, 4]
    for entry, expected in zip(history, trainer):
        assert entry["metrics"] == pytest.approx(
            {name: expected[name] for name in entry["metrics"]}, rel=1e-6, abs=0
        )


def test_a_run_without_config_json_is_evaluated_unchecked_with_a_note(python_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(python_run, run_dir)
    os.remove(os.path.join(run_dir, "config.json"))
    loop = make_loop(ema_decay=0.5)
    lines = []
    loop.run_context.progress.line = lines.append
    history = loops.evaluate_checkpoints(loop, run_dir, train_steps=4, poll_seconds=0.05)
    assert [entry["step"] for entry in history] == [2, 4]
    assert lines[1] == (
        f"evaluator: {run_dir}/config.json is missing though the run has checkpoints (a run "
        "of a loops version that did not record it): this loop's settings are not checked "
        "against the run's"
    )
