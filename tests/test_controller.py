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
from conftest import failing_at_batch
from loops.run import failed_frames
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
        if step == 4:
            loop.request_stop("enough at step 4")


def test_the_trainer_reads_the_run_state_of_its_controller(tmp_path):
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
        actions=[StopAtStep4()],
        record={"learning_rate": 0.01},
    )
    controller = loop.controller
    assert isinstance(controller, loops.Controller) and controller.trainer is loop
    assert isinstance(loop.definition, loops.ClassifierLoop)
    assert (
        loop.definition.strategy is loop.strategy
        and loop.definition.global_step is loop.global_step
    )

    logs = loop.train(10)

    assert loop.step == 4 and logs["nonfinite"].tolist() == [0, 1, 1, 0]
    assert loop.skipped_steps == controller.skipped_steps == 2
    assert loop.stop_reason == controller.stop_reason == "enough at step 4"
    assert loop.preempted is controller.preempted is False
    assert loop.last_train_metrics is controller.report.last_train_metrics
    assert loop.last_train_metrics["nonfinite"] == 1  # the last inner loop: steps 3 and 4
    assert [entry["step"] for entry in controller.report.eval_history] == [2, 4]
    assert loop.last_eval_metrics is controller.report.last_eval_metrics
    assert loop.last_eval_metrics == {
        name: value for name, value in controller.report.eval_history[-1].items() if name != "step"
    }
    assert loop.steps_per_second == controller.report.steps_per_second > 0
    assert loop.checkpointer is controller.checkpointer
    assert loop.checkpointer.restore() is not None and loop.step == 4  # saved at the stop
    assert (loop.model_dir, loop.eval_every, loop.is_chief) == (str(tmp_path), 2, True)
    assert loop.progress is controller.progress and loop.summaries is controller.summaries
    with open(os.path.join(str(tmp_path), "results.json")) as stream:
        results = json.load(stream)
    assert (results["global_step"], results["skipped_steps"], results["stop_reason"]) == (
        4,
        2,
        "enough at step 4",
    )
    assert results["config"] == {"learning_rate": 0.01}
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


class Counter(loops.Loop):
    needs_train_data = False

    def build(self):
        self.total = tf.Variable(
            0.0, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
        )

    def checkpoint_items(self):
        return {"total": self.total}

    def train_step(self, iterator):
        self.total.assign_add(1.0)
        return {"total": loops.Last(self.total.read_value())}


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
        line for line in resumed.progress.stream.getvalue().splitlines() if "warning" in line
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
    assert resumed.step == 2 and float(resumed.definition.total.numpy()) == 2.0
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
