"""ema_decay: a moving average of the trained weights for any loop, exact on any replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_parity as parity

import loops
from conftest import read_results
from loops.core.weight_average import WeightAverage

DECAY = 0.8


def build(ema_decay=DECAY, **loop_args):
    # Adam without batch norm: every trainable variable moves each step.
    return parity.classifier_builder("adam", batch_norm=False, ema_decay=ema_decay, **loop_args)


def trainable_values(loop):
    return [v.numpy() for v in loop.definition.model.trainable_variables]


def test_the_average_is_the_debiased_recurrence_of_the_trained_weights():
    loop = build()(loops.testing.replica_strategy(1))
    average = loop.definition.update.average
    history = [trainable_values(loop)]
    for step in range(1, 13):
        loop.train(step)
        history.append(trainable_values(loop))
    expected = [w.astype(np.float64) for w in history[0]]
    for k, weights in enumerate(history[1:]):
        decay = min(DECAY, (1 + k) / (10 + k))
        expected = [e + (1 - decay) * (w - e) for e, w in zip(expected, weights)]
    assert int(average.num_updates.numpy()) == 12
    for value, want in zip(average.averages, expected):
        np.testing.assert_allclose(value.numpy(), want, rtol=1e-5, atol=1e-7)
    # Early debiasing: after 12 updates the average sits near the latest weights.
    assert np.max(np.abs(expected[0] - history[-1][0])) < np.max(
        np.abs(history[0][0] - history[-1][0])
    )


def test_averages_agree_on_1_2_and_4_replicas():
    runs = loops.testing.assert_replica_parity(build(), num_steps=7)
    averaged = [key for key in runs[1]["weights"] if key.startswith("weight_averages/")]
    # The mlp's 6 trainable variables (3 kernels, 3 biases) and the update count.
    assert len(averaged) == 7


def test_evaluation_uses_the_averages_and_leaves_the_trained_weights(tmp_path):
    loop = build(model_dir=str(tmp_path))(loops.testing.replica_strategy(2))
    loop.train(6)
    trained = trainable_values(loop)
    raw_metrics = loop.definition.run_evaluation(loop.run_context)
    with loop.averaged_weights():
        swapped = trainable_values(loop)
        averaged_metrics = loop.definition.run_evaluation(loop.run_context)
        with loop.definition.raw_weights():
            for before, now in zip(trained, trainable_values(loop)):
                np.testing.assert_array_equal(before, now)
    metrics = loop.evaluate()
    assert metrics == averaged_metrics
    assert abs(metrics["loss"] - raw_metrics["loss"]) > 1e-4
    for value, average in zip(swapped, loop.definition.update.average.averages):
        np.testing.assert_array_equal(value, average.numpy())
    for before, now in zip(trained, trainable_values(loop)):
        np.testing.assert_array_equal(before, now)
    # The checkpoint holds the trained weights, with their averages beside them.
    path = loop.save_checkpoint()
    saved_average = [
        name for name, _ in tf.train.list_variables(path) if name.startswith("weight_averages/")
    ]
    assert len(saved_average) == len(loop.definition.model.trainable_variables) + 1
    loop.close()
    restored = build(model_dir=str(tmp_path))(loops.testing.replica_strategy(2))
    assert restored.state.step == 6
    for before, now in zip(trained, trainable_values(restored)):
        np.testing.assert_array_equal(before, now)
    restored.close()


def test_a_resumed_run_averages_exactly_as_an_uninterrupted_one(tmp_path):
    strategy = loops.testing.replica_strategy(2)
    whole = build()(strategy)
    whole.train(8)
    first = build(model_dir=str(tmp_path), checkpoint_every=3)(strategy)
    first.train(5)  # saved at 3 and 5
    first.close()
    resumed = build(model_dir=str(tmp_path), checkpoint_every=3)(strategy)
    assert resumed.state.step == 5
    resumed.train(8)
    loops.testing.assert_close(
        loops.testing.loop_weights(resumed),
        loops.testing.loop_weights(whole),
        rtol=1e-6,
        label="resumed vs uninterrupted",
    )
    assert int(resumed.definition.update.average.num_updates.numpy()) == 8
    resumed.close()


def test_a_skipped_update_leaves_the_average_alone():
    from test_new_step import WeightedRegression, data

    loop = loops.Trainer(
        WeightedRegression(),
        strategy=loops.testing.replica_strategy(2),
        train_data=data(poison_row=30),
        on_nonfinite="skip",
        ema_decay=0.5,
        progress=loops.testing.quiet_progress(),
    )
    loop.train(2)
    average = loop.definition.update.average
    before = [v.numpy() for v in average.averages]
    logs = loop.train(3)
    assert logs["nonfinite"].tolist() == [1]
    assert loop.state.skipped_steps == 1
    assert int(average.num_updates.numpy()) == 2
    for old, new in zip(before, average.averages):
        np.testing.assert_array_equal(old, new.numpy())
    loop.train(4)  # and the next applied update is averaged in again
    assert int(average.num_updates.numpy()) == 3


def test_a_new_kind_of_step_gets_the_average_from_its_update():
    from test_new_step import build as build_regression

    loop = build_regression(loops.testing.replica_strategy(2), ema_decay=0.5)
    loop.train(4)
    assert int(loop.definition.update.average.num_updates.numpy()) == 4
    assert "weight_averages" in loop.saved_items()


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, True, "0.9"])
def test_a_bad_decay_is_refused_with_the_value(decay):
    with pytest.raises(ValueError, match=f"ema_decay must be in \\(0, 1\\).*got {decay!r}"):
        build(ema_decay=decay)(loops.testing.replica_strategy(1))


def test_a_loop_without_an_averaging_update_refuses_ema_decay():
    class NoUpdates(loops.Loop):
        def build(self):
            self.counter = tf.Variable(0)

    with pytest.raises(ValueError, match="made no Update that averages"):
        loops.Trainer(NoUpdates(), ema_decay=0.9, progress=loops.testing.quiet_progress())


def test_an_unbuilt_model_is_refused_when_its_average_is_made():
    with pytest.raises(ValueError, match="no variables to average yet"):
        WeightAverage(
            keras.Sequential([keras.layers.Dense(2)]).trainable_variables, decay=0.9, name="u"
        )


def test_the_evaluator_beside_a_run_evaluates_its_averaged_weights(tmp_path):
    trainer = build(model_dir=str(tmp_path), checkpoint_every=3, eval_every=3)(
        loops.testing.replica_strategy(2)
    )
    trainer.train(6)
    trainer.close()
    trainer_evals = {entry["step"]: entry for entry in read_results(str(tmp_path))["history"]}
    evaluator = build()(loops.testing.replica_strategy(1))
    history = loops.evaluate_checkpoints(evaluator, str(tmp_path), train_steps=6)
    assert [entry["step"] for entry in history] == [3, 6]
    for entry in history:
        # The trainer evaluated its averages at these steps, on 2 replicas.
        assert entry["metrics"]["loss"] == pytest.approx(
            trainer_evals[entry["step"]]["loss"], rel=1e-5
        )
    # And the averages are what made the difference: the trained weights score otherwise.
    with evaluator.averaged_weights(), evaluator.definition.raw_weights():
        raw_loss = evaluator.definition.run_evaluation(evaluator.run_context)["loss"]
    assert abs(raw_loss - history[-1]["metrics"]["loss"]) > 1e-4
