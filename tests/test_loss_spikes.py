"""on_loss_spike: a loss that stays far above its moving average stops the run or is rolled
back like a non-finite step, to the weights of a run that never saw the batches."""

import keras
import numpy as np
import pytest
from test_recover import (
    BATCH,
    assert_checkpoints_finite,
    make_loop,
    recoveries_in_tensorboard,
    stream,
    without_batches,
)
from test_recover import examples as recover_examples

import loops
import loops_models as models
from conftest import make_trainer, read_results
from loops.run.faults.loss_spikes import LossSpikeRule, LossSpikes, LossSpikeWatch

RULE = LossSpikeRule(factor=4.0, steps=3, window=100)


def examples(spiked_batches=()):
    """test_recover's images and labels; the images of batches numbered in `spiked_batches`
    (from 1) are scaled up 50 times: their loss is far above the others', and finite."""
    images, labels = recover_examples()
    for batch in spiked_batches:
        images[(batch - 1) * BATCH : batch * BATCH] *= 50.0
    return images, labels


def spiking(model_dir, spiked_batches, policy="recover", **kwargs):
    return make_loop(
        stream(*examples(spiked_batches)),
        on_loss_spike=policy,
        model_dir=str(model_dir),
        **kwargs,
    )


def spike_watch(trainer):
    """The loss-spike rule's watch among the trainer's bad-step rules."""
    rules = trainer.controller._inner_loops.bad_steps.rules
    return next(rule.watch for rule in rules if isinstance(rule, LossSpikes))


def watch_scan(losses, rule=RULE, first_step=0):
    watch = LossSpikeWatch(rule)
    spike, state = watch.scan(np.asarray(losses, np.float64), first_step)
    return watch, spike, state


def test_the_rule_needs_steps_in_a_row_above_the_factor_of_a_debiased_average():
    # Noise: a single high step (5.3x) and a run under the factor (3.8x) are not spikes.
    calm = [2.0, 1.8, 10.0, 1.7, 7.0, 7.0, 1.6, 1.5, 1.5] + [1.4] * 5
    watch, spike, state = watch_scan(calm)
    assert spike is None
    watch.commit(state)
    # The high step stayed out of the average: it is the mean of the others, debiased.
    kept = [2.0, 1.8, 1.7, 7.0, 7.0, 1.6, 1.5, 1.5] + [1.4] * 5
    decay = 1 - 1 / RULE.window
    weights = decay ** np.arange(len(kept))[::-1]
    expected = np.sum(weights * kept) / np.sum(weights)
    assert watch.average == pytest.approx(expected, rel=1e-12)
    assert watch.state.numpy()[2] == 0  # no high step in a row at the end
    # Three high steps in a row, from step 21: the spike is the third's (step 23).
    _, spike, _ = watch_scan([1.0] * 20 + [5.0, 6.0, 7.0, 1.0])
    assert spike is not None and (spike.first_high_step, spike.step) == (21, 23)
    assert (spike.loss, spike.average) == (7.0, 1.0)
    # The count goes on across calls (the state is committed between them).
    watch, spike, state = watch_scan([1.0] * 5 + [5.0, 5.0], first_step=100)
    assert spike is None
    watch.commit(state)
    spike, _ = watch.scan(np.array([5.0, 1.0]), 107)
    assert spike is not None and (spike.first_high_step, spike.step) == (106, 108)
    # Not finite: the non-finite policy's, passed over. At or below zero: never high.
    assert watch_scan([1.0, np.nan, np.inf, 1.0, 1.0])[1] is None
    assert watch_scan([-1.0, -0.5, 3.0, 3.0, 3.0])[1] is None


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_a_recovered_spike_ends_with_the_weights_of_a_run_without_its_batches(
    tmp_path, num_replicas
):
    loop = spiking(tmp_path, [6, 7, 8], num_replicas=num_replicas, checkpoint_every=4)
    logs = loop.train(12)
    # Steps 6-8 read the scaled batches; the third high step is the spike: back to the
    # checkpoint of step 4, past batches 5-8.
    assert loop.controller.recoveries.entries == [
        {"step": 8, "restored_step": 4, "skipped_batches": 4, "cause": "loss_spike"}
    ]
    assert len(logs["loss"]) == 12 and float(np.max(logs["loss"])) < 4 * float(logs["loss"][0])
    never_spiked = make_loop(stream(*without_batches(*examples(), 5, 8)), num_replicas)
    never_spiked.train(12)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_spiked),
        rtol=1e-6,
        label="recovered vs never saw batches 5-8",
    )
    loop.close()
    results = read_results(str(tmp_path))
    assert results["recoveries"][0]["cause"] == "loss_spike"
    progress = loop.run_context.progress.stream.getvalue()
    assert (
        "step 8 was a loss spike: recovery 1 of at most 3, back at the checkpoint of step 4; "
        "the train stream moved past 4 batches (those of steps 5 to 8)"
    ) in progress
    assert recoveries_in_tensorboard(tmp_path) == {8: 1.0}


@pytest.mark.parametrize(
    "checkpoint_every, steps_per_loop, restored", [(4, 2, 4), (2, 1, 6), (8, 4, 0)]
)
def test_a_spike_is_rolled_back_past_a_checkpoint_saved_during_it(
    tmp_path, checkpoint_every, steps_per_loop, restored
):
    # Batches 7-9 are high: a checkpoint is saved at step 8, after two of them, before the
    # third makes the spike. The rollback goes to the newest checkpoint before step 7.
    loop = make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(1),
        train_data=stream(*examples([7, 8, 9])),
        steps_per_loop=steps_per_loop,
        progress=loops.testing.quiet_progress(),
        on_loss_spike="recover",
        model_dir=str(tmp_path),
        checkpoint_every=checkpoint_every,
    )
    loop.train(12)
    assert loop.controller.recoveries.entries == [
        {
            "step": 9,
            "restored_step": restored,
            "skipped_batches": 9 - restored,
            "cause": "loss_spike",
        }
    ]
    never_spiked = make_loop(stream(*without_batches(*examples(), restored + 1, 9)), 1)
    never_spiked.train(12)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_spiked),
        rtol=1e-6,
        label=f"rolled back to step {restored} vs never saw batches {restored + 1}-9",
    )
    loop.close()
    progress = loop.run_context.progress.stream.getvalue()
    if restored:  # the checkpoint of step 8 held two high steps: removed, then saved again
        assert (
            "removed ckpt-8: saved at step 7 or later, they hold the steps gone back over"
        ) in progress


def test_a_spike_before_the_first_checkpoint_goes_back_to_step_0(tmp_path):
    loop = spiking(tmp_path, [2, 3, 4], num_replicas=1, checkpoint_every=6)
    loop.train(9)
    assert loop.controller.recoveries.entries == [
        {"step": 4, "restored_step": 0, "skipped_batches": 4, "cause": "loss_spike"}
    ]
    never_spiked = make_loop(stream(*without_batches(*examples(), 1, 4)), 1)
    never_spiked.train(9)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_spiked),
        rtol=1e-6,
        label="recovered to step 0 vs never saw batches 1-4",
    )
    loop.close()


def test_past_max_recoveries_it_stops_with_the_error_and_keeps_finite_checkpoints(tmp_path):
    # Batches 5-7 spike at step 7 (back to 4, past 4 batches); step k then reads batch
    # k + 3: batches 12-14 are steps 9-11, a spike again at step 11, past the limit.
    loop = spiking(tmp_path, [5, 6, 7, 12, 13, 14], checkpoint_every=4, max_recoveries=1)
    with pytest.raises(
        loops.LossSpikeError,
        match=r"Step 11: loss was high from step 9 to 11 \(.*\), and the run has recovered "
        r"1 time already \(max_recoveries=1; at step 7\), so it stops. Nothing was saved "
        r"after it; the loop is back at its last checkpoint \(step 8\)",
    ):
        loop.train(16)
    assert loop.state.step == 8
    loop.close()
    assert_checkpoints_finite(str(tmp_path))


def test_stop_goes_back_to_the_last_checkpoint_and_names_the_spike(tmp_path):
    loop = spiking(tmp_path, [6, 7, 8], policy="stop", num_replicas=1, checkpoint_every=4)
    with pytest.raises(loops.LossSpikeError, match=r"Step 8: loss was high from step 6 to 8"):
        loop.train(12)
    assert loop.state.step == 4
    loop.close()


def test_a_resume_after_a_recovery_continues_it_exactly(tmp_path):
    whole = spiking(tmp_path / "whole", [6, 7, 8], num_replicas=1, checkpoint_every=4)
    whole.train(16)
    whole.close()
    first = spiking(tmp_path / "parts", [6, 7, 8], num_replicas=1, checkpoint_every=4)
    first.train(10)
    average_at_10 = spike_watch(first).average
    first.close()
    # The watch's average and the recovery record come back with the final checkpoint.
    second = spiking(tmp_path / "parts", [6, 7, 8], num_replicas=1, checkpoint_every=4)
    assert second.state.step == 10
    assert spike_watch(second).average == pytest.approx(average_at_10, rel=1e-12)
    second.train(16)
    assert second.controller.recoveries.entries == whole.controller.recoveries.entries
    loops.testing.assert_close(
        loops.testing.loop_weights(second),
        loops.testing.loop_weights(whole),
        rtol=1e-6,
        label="resumed after a recovery vs one run",
    )
    second.close()


def test_bad_settings_are_refused_before_anything_is_built(tmp_path):
    data = stream(*examples())
    with pytest.raises(ValueError, match=r"loss_spike_factor must be a number > 1.*got 1\.0"):
        make_loop(data, on_loss_spike="recover", model_dir=str(tmp_path), loss_spike_factor=1.0)
    with pytest.raises(ValueError, match=r"on_loss_spike must be one of ignore, stop, recover"):
        make_loop(data, on_loss_spike="skip")
    with pytest.raises(ValueError, match=r"on_loss_spike='recover' goes back .* model_dir=None"):
        make_loop(data, on_loss_spike="recover")
    # max_recoveries counts the recoveries of either policy.
    loop = make_loop(data, on_loss_spike="recover", model_dir=str(tmp_path), max_recoveries=5)
    assert loop.step_options.max_recoveries == 5
    loop.close()
    # A definition names the output it watches; the RL loops name none and refuse.
    assert (loops.GANLoop.watched_loss, loops.DQNLoop.watched_loss) == ("d_loss", None)
    assert loops.ActorCriticLoop.watched_loss is None
    no_loss = type("NoLoss", (loops.Loop,), {"watched_loss": None})
    with pytest.raises(
        ValueError, match=r"on_loss_spike='stop' watches a loss .* NoLoss names none"
    ):
        loops.Trainer(no_loss(), on_loss_spike="stop")


def test_a_watched_output_the_steps_do_not_give_is_named(tmp_path):
    misnamed = type("Misnamed", (loops.ClassifierLoop,), {"watched_loss": "total_loss"})
    loop = make_trainer(
        misnamed,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.003),
        strategy=loops.testing.replica_strategy(1),
        train_data=stream(*examples()),
        steps_per_loop=3,
        on_loss_spike="stop",
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(
        ValueError,
        match=r"on_loss_spike watches the train step's 'total_loss' output, and Misnamed's "
        r"steps give \[.*'loss'.*\]\. Set the definition's watched_loss",
    ):
        loop.train(3)
