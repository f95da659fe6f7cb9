"""A bad-step rule of a definition's own, one small object beside the non-finite and loss-spike
rules: a gradient-norm ceiling that stops the run or recovers past the batches that led to it,
to the weights of a run that never saw them."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_loss_spikes import examples
from test_recover import make_loop, recoveries_in_tensorboard, stream, without_batches

import loops
import loops_models as models
from conftest import read_results
from loops.core import outputs
from loops.definition import step_options
from loops.definition.bad_step_rules import RuleSite
from loops.run.faults import builtin_rules
from loops.vocabulary import settings

CEILING = 50.0  # the steps' gradient norms are 1-4, those of batches scaled 50 times ~190


class GradNormError(RuntimeError):
    pass


class GradNormCeiling(loops.BadStepRule):
    """A step whose gradient norm (training health's `health/grad_norm`) is above `ceiling`."""

    cause = "grad_norm"
    reported_as = "above the gradient-norm ceiling"
    error = GradNormError

    def __init__(self, reaction, ceiling):
        super().__init__(reaction)
        self.ceiling = ceiling

    def scan(self, logs, kinds, first_step):
        norms = logs["health/grad_norm"]
        high = norms > self.ceiling
        if not np.any(high):
            return None
        index = int(np.argmax(high))
        return loops.BadStep(
            first_step + index + 1,
            f"health/grad_norm was {norms[index]:.4g}, above the ceiling {self.ceiling:g}",
        )


class CeiledClassifier(loops.ClassifierLoop):
    def __init__(self, reaction, **kwargs):
        super().__init__(**kwargs)
        self.reaction = reaction

    def bad_step_rules(self):
        return [GradNormCeiling(self.reaction, CEILING)]


def ceiled(model_dir, reaction, **settings):
    # Batch 6 is scaled up: step 6's gradient norm is far above the ceiling, its loss finite.
    return make_loop(
        stream(*examples([6])),
        num_replicas=1,
        model_dir=str(model_dir),
        checkpoint_every=4,
        health_every=1,
        definition_class=CeiledClassifier,
        reaction=reaction,
        **settings,
    )


def test_recover_goes_on_with_the_weights_of_a_run_without_its_batches(tmp_path):
    loop = ceiled(tmp_path, "recover")
    logs = loop.train(10)
    assert loop.controller.recoveries.entries == [
        {"step": 6, "restored_step": 4, "skipped_batches": 2, "cause": "grad_norm"}
    ]
    assert len(logs["loss"]) == 10 and float(np.max(logs["health/grad_norm"])) < CEILING
    never_saw = make_loop(stream(*without_batches(*examples(), 5, 6)), 1, health_every=1)
    never_saw.train(10)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_saw),
        rtol=1e-6,
        label="recovered vs never saw batches 5-6",
    )
    loop.close()
    assert read_results(str(tmp_path))["recoveries"][0]["cause"] == "grad_norm"
    assert (
        "step 6 was above the gradient-norm ceiling: recovery 1 of at most 3, back at the "
        "checkpoint of step 4; the train stream moved past 2 batches (those of steps 5 to 6)"
    ) in loop.run_context.progress.stream.getvalue()
    assert recoveries_in_tensorboard(tmp_path) == {6: 1.0}


def test_stop_goes_back_to_the_last_checkpoint_and_raises_the_rules_error(tmp_path):
    loop = ceiled(tmp_path, "stop")
    with pytest.raises(
        GradNormError,
        match=r"^Step 6: health/grad_norm was \d+\.?\d*, above the ceiling 50\. Nothing was "
        r"saved after it; the loop is back at its last checkpoint \(step 4\), where a rerun "
        r"also resumes\. Lower the learning rate, clip gradients or check the input at those "
        r"steps\.$",
    ):
        loop.train(10)
    assert loop.state.step == 4 and loop.controller.recoveries.entries == []
    loop.close()


def test_recover_without_a_model_dir_is_refused_before_the_definition_is_built():
    definition = CeiledClassifier(
        "recover",
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
    )
    with pytest.raises(
        ValueError,
        match=r"^GradNormCeiling's reaction 'recover' goes back to the last checkpoint, and "
        r"CeiledClassifier has model_dir=None, so it keeps none\. Pass model_dir= \(a "
        r"checkpoint of step 0 is saved when training starts\), or the reaction 'stop' to the "
        r"GradNormCeiling of the definition's bad_step_rules\(\)\.$",
    ):
        loops.Trainer(
            definition,
            strategy=loops.testing.replica_strategy(1),
            train_data=stream(*examples([6])),
            health_every=1,
        )
    assert "model" not in vars(definition)  # refused before build made anything


def test_stop_without_a_checkpoint_raises_and_keeps_the_finite_weights():
    # No model_dir: nothing to go back to; the weights after the bad step are finite, so the
    # Trainer may train on (a non-finite step would leave it refusing to).
    loop = make_loop(
        stream(*examples([6])),
        num_replicas=1,
        health_every=1,
        definition_class=CeiledClassifier,
        reaction="stop",
    )
    with pytest.raises(
        GradNormError,
        match=r"^Step 6: health/grad_norm was \d+\.?\d*, above the ceiling 50\. There is no "
        r"checkpoint to go back to: the weights in memory are those after step 6\. Lower the "
        r"learning rate, clip gradients or check the input at those steps\.$",
    ):
        loop.train(9)
    assert loop.state.step == 6 and loop.controller.recoveries.entries == []
    assert len(loop.train(9)["loss"]) == 3


def test_max_recoveries_counts_the_recoveries_of_a_rule_of_the_definitions_own(tmp_path):
    loop = ceiled(tmp_path, "recover", max_recoveries=1)
    assert loop.step_options.max_recoveries == 1 and loop.step_options.on_nonfinite == "stop"
    loop.close()


def test_max_recoveries_without_a_rule_that_recovers_names_the_definitions_own_rules(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^max_recoveries=2 applies only to on_nonfinite='recover' \(got 'stop'\), "
        r"on_loss_spike='recover' \(got 'ignore'\) or a bad-step rule of the definition's own "
        r"made with reaction 'recover' \(Loop.bad_step_rules; got GradNormCeiling 'stop'\); "
        r"drop it, or pass on_nonfinite='recover' \(--on_nonfinite=recover\)\.$",
    ):
        ceiled(tmp_path / "run", "stop", max_recoveries=2)
    assert not (tmp_path / "run").exists()


def test_a_rule_reacts_by_stop_or_recover_only():
    # "skip" leaves an update out in the graph, before the host sees the step's logs.
    with pytest.raises(
        ValueError,
        match=r"^GradNormCeiling's reaction must be 'stop' or 'recover', got 'skip'; a rule to "
        r"ignore is one not registered\.$",
    ):
        GradNormCeiling("skip", CEILING)


class FlaggedAtStep2(loops.Loop):
    """Makes its own data; its flag, named `bad`, marks step 2 (the index being run is 1)."""

    needs_train_data = False

    def train_step(self, iterator):
        return {
            "loss": loops.Mean(tf.cast(self.global_step, tf.float32)),
            "bad": loops.Flag(tf.cast(tf.equal(self.global_step, 1), tf.int32)),
        }


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_the_executor_and_the_policy_know_a_flag_by_its_type_not_its_name(run_eagerly):
    loop = loops.Trainer(
        FlaggedAtStep2(),
        strategy=loops.testing.replica_strategy(1),
        steps_per_loop=4,
        run_eagerly=run_eagerly,
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(
        loops.NonFiniteError,
        match=r"^Step 2: the loss or the gradients were not finite on at least one replica\. "
        r"There is no checkpoint to go back to: the weights in memory are not finite, and "
        r"nothing was saved\. Lower the learning rate",
    ):
        loop.train(4)
    assert loop.state.step == 2  # the inner loop of 4 steps ended after the flagged one


def test_any_bad_is_one_flag_over_a_steps_updates():
    flag = loops.any_bad(tf.constant(0.0), tf.constant(1.0), tf.constant(0.0))
    assert list(flag) == ["nonfinite"] and isinstance(flag["nonfinite"], loops.Flag)
    assert flag["nonfinite"].value.dtype == tf.int32 and int(flag["nonfinite"].value) == 1
    assert int(loops.any_bad(tf.constant(0.0))["nonfinite"].value) == 0


def test_an_eval_step_may_not_return_a_flag():
    with pytest.raises(
        TypeError,
        match=r"^eval_step returned bad=loops\.Flag\(\.\.\.\); a Flag marks a bad train step, "
        r"and an eval step makes no update: return loops\.Sum\(bad\) to count such batches\.$",
    ):
        outputs.columns({"bad": loops.Flag(tf.constant(1))}, "eval_step", arrays=True)


def test_the_built_in_rules_are_the_declared_reactions_in_order_and_a_definitions_rule_is_none():
    rules = builtin_rules.BUILTIN_RULES
    assert tuple(rule.setting for rule in rules) == settings.REACTIONS
    assert settings.REACTIONS == ("on_nonfinite", "on_loss_spike")
    options = loops.RunConfig().replace(on_loss_spike="recover")
    made = builtin_rules.run_rules(
        step_options.of(options),
        RuleSite(False, "loss", "Kind"),
        [GradNormCeiling("stop", CEILING)],
    )
    assert [type(rule).__name__ for rule in made] == [
        "NonFiniteSteps",
        "LossSpikes",
        "GradNormCeiling",
    ]
    assert [rule.reaction for rule in made] == ["stop", "recover", "stop"]
    with pytest.raises(NotImplementedError, match="GradNormCeiling is no built-in rule"):
        GradNormCeiling.from_options(options, RuleSite(False, "loss", "Kind"))
