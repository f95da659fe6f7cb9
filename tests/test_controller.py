"""A Trainer is handed a definition and runs it through its Controller; the definition holds
no run, and belongs to one Trainer."""

import gc
import json
import os
import traceback
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import Counter, failing_at_batch
from loops.core import reporting
from loops.definition import removed_api
from loops.run.faults import failed_frames
from loops.run.train_input import TrainInput


def images_and_labels(nan_rows=()):
    rng = np.random.default_rng(3)
    images = rng.uniform(0, 255, size=(48, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=(48,))
    for row in nan_rows:
        images[row, 4, 4, 0] = np.nan
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)


class StopAtStep4(loops.Action):
    def after_loop(self, loop, step, train_metrics):
        self.seen = loop  # what an action gets of the run
        if step == 4:
            loop.request_stop("enough at step 4")


def test_the_trainer_shows_the_state_and_run_context_of_its_controller(tmp_path):
    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
            optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=images_and_labels(nan_rows=(8 + 6, 16 + 1)),
        eval_data=images_and_labels(),
        steps_per_loop=2,
        eval_every=2,
        model_dir=str(tmp_path),
        on_nonfinite="skip",
        progress=loops.testing.quiet_progress(),
        actions=[stop := StopAtStep4()],
        record={"learning_rate": 0.01},
    )
    controller = loop.controller
    assert isinstance(controller, loops.Controller) and not hasattr(controller, "trainer")
    assert loop.state is controller.state and loop.run_context is controller.run_context
    assert controller.report.state is loop.state
    assert isinstance(loop.definition, loops.ClassifierLoop)
    assert (
        loop.definition.strategy is loop.strategy
        and loop.definition.global_step is loop.global_step
    )

    logs = loop.train(10)

    state, run = loop.state, loop.run_context
    assert stop.seen is run and not hasattr(run, "controller") and not hasattr(run, "train")
    assert state.step == run.step == 4 and logs["nonfinite"].tolist() == [0, 1, 1, 0]
    assert state.skipped_steps == controller._inner_loops.bad_steps.nonfinite.skipped_steps == 2
    assert state.stop_reason == "enough at step 4"
    assert state.preempted is False
    assert run.last_train_metrics is state.last_train_metrics
    assert state.last_train_metrics["nonfinite"] == 1  # the last inner loop: steps 3 and 4
    assert [entry["step"] for entry in controller.report.eval_history] == [2, 4]
    assert run.last_eval_metrics is state.last_eval_metrics
    assert state.last_eval_metrics == {
        name: value for name, value in controller.report.eval_history[-1].items() if name != "step"
    }
    assert state.steps_per_second > 0
    assert run.checkpointer is controller._checkpoints.checkpointer
    assert run.checkpointer.restore() is not None and state.step == 4  # saved at the stop
    assert (run.model_dir, run.eval_every, run.is_chief) == (str(tmp_path), 2, True)
    assert run.config == {"learning_rate": 0.01}
    assert run.progress is controller.report.progress
    assert run.summaries is controller.report.summaries
    with open(os.path.join(str(tmp_path), "results.json")) as stream:
        results = json.load(stream)
    assert (results["global_step"], results["skipped_steps"], results["stop_reason"]) == (
        4,
        2,
        "enough at step 4",
    )
    assert results["config"] == {"learning_rate": 0.01}
    loop.close()


def test_the_run_state_is_read_only_and_the_old_names_name_their_replacement():
    loop = loops.Trainer(Counter(), steps_per_loop=2, progress=loops.testing.quiet_progress())
    loop.train(2)
    with pytest.raises(AttributeError, match=r"trainer.state is read-only \('stop_reason'"):
        loop.state.stop_reason = "mine"
    assert loop.state.stop_reason is None and loop.state.step == 2
    with pytest.raises(AttributeError, match="RunState has no 'steps'"):
        loop.state.record(steps=3)
    for name, replacement in removed_api.MOVED_TRAINER_MEMBERS.items():
        with pytest.raises(AttributeError) as raised:
            getattr(loop, name)
        assert str(raised.value) == (
            f"Trainer.{name} was removed: the Trainer's public face is its methods and its "
            f"parts; read {replacement} ("
            + ("its state" if replacement.startswith("trainer.state.") else "a part of it")
            + ") instead (CHANGELOG.md, the Trainer's state)."
        )
    # What each sentence names is there, and holds what the old name held.
    found = {
        name: eval(replacement.removesuffix("()"), {"trainer": loop})
        for name, replacement in removed_api.MOVED_TRAINER_MEMBERS.items()
    }
    assert (found["step"], found["num_replicas"], found["skipped_steps"]) == (2, 1, 0)
    assert (found["stop_reason"], found["preempted"], found["leaves_out_nonfinite"]) == (
        None,
        False,
        False,
    )
    assert (found["model_dir"], found["checkpointer"], found["is_chief"]) == (None, None, True)
    assert found["last_train_metrics"] == {"total": 2.0} and found["steps_per_second"] > 0
    with pytest.raises(AttributeError, match="'Trainer' object has no attribute 'stepz'"):
        loop.stepz  # noqa: B018
    loop.close()


def test_bad_run_options_fail_before_anything_is_built():
    class CountsBuilds(loops.Loop):
        builds = 0

        def build(self):
            type(self).builds += 1

    with pytest.raises(ValueError, match="steps_per_loop must be a whole number >= 1, got 0"):
        loops.Trainer(CountsBuilds(), steps_per_loop=0, progress=loops.testing.quiet_progress())
    with pytest.raises(TypeError, match="actions must be loops.Action objects, got 'stop'"):
        loops.Trainer(CountsBuilds(), actions=["stop"], progress=loops.testing.quiet_progress())
    assert CountsBuilds.builds == 0
    loop = loops.Trainer(CountsBuilds(), steps_per_loop=3, progress=loops.testing.quiet_progress())
    assert CountsBuilds.builds == 1 and loop.controller.options.steps_per_loop == 3


def test_a_resume_warns_once_about_each_changed_setting_and_records_the_new_ones(tmp_path):
    def counter(config):
        return loops.Trainer(
            Counter(),
            model_dir=str(tmp_path),
            progress=loops.testing.quiet_progress(),
            record=config,
        )

    first = counter({"learning_rate": 0.1, "train_steps": 2})
    first.train(2)
    first.close()
    resumed = counter({"learning_rate": 0.2, "train_steps": 4})  # train_steps is free to change
    warnings = [
        line
        for line in resumed.run_context.progress.stream.getvalue().splitlines()
        if "warning" in line
    ]
    assert warnings == [
        f"warning: learning_rate was 0.1 in the run that wrote {tmp_path} and is 0.2 now; "
        "the checkpoint is restored and training goes on with the new value. If that is not "
        "what you meant, stop and rerun with the old value or a new --model_dir."
    ]
    with open(os.path.join(str(tmp_path), "config.json")) as stream:
        assert json.load(stream) == {
            "learning_rate": 0.2,
            "train_steps": 4,
            # The loop's settings an evaluator must share, recorded without a config too.
            "ema_decay": None,
            "mixed_precision": "none",
            "seed": 0,
            "checkpoint.total": type(resumed.definition.total).__name__,
        }
    assert resumed.state.step == 2 and float(resumed.definition.total.numpy()) == 2.0
    resumed.close()


def test_a_definition_holds_no_run_and_belongs_to_one_trainer():
    definition = Counter()
    # Before a Trainer: its own objects only; no settings, no run methods or state.
    for name in ("train", "evaluate", "model_dir", "progress", "controller", "executor", "total"):
        assert not hasattr(definition, name), name
    # What the Trainer gives it is refused with the reason and the fix, not a bare AttributeError.
    for name in ("global_step", "strategy", "options", "step"):
        with pytest.raises(AttributeError) as missing:
            getattr(definition, name)
        assert str(missing.value) == (
            f"Counter has no {name} yet: a definition gets its strategy, global_step and step "
            "options from the Trainer it is handed to (loops.Trainer(Counter(...), ...)), which "
            "then calls its build(); use them in build and the steps."
        )
    trainer = loops.Trainer(definition, progress=loops.testing.quiet_progress(), seed=3)
    assert trainer.definition is definition and definition.options.seed == 3
    assert float(definition.total.numpy()) == 0.0  # built by the Trainer, in its strategy's scope
    trainer.train(2)
    assert float(definition.total.numpy()) == 2.0 and definition.step == 2
    with pytest.raises(ValueError) as refused:
        loops.Trainer(definition, progress=loops.testing.quiet_progress())
    assert str(refused.value) == (
        "This Counter was handed to a Trainer already, which built it and trains it; a "
        "definition belongs to one Trainer. Make a new Counter(...) for a new Trainer."
    )
    assert float(definition.total.numpy()) == 2.0  # the refusal built nothing


def test_a_failed_train_lets_its_iterator_go_while_its_error_is_held(monkeypatch):
    # An iterator kept until the interpreter's exit (by the error's traceback) can hang the
    # exit: its reader threads call into Python while the exit holds it.
    made = []
    at_step = TrainInput.at_step

    def recording_at_step(self, step):
        iterator = at_step(self, step)
        made.append(weakref.ref(iterator))
        return iterator

    monkeypatch.setattr(TrainInput, "at_step", recording_at_step)
    trainer = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
            optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        ),
        strategy=loops.testing.replica_strategy(1),
        train_data=failing_at_batch(5),
        steps_per_loop=2,
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(tf.errors.OpError) as failure:
        trainer.train(10)
    assert "batch 5 no longer reads" in str(failure.value)
    gc.collect()
    assert len(made) == 1 and made[0]() is None
    # The traceback still names every line it went through, the executor's included.
    lines = traceback.extract_tb(failure.value.__traceback__)
    assert [line.name for line in lines if line.filename.endswith("executors.py")][:1] == ["run"]
    trainer.close()


def test_only_the_frameworks_frames_lose_their_locals():
    def build_with_a_bad_setting():
        mine = "kept"
        loops.Trainer(Counter(), steps_per_loop=0, progress=loops.testing.quiet_progress())
        return mine

    with pytest.raises(ValueError) as refused:
        build_with_a_bad_setting()
    frames = []
    entry = refused.value.__traceback__
    while entry is not None:
        frames.append(entry.tb_frame)
        entry = entry.tb_next
    own = [frame for frame in frames if frame.f_globals["__name__"].startswith("loops.")]
    assert len(own) >= 2 and all(frame.f_locals for frame in own)

    assert failed_frames.drop_framework_locals(refused.value) == len(own)

    assert all(frame.f_locals == {} for frame in own)
    user = [frame for frame in frames if frame.f_code.co_name == "build_with_a_bad_setting"]
    assert len(user) == 1 and user[0].f_locals == {"mine": "kept"}
    assert frames[0].f_locals  # this test's own frame, still running, is left alone


class RecordedSummaries(reporting.Summaries):
    """Summaries that keep each call's scalars instead of writing them."""

    def __init__(self):
        super().__init__(None)
        self.recorded = []

    def scalars(self, name, step, metrics):
        self.recorded.append((name, step, {key: metrics[key] for key in sorted(metrics)}))


def test_report_to_sends_the_runs_summaries_to_the_evaluators_own(tmp_path):
    # The sidecar evaluator's seam: its evaluations are reported to its own directory.
    loop = loops.Trainer(Counter(), steps_per_loop=2, progress=loops.testing.quiet_progress())
    own = RecordedSummaries()
    loop.controller.report_to(own)
    assert loop.run_context.summaries is own
    loop.train(4)
    assert [(name, step, values["total"]) for name, step, values in own.recorded] == [
        ("train", 2, 2.0),
        ("train", 4, 4.0),
    ]
    loop.close()
