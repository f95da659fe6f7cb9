"""One executor call runs several inner loops when only their reports separate them; the
reports, evaluations, actions and history are those of one call per inner loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import make_trainer
from loops.run.execution import loop_schedule


def stream():
    rng = np.random.default_rng(5)
    images = rng.uniform(0, 1, size=(96, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=(96,))
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(8, drop_remainder=True)


class Record(loops.Action):
    """Notes every after_loop call; `every` set per instance."""

    def __init__(self, every):
        self.every = every
        self.steps = []

    def after_loop(self, loop, step, train_metrics):
        self.steps.append(step)


def classifier(monkeypatch, joined_seconds, **options):
    """A fresh 1-replica loop of 3-step inner loops, calls joined up to `joined_seconds`."""
    monkeypatch.setattr(loop_schedule, "JOINED_CALL_SECONDS", joined_seconds)
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(1),
        progress=loops.testing.quiet_progress(),
        **{"train_data": stream, "steps_per_loop": 3, **options},
    )


def trained(monkeypatch, *, joined_seconds, actions=(), num_steps=60, **options):
    """Trains a fresh loop; returns its executor's call lengths, train summaries and history."""
    loop = classifier(
        monkeypatch,
        joined_seconds,
        **{"eval_data": stream, "eval_every": 30, "actions": list(actions), **options},
    )
    calls = []
    run = loop.executor.run

    def counted(iterator, steps):
        calls.append(steps)
        return run(iterator, steps)

    loop.executor.run = counted
    summaries = []
    scalars = loop.run_context.summaries.scalars

    def recorded(tag, step, values):
        summaries.append((tag, step, {k: v for k, v in values.items() if "per_second" not in k}))
        scalars(tag, step, values)

    loop.run_context.summaries.scalars = recorded
    history = loop.train(num_steps)
    lines = loop.run_context.progress.stream.getvalue().splitlines()
    return calls, summaries, history, lines, loop


def test_inner_loops_are_joined_between_evaluations_and_report_the_same(monkeypatch):
    joined = trained(monkeypatch, joined_seconds=1e9)
    separate = trained(monkeypatch, joined_seconds=0.0)

    # The first call has no speed to judge from yet; then one call to each evaluation.
    assert joined[0] == [3, 27, 30]
    assert separate[0] == [3] * 20
    joined_summaries, separate_summaries = joined[1], separate[1]
    assert [(tag, step) for tag, step, _ in joined_summaries] == [
        (tag, step) for tag, step, _ in separate_summaries
    ]
    train_steps = [step for tag, step, _ in joined_summaries if tag == "train"]
    assert train_steps == list(range(3, 61, 3))
    for (_, _, a), (_, _, b) in zip(joined_summaries, separate_summaries, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-6, err_msg=name)
    for name in separate[2]:
        np.testing.assert_allclose(joined[2][name], separate[2][name], rtol=1e-6, err_msg=name)
    assert len(joined[3]) == len(separate[3])  # a progress line per inner loop either way
    assert [entry["step"] for entry in joined[4].controller.report.eval_history] == [30, 60]


def test_a_call_is_as_long_as_the_time_it_may_take(monkeypatch):
    calls, *_, loop = trained(monkeypatch, joined_seconds=0.5, eval_every=None, num_steps=600)
    seconds_per_step = loop.controller._inner_loops.seconds_per_step
    assert calls[0] == 3 and sum(calls) == 600
    # Every joined call is a whole number of inner loops within the budget
    # judged from the call before it (its speed is not the last call's).
    assert all(steps % 3 == 0 for steps in calls)
    assert max(calls[1:]) > 3 and seconds_per_step > 0


def test_an_action_called_after_every_inner_loop_keeps_one_call_each(monkeypatch):
    every_loop = Record(every=None)
    calls, *_ = trained(monkeypatch, joined_seconds=1e9, actions=[every_loop])
    assert calls == [3] * 20
    assert every_loop.steps == list(range(3, 61, 3))


def test_an_action_with_every_ends_calls_at_its_steps(monkeypatch):
    every_12 = Record(every=12)
    calls, summaries, *_ = trained(monkeypatch, joined_seconds=1e9, actions=[every_12])
    assert every_12.steps == [12, 24, 36, 48, 60]
    assert calls == [3, 9, 12, 6, 6, 12, 12]  # ends at 3, 12, 24, 30, 36, 48, 60
    assert [step for tag, step, _ in summaries if tag == "train"] == list(range(3, 61, 3))


@pytest.mark.parametrize("joined_seconds", [0.0, 1e9])
def test_a_stop_at_a_nonfinite_step_inside_a_joined_call_reports_the_loops_before_it(
    monkeypatch, joined_seconds
):
    rng = np.random.default_rng(5)
    images = rng.uniform(0, 1, size=(96, 8, 8, 1)).astype(np.float32)
    images[8 * 7 + 2, 1, 1, 0] = np.nan  # a row of step 8's batch
    labels = rng.integers(0, 10, size=(96,))

    def poisoned():
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(8, drop_remainder=True)

    loop = classifier(monkeypatch, joined_seconds, train_data=poisoned, on_nonfinite="stop")
    reported = []
    scalars = loop.run_context.summaries.scalars
    loop.run_context.summaries.scalars = lambda tag, step, values: (
        reported.append((tag, step, values.get("nonfinite"))),
        scalars(tag, step, values),
    )
    loop.train(3)  # the speed is known from here on
    with pytest.raises(loops.NonFiniteError):
        loop.train(30)
    # The inner loop of steps 4-6 reports; the one the stop cut short at step 8 does not.
    train = [(step, nonfinite) for tag, step, nonfinite in reported if tag == "train"]
    assert train == [(3, 0), (6, 0)]
    assert loop.state.step == 8


def test_a_run_that_recovers_keeps_one_call_per_inner_loop(monkeypatch, tmp_path):
    # A recovery from weights found not finite moves past all of a call's steps.
    calls, *_ = trained(
        monkeypatch,
        joined_seconds=1e9,
        on_nonfinite="recover",
        model_dir=str(tmp_path),
        eval_every=None,
        num_steps=30,
    )
    assert calls == [3] * 10
