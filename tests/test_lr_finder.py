"""The learning-rate finder (loops.find_learning_rate, --mode=find_lr): geometric rates that
every optimizer follows, the stop rule, the suggestion on digits, and no trace in the run."""

import gc
import json
import math
import os
import re
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import failing_at_batch, make_trainer, read_results, run_module, tiny_batches
from loops.core import plots
from loops.run import lr_finder

# Measured (digits, the classifier binary's defaults: Adam, batch 64, 2 replicas, 200
# steps): eval accuracy 0.65 at 1e-4, 0.897 at 3e-4, 0.956 at 1e-3, 0.958 at 3e-3,
# 0.975 at 1e-2, 0.975 at 1.4e-2, 0.967 at 2e-2, 0.936 at 3e-2, 0.931 at 1e-1. A short
# run trains well (>= 0.95) from 1e-3 to 2e-2. (The finder suggested 3.8e-3, 1.4e-2 and
# 3.1e-3 with --seed 0, 1 and 2.)
TRAINS_WELL = (1e-3, 2e-2)
WELL_TRAINED_ACCURACY = 0.95


class TwoRates(loops.Loop):
    """Two regressions, each with its own optimizer (one at a constant rate, one on a
    schedule); the step reports the rate each optimizer applied."""

    def build(self):
        self.first = _regression(seed=1)
        self.second = _regression(seed=2)
        self.first_optimizer = keras.optimizers.SGD(0.01)
        schedule = keras.optimizers.schedules.ExponentialDecay(0.02, 10, 0.5)
        self.second_optimizer = keras.optimizers.Adam(schedule)
        self.first_optimizer.build(self.first.trainable_variables)
        self.second_optimizer.build(self.second.trainable_variables)
        self.first_update = loops.Update(self, self.first_optimizer, self.first)
        self.second_update = loops.Update(self, self.second_optimizer, self.second)

    def checkpoint_items(self):
        return {
            "first": self.first,
            "second": self.second,
            "first_optimizer": self.first_optimizer,
            "second_optimizer": self.second_optimizer,
        }

    def train_step(self, iterator):
        # Read before the updates: the rates this step applies.
        rates = [tf.cast(optimizer.learning_rate, tf.float32) for optimizer in self._optimizers()]
        batch = next(iterator)
        first = self.first_update(_squared_error(self.first), args=batch)
        second = self.second_update(_squared_error(self.second), args=batch)
        return {
            "loss": loops.Mean(first.sums["loss"] + second.sums["loss"]),
            "first_rate": loops.Last(rates[0]),
            "second_rate": loops.Last(rates[1]),
        }

    def _optimizers(self):
        return self.first_optimizer, self.second_optimizer


def _regression(seed):
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed)),
        ]
    )


def _squared_error(model):
    def replica_loss(features, targets):
        count = loops.global_count(tf.shape(targets)[0])
        error = tf.squeeze(model(features, training=True), -1) - targets
        return loops.scale_to_global_batch(error**2, count), {}

    return replica_loss


def regression_batches():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 3)).astype(np.float32)
    targets = features @ np.array([1.0, -2.0, 0.5], np.float32)
    return tf.data.Dataset.from_tensor_slices((features, targets)).batch(16)


def two_rates_trainer(num_replicas, **arguments):
    return loops.Trainer(
        TwoRates(),
        strategy=loops.testing.replica_strategy(num_replicas),
        train_data=regression_batches,
        progress=loops.testing.quiet_progress(),
        **arguments,
    )


def test_every_optimizer_follows_the_geometric_rates_on_two_replicas_and_the_state_comes_back():
    trainer = two_rates_trainer(2)
    before = loops.testing.loop_weights(trainer)
    expected = 1e-4 * 1000.0 ** (np.arange(10) / 9)
    for output in ("first_rate", "second_rate"):
        curve = loops.find_learning_rate(
            trainer, min_rate=1e-4, max_rate=0.1, steps=10, stop_factor=1e6, loss=output
        )
        np.testing.assert_allclose(curve.rates, expected, rtol=1e-12)
        assert np.all(np.diff(curve.rates) > 0)
        # The rate each optimizer applied at each step is the finder's (float32).
        np.testing.assert_allclose(curve.losses, expected, rtol=1e-6)
        assert curve.loss_name == output and curve.start_step == 0
        assert curve.stop_reason == "reached the last rate, 0.1"
    after = loops.testing.loop_weights(trainer)
    assert before.keys() == after.keys()
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    # The trainer trains on at its own rates: the constant one and the schedule's.
    logs = trainer.train(2)
    np.testing.assert_allclose(logs["first_rate"], [0.01, 0.01], rtol=1e-6)
    np.testing.assert_allclose(logs["second_rate"], 0.02 * 0.5 ** (np.arange(2) / 10), rtol=1e-6)


def test_the_stop_rule_ends_the_test_once_the_smoothed_loss_is_four_times_its_lowest():
    trainer = two_rates_trainer(1)
    # The recorded "loss" is the rate itself: a curve that only rises, lowest at the start.
    curve = loops.find_learning_rate(
        trainer, min_rate=1e-4, max_rate=1.0, steps=40, stop_factor=4.0, loss="first_rate"
    )
    rates = 1e-4 * 1e4 ** (np.arange(40) / 39)
    average, smoothed = 0.0, []
    for index, rate in enumerate(rates):
        average = lr_finder.SMOOTHING * average + (1 - lr_finder.SMOOTHING) * rate
        smoothed.append(average / (1 - lr_finder.SMOOTHING ** (index + 1)))
        if smoothed[-1] > 4.0 * min(smoothed):
            break
    assert len(curve.rates) == index + 1 < 40
    np.testing.assert_allclose(curve.smoothed_losses, smoothed, rtol=1e-5)
    assert f"is above 4 x its lowest, {smoothed[0]:.4g}" in curve.stop_reason
    assert curve.suggested_rate == pytest.approx(1e-5)  # the first rate / 10
    lines = trainer.run_context.progress.stream.getvalue()
    assert "the loss never fell below its first value" in lines
    assert "lr_find: suggested learning rate 1e-05 (the rate at the lowest smoothed loss, " in lines


def test_a_loss_that_blows_up_ends_the_test_early():
    trainer = make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.build_classifier(
            "mlp", input_shape=(8, 8, 1), num_classes=10, seed=7
        ),
        optimizer_fn=lambda: keras.optimizers.SGD(0.01),
        train_data=tiny_batches(8, 64, shuffle_seed=1),
        progress=loops.testing.quiet_progress(),
    )
    curve = loops.find_learning_rate(trainer, min_rate=1e-3, max_rate=1e6, steps=60)
    assert len(curve.rates) < 60
    last = curve.smoothed_losses[-1]
    lowest = min(value for value in curve.smoothed_losses if math.isfinite(value))
    assert not math.isfinite(last) or last > 4.0 * lowest
    assert re.search(r"not finite|above 4 x its lowest", curve.stop_reason)
    assert curve.rates[-1] > 1.0  # SGD on this net still trains at 1e-1: the blow-up is past it


def test_a_failed_range_test_lets_its_iterator_go_while_its_error_is_held(monkeypatch):
    # Its frames hold the test's train iterator, whose Python reader threads, kept to the
    # interpreter's exit by the error's traceback, can hang the exit.
    made = []
    train_iterator = lr_finder.distributed_input.train_iterator

    def recording_train_iterator(*args, **kwargs):
        iterator = train_iterator(*args, **kwargs)
        made.append(weakref.ref(iterator))
        return iterator

    monkeypatch.setattr(lr_finder.distributed_input, "train_iterator", recording_train_iterator)
    trainer = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
            optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        ),
        strategy=loops.testing.replica_strategy(1),
        train_data=failing_at_batch(3),
        progress=loops.testing.quiet_progress(),
    )
    with pytest.raises(tf.errors.OpError) as failure:
        loops.find_learning_rate(trainer, steps=10)
    assert "batch 3 no longer reads" in str(failure.value)
    gc.collect()
    assert len(made) == 1 and made[0]() is None


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"steps": 1}, "steps must be a whole number >= 2, got 1"),
        ({"min_rate": 0.0}, "min_rate must be a finite number > 0, got 0.0"),
        ({"stop_factor": 1.0}, "stop_factor must be a finite number > 1, got 1.0"),
        ({"min_rate": 0.1, "max_rate": 0.01}, "max_rate=0.01 must be above min_rate=0.1"),
        ({"loss": "accuracy"}, "the train step returns no 'accuracy' .*first_rate, loss"),
        ({"from_checkpoint": "/no/such/run"}, "from_checkpoint='/no/such/run' is neither"),
    ],
)
def test_a_bad_argument_is_refused_with_the_fix(arguments, message):
    trainer = two_rates_trainer(1)
    before = loops.testing.loop_weights(trainer)
    with pytest.raises(ValueError, match=message):
        loops.find_learning_rate(trainer, **arguments)
    after = loops.testing.loop_weights(trainer)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def test_a_trainer_with_a_model_dir_is_refused(tmp_path):
    trainer = two_rates_trainer(1, model_dir=str(tmp_path / "run"))
    with trainer, pytest.raises(ValueError, match="Build the Trainer with model_dir=None"):
        loops.find_learning_rate(trainer)


def hand_made_curve():
    """A curve over four decades that falls, turns up at 10**-2.5 and ends not finite."""
    rates = tuple(1e-5 * 10.0 ** (np.arange(9) / 2))  # 1e-5, 3.2e-5, ..., 1e-1
    smoothed = (2.3, 2.25, 2.15, 1.9, 1.6, 1.3, 1.35, 1.8, math.nan)
    return lr_finder.LearningRateCurve(
        rates=rates,
        losses=(2.3, 2.2, 2.0, 1.6, 1.1, 0.9, 1.4, 3.0, math.inf),
        smoothed_losses=smoothed,
        suggested_rate=rates[5] / 10,
        rule=lr_finder.RULE,
        stop_reason="the loss was not finite",
        loss_name="d_loss+g_loss",
        start_step=0,
    )


def test_the_picture_is_the_loss_on_a_labelled_log_axis_with_the_suggestion_written(tmp_path):
    curve = hand_made_curve()
    figure = plots.learning_rate_figure(
        curve.rates, curve.losses, curve.smoothed_losses, curve.suggested_rate, curve.loss_name
    )
    (axes,) = figure.axes
    assert axes.get_xscale() == "log" and axes.get_xlabel() == "learning rate (log scale)"
    assert axes.get_ylabel() == "d_loss+g_loss"
    assert axes.get_title() == "Learning-rate range test: suggested rate 0.000316"
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["d_loss+g_loss", "d_loss+g_loss, smoothed", "suggested rate 0.000316"]
    raw, smoothed, suggestion = axes.lines
    np.testing.assert_array_equal(raw.get_xdata(), curve.rates)
    np.testing.assert_array_equal(raw.get_ydata(), [*curve.losses[:-1], np.nan])  # a gap at inf
    np.testing.assert_array_equal(smoothed.get_ydata(), curve.smoothed_losses)
    assert list(suggestion.get_xdata()) == [curve.suggested_rate] * 2
    # The loss axis: from the lowest raw loss to the first smoothed one (2.3), 5% margins.
    np.testing.assert_allclose(axes.get_ylim(), (0.9 - 0.07, 2.3 + 0.07), rtol=1e-12)
    # Labelled ticks at the powers of ten in view (the last rate's loss was not finite).
    figure.canvas.draw()
    low, high = axes.get_xlim()
    shown = [(tick, label) for tick, label in zip(axes.get_xticks(), axes.get_xticklabels())]
    shown = [(tick, label.get_text()) for tick, label in shown if low <= tick <= high]
    np.testing.assert_allclose([tick for tick, _ in shown], [1e-5, 1e-4, 1e-3, 1e-2], rtol=1e-9)
    assert [text for _, text in shown] == [
        f"$\\mathdefault{{10^{{{power}}}}}$" for power in range(-5, -1)
    ]
    paths = lr_finder.write_curve(curve, str(tmp_path))
    assert paths == [str(tmp_path / "lr_find.json"), str(tmp_path / "lr_find.png")]
    png = (tmp_path / "lr_find.png").read_bytes()
    assert png == plots.png_bytes(figure)  # the same figure, the same bytes
    assert tf.io.decode_png(png).shape == (420, 640, 4)


def directory_contents(directory):
    """Relative path -> bytes of every file under `directory`."""
    contents = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as stream:
                contents[os.path.relpath(path, directory)] = stream.read()
    return contents


def read_curve(output_dir):
    """lr_find.json, and lr_find.png decoded, from output_dir."""
    with open(os.path.join(output_dir, lr_finder.JSON_FILE)) as stream:
        curve = json.load(stream)
    png = tf.io.read_file(os.path.join(output_dir, lr_finder.PNG_FILE))
    return curve, tf.io.decode_png(png).numpy()


def test_find_lr_from_a_finished_run_leaves_its_model_dir_untouched(tmp_path, digits_dir):
    model_dir = str(tmp_path / "run")
    data = f"--data_dir={digits_dir}"
    trained = run_module(
        "loops.bin.classifier", f"--model_dir={model_dir}", data, "--train_steps=20",
        "--steps_per_loop=10",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    before = directory_contents(model_dir)
    assert "results.json" in before and "checkpoints/ckpt-20.index" in before

    output_dir = str(tmp_path / "lr_find")
    found = run_module(
        "loops.bin.classifier", "--mode=find_lr", f"--model_dir={model_dir}", data,
        "--find_lr_steps=30", f"--find_lr_dir={output_dir}",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    assert directory_contents(model_dir) == before
    assert read_results(model_dir)["global_step"] == 20

    curve, picture = read_curve(output_dir)
    assert picture.shape == (420, 640, 4) and picture.dtype == np.uint8
    assert curve["start_step"] == 20 and curve["loss_name"] == "loss"
    rates = np.array(curve["rates"])
    assert 2 <= len(rates) <= 30 and len(curve["losses"]) == len(rates)
    np.testing.assert_allclose(rates, 1e-7 * 1e8 ** (np.arange(len(rates)) / 29), rtol=1e-12)
    assert f"from {model_dir}/checkpoints/ckpt-20 (step 20)" in found.stdout
    assert (
        f"suggested learning rate {curve['suggested_rate']:.3g} ({lr_finder.RULE})" in found.stdout
    )

    inside = run_module(
        "loops.bin.classifier", "--mode=find_lr", f"--model_dir={model_dir}", data,
        f"--find_lr_dir={model_dir}/lr_find",
    )  # fmt: skip
    assert inside.returncode == 1
    assert f"lies in {model_dir}, the run's directory" in inside.stderr
    assert directory_contents(model_dir) == before


def test_the_suggestion_on_digits_lies_where_a_short_run_trains_well(tmp_path, digits_dir):
    output_dir = str(tmp_path / "lr_find")
    found = run_module(
        "loops.bin.classifier", "--mode=find_lr", f"--data_dir={digits_dir}",
        f"--find_lr_dir={output_dir}",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    curve, _ = read_curve(output_dir)
    suggested = curve["suggested_rate"]
    assert TRAINS_WELL[0] <= suggested <= TRAINS_WELL[1], curve
    assert len(curve["rates"]) < 100  # the loss blew up before the last rate, 10

    model_dir = str(tmp_path / "run")
    trained = run_module(
        "loops.bin.classifier", f"--model_dir={model_dir}", f"--data_dir={digits_dir}",
        f"--learning_rate={suggested}", "--train_steps=200", "--steps_per_loop=100",
        "--eval_every=0",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert read_results(model_dir)["eval"]["accuracy"] >= WELL_TRAINED_ACCURACY


@pytest.mark.parametrize(
    "binary, argv, loss_name",
    [
        ("gan", ["--dataset=ring", "--global_batch_size=64"], "d_loss+g_loss"),
        ("rl", ["--algorithm=dqn"], "loss"),
        ("lm", ["--global_batch_size=16"], "loss"),
    ],
)
def test_every_binary_runs_the_range_test(tmp_path, binary, argv, loss_name):
    output_dir = str(tmp_path / "lr_find")
    found = run_module(
        f"loops.bin.{binary}", "--mode=find_lr", *argv, "--find_lr_steps=8",
        "--find_lr_min_rate=1e-5", "--find_lr_max_rate=1e-3", f"--find_lr_dir={output_dir}",
    )  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    curve, picture = read_curve(output_dir)
    assert curve["loss_name"] == loss_name and picture.shape == (420, 640, 4)
    np.testing.assert_allclose(curve["rates"], 1e-5 * 100.0 ** (np.arange(8) / 7), rtol=1e-12)
    assert all(math.isfinite(loss) for loss in curve["losses"])
    assert curve["suggested_rate"] in [rate / 10 for rate in curve["rates"]]
