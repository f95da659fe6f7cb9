"""Actions: early stopping, the best checkpoint, custom actions, resume, errors, the flags."""

import glob
import json
import math
import os
import re
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl import app, flags
from absl.testing import flagsaver

import loops
from conftest import Counter, make_trainer, read_results, tiny_batches
from loops.bin import classifier as classifier_binary
from loops.run.actions import UnknownMetricError

# The eval loss each scripted loop reports at a step (evaluations every 2 steps).
SCRIPT = {2: 5.0, 4: 4.0, 6: 4.5, 8: 4.2, 10: 4.1, 12: 3.0, 14: 2.0, 16: 1.0}


class ScriptedLoop(Counter):
    """Counts its steps in a variable; its eval metrics are SCRIPT's values at the step."""

    def run_evaluation(self, run):
        return {"loss": SCRIPT[self.step], "num_examples": 10}


def scripted(model_dir=None, *, actions=(), eval_every=2, steps_per_loop=2, **kwargs):
    return make_trainer(
        ScriptedLoop,
        strategy=loops.testing.replica_strategy(2),
        model_dir=model_dir,
        eval_every=eval_every,
        steps_per_loop=steps_per_loop,
        actions=actions,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def lines(loop):
    return loop.run_context.progress.stream.getvalue().splitlines()


# ---- Early stopping. ----


def test_early_stopping_stops_at_the_expected_step_and_says_why(tmp_path):
    loop = scripted(
        str(tmp_path), actions=[loops.EarlyStopping("loss", patience=2)], checkpoint_every=4
    )
    logs = loop.train(16)
    # Losses 5, 4 (best), 4.5, 4.2: the second evaluation in a row without improvement.
    assert loop.state.step == 8
    np.testing.assert_array_equal(logs["total"], np.arange(1, 9))
    results = read_results(str(tmp_path))
    assert results["global_step"] == 8 and results["eval"]["loss"] == 4.2
    assert results["stop_reason"] == (
        "early stopping: eval loss has not improved on its best 4 for 2 evaluations (patience 2)"
    )
    assert results["preempted"] is False
    # One evaluation per step (no second one at the stop), then the saved stop step.
    evals = [line for line in lines(loop) if line.startswith("eval at")]
    assert [line.split(" |")[0] for line in evals] == [f"eval at step {s}" for s in (2, 4, 6, 8)]
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-8")


def test_min_delta_and_mode_decide_what_counts_as_an_improvement():
    fake_loop = types.SimpleNamespace(eval_every=1, model_dir="unused")
    lower = loops.EarlyStopping("loss", min_delta=0.5)
    higher = loops.EarlyStopping("accuracy", mode="max")
    for action in (lower, higher):
        action.build(fake_loop)
    assert lower.best_value() is None and lower.improves(1e30)
    lower.best.assign(4.0)
    assert [lower.improves(v) for v in (3.4, 3.5, 3.6, float("nan"))] == [True, False, False, False]
    higher.best.assign(0.9)
    assert [higher.improves(v) for v in (0.91, 0.9, 0.5)] == [True, False, False]


def test_a_metric_that_is_never_finite_stops_training_with_that_reason():
    reasons = []
    fake_loop = types.SimpleNamespace(eval_every=1, request_stop=reasons.append)
    action = loops.EarlyStopping("loss", patience=2)
    action.build(fake_loop)
    for step in (1, 2):
        action.after_eval(fake_loop, step, {"loss": float("nan")})
    assert reasons == [
        "early stopping: eval loss has had no finite value for 2 evaluations (patience 2)"
    ]


def test_resume_keeps_the_wait_count_and_a_rerun_after_a_stop_stops_at_once(tmp_path):
    first = scripted(str(tmp_path), actions=[loops.EarlyStopping("loss", patience=2)])
    first.train(6)  # evaluations 5, 4, 4.5: one without improvement, saved at step 6
    assert first.state.stop_reason is None
    first.close()

    resumed = scripted(str(tmp_path), actions=[loops.EarlyStopping("loss", patience=2)])
    assert resumed.state.step == 6
    resumed.train(16)
    # Counting on from 1, the evaluation at 8 (4.2) is the second without improvement.
    # With the count lost, 4.2, 4.1, 3, 2, 1 would each improve and the run reach 16.
    assert resumed.state.step == 8 and resumed.state.stop_reason.startswith("early stopping")
    resumed.close()

    rerun = scripted(str(tmp_path), actions=[loops.EarlyStopping("loss", patience=2)])
    rerun.train(16)
    assert rerun.state.step == 8
    assert read_results(str(tmp_path))["stop_reason"].startswith("early stopping")
    rerun.close()

    # A larger patience trains on: 4.1 at step 10 is the third without improvement.
    patient = scripted(str(tmp_path), actions=[loops.EarlyStopping("loss", patience=3)])
    patient.train(16)
    assert patient.state.step == 10


def test_an_action_added_on_resume_starts_fresh(tmp_path):
    plain = scripted(str(tmp_path))
    plain.train(4)
    plain.close()
    resumed = scripted(str(tmp_path), actions=[loops.EarlyStopping("loss", patience=2)])
    assert resumed.state.step == 4
    resumed.train(16)
    # Fresh: 4.5 at step 6 is the first best; 4.2, 4.1, 3, 2, 1 each improve on it.
    assert resumed.state.step == 16 and resumed.state.stop_reason is None


def test_action_state_is_checkpointed_under_each_action_name(tmp_path):
    by_loss = loops.EarlyStopping("loss", patience=2)
    patient = loops.EarlyStopping("loss", patience=5)
    patient.name = "patient_stopping"
    scripted(str(tmp_path), actions=[by_loss, patient]).train(6)
    saved = dict(tf.train.list_variables(str(tmp_path / "checkpoints")))
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    for name in ("early_stopping", "patient_stopping"):
        assert reader.get_tensor(f"action_{name}/best/.ATTRIBUTES/VARIABLE_VALUE") == 4.0
        assert reader.get_tensor(f"action_{name}/wait/.ATTRIBUTES/VARIABLE_VALUE") == 1
    assert len([key for key in saved if key.startswith("action_")]) == 4


def test_a_checkpoint_before_the_first_evaluation_saves_the_actions_no_value_yet(tmp_path):
    # Checkpoints at steps 2 and 4, evaluations from step 4 on: the save at step 2 holds
    # the actions' "no best value yet", which must be finite to be saved at all.
    stopping = loops.EarlyStopping("loss", patience=5)
    best = loops.KeepBest("loss", mode="min")
    loop = scripted(str(tmp_path), actions=[stopping, best], eval_every=4, checkpoint_every=2)
    loop.train(4)
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-2"))
    for name in ("early_stopping", "keep_best"):
        saved = reader.get_tensor(f"action_{name}/best/.ATTRIBUTES/VARIABLE_VALUE")
        assert saved == sys.float_info.max
    assert stopping.best_value() == 4.0 and best.best_value() == 4.0
    # A checkpoint of loops before 5.2.0 held inf there: still read as no value yet.
    stopping.best.assign(math.inf)
    assert stopping.best_value() is None and stopping.improves(1e300)


# ---- The best checkpoint. ----


class ScriptedClassifier(loops.ClassifierLoop):
    """A classifier whose eval loss is scripted; records its weights at each evaluation."""

    def __init__(self, script, **kwargs):
        self.script = script
        self.weights_at = {}
        super().__init__(**kwargs)

    def run_evaluation(self, run):
        self.weights_at[self.step] = self.weigh()
        return {"loss": self.script[self.step], "num_examples": 21}


def scripted_classifier(script, model_dir, actions=()):
    import loops_models as models

    trainer = loops.Trainer(
        ScriptedClassifier(
            script,
            model_fn=lambda: models.build_classifier(
                "mlp", input_shape=(8, 8, 1), num_classes=10, seed=7
            ),
            optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=tiny_batches(8, 21, shuffle_seed=2),
        eval_every=2,
        steps_per_loop=2,
        model_dir=model_dir,
        actions=actions,
        progress=loops.testing.quiet_progress(),
    )
    # What the trainer checkpoints (its run context does not say): read at each evaluation.
    trainer.definition.weigh = lambda: loops.testing.loop_weights(trainer)
    return trainer


def test_keep_best_keeps_the_checkpoint_of_the_best_evaluation(tmp_path):
    script = {2: 5.0, 4: 3.0, 6: 4.0, 8: 3.5, 10: 6.0}
    loop = scripted_classifier(script, str(tmp_path), [loops.KeepBest("loss")])
    loop.train(10)
    best_dir = tmp_path / "best"
    record = json.loads((best_dir / "best.json").read_text())
    assert record == {
        "metric": "loss",
        "mode": "min",
        "value": 3.0,
        "step": 4,
        "checkpoint": str(best_dir / "ckpt-4"),
    }
    assert tf.train.get_checkpoint_state(str(best_dir)).all_model_checkpoint_paths == [
        str(best_dir / "ckpt-4")
    ]
    assert sorted(name for name in os.listdir(best_dir) if name.startswith("ckpt")) == [
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
    ]

    # A fresh loop with the best checkpoint read into its objects holds the step-4 weights.
    fresh = scripted_classifier(script, None)
    tf.train.Checkpoint(
        **fresh.definition.checkpoint_items(), global_step=fresh.global_step
    ).restore(record["checkpoint"]).assert_existing_objects_matched()
    expected = loop.definition.weights_at[4]
    got = loops.testing.loop_weights(fresh)
    assert sorted(got) == sorted(expected) and got["global_step"] == 4
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    # The weights moved after step 4, so the comparison tells the steps apart.
    assert any(
        not np.array_equal(loop.definition.weights_at[10][name], expected[name])
        for name in expected
        if name.startswith("model/")
    )


def test_resume_keeps_the_best_value(tmp_path):
    script = {2: 5.0, 4: 3.0, 6: 4.0, 8: 3.5, 10: 6.0}
    first = scripted_classifier(script, str(tmp_path), [loops.KeepBest("loss")])
    first.train(6)
    first.close()
    resumed = scripted_classifier(script, str(tmp_path), [loops.KeepBest("loss")])
    resumed.train(10)
    # 3.5 at step 8 beats nothing restored as 3.0; a lost best would have kept step 8.
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 4
    assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("ckpt-4")


# ---- Custom actions. ----


class Recorder(loops.Action):
    """Records the step of every hook call."""

    def __init__(self, every=None):
        self.every = every
        self.calls = {"before_train": [], "after_loop": [], "after_eval": [], "after_train": []}

    def before_train(self, loop):
        self.calls["before_train"].append(loop.state.step)

    def after_loop(self, loop, step, train_metrics):
        self.calls["after_loop"].append(step)

    def after_eval(self, loop, step, eval_metrics):
        self.calls["after_eval"].append((step, eval_metrics["loss"]))

    def after_train(self, loop):
        self.calls["after_train"].append(loop.state.step)


def test_a_custom_action_runs_every_n_steps_and_cuts_the_inner_loop_there():
    # Actions without state need no names of their own.
    every_5, every_loop = Recorder(every=5), Recorder()
    loop = scripted(actions=[every_5, every_loop], steps_per_loop=3, eval_every=None)
    loop.train(10)
    assert every_5.calls["after_loop"] == [5, 10]
    # Inner loops of up to 3 steps, cut at every 5th step: 0-3, 3-5, 5-8, 8-10.
    assert every_loop.calls["after_loop"] == [3, 5, 8, 10]
    for recorder in (every_5, every_loop):
        assert recorder.calls["before_train"] == [0]
        assert recorder.calls["after_eval"] == [(10, SCRIPT[10])]
        assert recorder.calls["after_train"] == [10]


class StopAtLoss(loops.Action):
    def after_eval(self, loop, step, eval_metrics):
        if eval_metrics["loss"] < 4.5:
            loop.request_stop(f"loss {eval_metrics['loss']} < 4.5")


def test_a_custom_action_can_stop_training_from_after_loop_or_after_eval(tmp_path):
    class StopAfterStep5(loops.Action):
        def after_loop(self, loop, step, train_metrics):
            if step >= 5:
                loop.request_stop("enough")

    loop = scripted(actions=[StopAfterStep5()], steps_per_loop=3, eval_every=None)
    logs = loop.train(16)
    assert loop.state.step == 6 and len(logs["total"]) == 6 and loop.state.stop_reason == "enough"
    assert [line.split(" |")[0] for line in lines(loop)][-3:] == [
        "step 6/16",
        "stopping at step 6: enough",
        "eval at step 6",
    ]

    loop = scripted(str(tmp_path), actions=[StopAtLoss()])
    loop.train(16)
    assert loop.state.step == 4 and read_results(str(tmp_path))["stop_reason"] == "loss 4.0 < 4.5"


# ---- User errors. ----


def test_an_unknown_metric_names_the_ones_the_loop_reports():
    loop = scripted(actions=[loops.EarlyStopping("acuracy", mode="max")])
    with pytest.raises(
        UnknownMetricError,
        match=re.escape(
            "EarlyStopping watches the eval metric 'acuracy', which this loop does not report; "
            "the metrics it reports are: loss, num_examples. Choose one of those "
            "(--early_stopping_metric=NAME)."
        ),
    ):
        loop.train(4)
    assert loop.state.step == 2  # at the first evaluation


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: scripted(actions=[loops.EarlyStopping("loss")], eval_every=None),
            ValueError,
            "the run evaluates only at the end of training; pass eval_every=",
        ),
        (
            lambda: scripted(actions=[loops.KeepBest("loss")]),
            ValueError,
            "needs a model_dir; pass model_dir= to the Trainer",
        ),
        (
            lambda: loops.EarlyStopping("loss", mode="lowest"),
            ValueError,
            "mode must be 'min' .* or 'max' .*; got 'lowest'",
        ),
        (
            lambda: loops.EarlyStopping("loss", patience=0),
            ValueError,
            "patience must be a whole number of evaluations >= 1, got 0",
        ),
        (lambda: loops.KeepBest("", mode="max"), ValueError, "needs the name of an eval metric"),
        (
            lambda: scripted(actions=[loops.EarlyStopping("loss"), loops.EarlyStopping("total")]),
            ValueError,
            "Two actions with state are named 'early_stopping'; .* action.name = 'early_stopping_2'",  # noqa: E501
        ),
        (
            lambda: scripted(actions=[Recorder(every=0)]),
            ValueError,
            "Recorder.every must be a whole number >= 1 \\(or None to turn it off\\), got 0",
        ),
        (lambda: scripted(actions=[print]), TypeError, "actions must be loops.Action objects"),
    ],
)
def test_bad_actions_are_refused_with_the_fix(make, error, message):
    with pytest.raises(error, match=message):
        make()


# ---- The flags, through the classifier binary. ----


def run_classifier(*argv):
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        classifier_binary.main(flags.FLAGS(["loops-classifier", *argv]))


def test_classifier_flags_stop_early_keep_the_best_and_still_export(tmp_path, digits_dir, capsys):
    model_dir = str(tmp_path / "run")
    run_classifier(
        f"--data_dir={digits_dir}",
        f"--model_dir={model_dir}",
        "--num_replicas=2",
        "--train_steps=400",
        "--steps_per_loop=10",
        "--eval_every=10",
        "--early_stopping_metric=accuracy",
        "--early_stopping_mode=max",
        "--early_stopping_patience=2",
        "--keep_best_metric=loss",
    )
    output = capsys.readouterr().out
    evals = [
        (int(step), float(accuracy), float(loss))
        for step, loss, accuracy in re.findall(
            r"eval at step (\d+) \| loss ([\d.e-]+) \| accuracy ([\d.e-]+)", output
        )
    ]
    assert [step for step, _, _ in evals] == list(range(10, 10 * len(evals) + 1, 10))
    # Where the accuracies printed stop improving for 2 evaluations in a row.
    best, wait, expected_stop = -1.0, 0, None
    for step, accuracy, _ in evals:
        best, wait = (accuracy, 0) if accuracy > best else (best, wait + 1)
        if wait == 2:
            expected_stop = step
            break
    results = read_results(model_dir)
    assert expected_stop is not None and expected_stop < 400, output
    assert results["global_step"] == expected_stop == evals[-1][0]
    assert results["stop_reason"].startswith("early stopping: eval accuracy has not improved")
    # The best loss printed (4 significant digits) is the kept one, at its first step.
    best_loss = min(loss for _, _, loss in evals)
    record = json.loads(open(os.path.join(model_dir, "best", "best.json")).read())
    assert record["step"] == next(step for step, _, loss in evals if loss == best_loss)
    assert float(f"{record['value']:.4g}") == best_loss
    assert f"exported SavedModel to {os.path.join(model_dir, 'export')}" in output
    assert tf.saved_model.contains_saved_model(os.path.join(model_dir, "export"))


@pytest.mark.parametrize(
    "argv, error, message",
    [
        (
            ["--early_stopping_metric=loss", "--eval_every=0"],
            app.UsageError,
            "pass eval_every= to the Trainer",
        ),
        (["--early_stopping_mode=lowest"], flags.IllegalFlagValueError, "value should be one of"),
        (
            ["--early_stopping_patience=0"],
            flags.IllegalFlagValueError,
            "0 is not a positive integer",
        ),
        (
            ["--keep_best_metric=acc", "--eval_every=5", "--train_steps=5", "--steps_per_loop=5"],
            SystemExit,
            "error: KeepBest watches the eval metric 'acc', which this loop does not "
            "report; the metrics it reports are: accuracy, loss, num_examples",
        ),
    ],
)
def test_action_flag_errors_say_what_to_do(argv, error, message, digits_dir, tmp_path):
    with pytest.raises(error, match=message):
        run_classifier(f"--data_dir={digits_dir}", f"--model_dir={tmp_path}", *argv)


def test_two_workers_stop_at_the_same_step_and_only_the_chief_writes(tmp_path, digits_dir):
    from test_launch import Run, two_workers

    model_dir = str(tmp_path)
    run = Run(
        two_workers(
            model_dir,
            digits_dir,
            "--eval_every=20",
            "--keep_best_metric=loss",
            "--early_stopping_metric=accuracy",
            "--early_stopping_mode=max",
            "--early_stopping_patience=1",
        )
    ).succeed()
    stops = {
        worker: re.findall(rf"\[{worker}\] stopping at step (\d+): early stopping", run.output)
        for worker in ("worker_0", "worker_1")
    }
    assert stops["worker_0"] == stops["worker_1"] and len(stops["worker_0"]) == 1, run.output
    stop = int(stops["worker_0"][0])
    results = read_results(model_dir)
    assert results["global_step"] == stop < 400 and results["stop_reason"].startswith("early")
    # Both workers saved every best checkpoint together; the chief alone kept them and wrote.
    assert "[worker_0] best loss so far" in run.output
    assert "[worker_1] best loss so far" not in run.output
    record = json.loads(open(os.path.join(model_dir, "best", "best.json")).read())
    assert sorted(os.listdir(os.path.join(model_dir, "best"))) == [
        "best.json",
        "checkpoint",
        f"ckpt-{record['step']}.data-00000-of-00001",
        f"ckpt-{record['step']}.index",
    ]
    assert not glob.glob(os.path.join(model_dir, "**", ".scratch_*"), recursive=True)
    assert "[worker_0] exported SavedModel" in run.output
    assert "[worker_1] exported SavedModel" not in run.output
    assert tf.saved_model.contains_saved_model(os.path.join(model_dir, "export"))
