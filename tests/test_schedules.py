"""Learning-rate schedules: values at hand-picked steps, in the loop, and after a resume."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import tiny_batches
from loops.core import schedules


def rates(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_named_schedules_at_hand_picked_steps():
    assert schedules.make_schedule("constant", learning_rate=0.1, total_steps=100) == 0.1
    step = schedules.make_schedule(
        "step", learning_rate=0.1, total_steps=100, step_size=10, step_factor=0.5
    )
    np.testing.assert_allclose(rates(step, [0, 9, 10, 25]), [0.1, 0.1, 0.05, 0.025], rtol=1e-6)
    cosine = schedules.make_schedule(
        "cosine", learning_rate=0.1, total_steps=100, final_fraction=0.1
    )
    # 0.1 * (0.1 + 0.9 * (1 + cos(pi * t / 100)) / 2)
    np.testing.assert_allclose(
        rates(cosine, [0, 50, 100, 150]), [0.1, 0.055, 0.01, 0.01], rtol=1e-6
    )
    warmup = schedules.make_schedule(
        "warmup_cosine", learning_rate=0.1, total_steps=100, warmup_steps=10, final_fraction=0.1
    )
    np.testing.assert_allclose(
        rates(warmup, [0, 5, 10, 55, 100]), [0.0, 0.05, 0.1, 0.055, 0.01], rtol=1e-6, atol=1e-9
    )


def test_schedules_from_a_function_of_the_step_or_epoch():
    per_step = schedules.PerStep(lambda step: 0.1 / (1.0 + step))
    np.testing.assert_allclose(rates(per_step, [0, 1, 9]), [0.1, 0.05, 0.01], rtol=1e-6)
    per_epoch = schedules.PerEpoch(lambda epoch: 0.1 * 0.5**epoch, steps_per_epoch=3)
    np.testing.assert_allclose(rates(per_epoch, [0, 2, 3, 7]), [0.1, 0.1, 0.05, 0.025], rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="linear"), "Unknown learning-rate schedule 'linear'"),
        (
            dict(name="warmup_cosine", warmup_steps=100),
            "warmup_steps must lie in \\[0, total_steps=100\\)",
        ),
        (dict(name="step", step_factor=0.0), "0 < step_factor <= 1"),
        (dict(name="cosine", final_fraction=2.0), "final_fraction must lie in \\[0, 1\\], got 2.0"),
    ],
)
def test_bad_schedule_settings_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        schedules.make_schedule(learning_rate=0.1, total_steps=100, **kwargs)


def make_loop(model_dir):
    schedule = schedules.make_schedule(
        "warmup_cosine", learning_rate=0.1, total_steps=8, warmup_steps=2
    )
    return loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=1),
            optimizer_fn=lambda: keras.optimizers.SGD(schedule),
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=tiny_batches(),
        steps_per_loop=2,
        model_dir=model_dir,
        progress=loops.testing.quiet_progress(),
    ), schedule


def test_the_loop_reports_the_rate_of_each_step_and_continues_it_after_a_resume(tmp_path):
    loop, schedule = make_loop(str(tmp_path))
    first = loop.train(4)["learning_rate"]
    np.testing.assert_allclose(first, rates(schedule, range(4)), rtol=1e-6, atol=1e-9)
    assert loop.state.last_train_metrics["learning_rate"] == pytest.approx(float(schedule(3)))
    loop.close()
    resumed, _ = make_loop(str(tmp_path))
    second = resumed.train(8)["learning_rate"]
    np.testing.assert_allclose(second, rates(schedule, range(4, 8)), rtol=1e-6, atol=1e-9)
    events = tf.io.gfile.glob(str(tmp_path / "summaries" / "train" / "events.*"))
    tags = {
        value.tag
        for path in events
        for event in tf.compat.v1.train.summary_iterator(path)
        for value in event.summary.value
    }
    assert "learning_rate" in tags
