"""Throughput in the loop's own unit (examples, tokens, env steps) beside steps per second."""

import glob
import io
import os
import re

import pytest
import tensorflow as tf

import loops
from conftest import optimizer_factory, read_results, tiny_examples
from loops_models import classifiers as models


def full_batches():
    images, labels = tiny_examples(24)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(8).repeat()


def tensorboard_scalars(model_dir):
    scalars = {}
    for path in glob.glob(os.path.join(model_dir, "summaries", "train", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def test_examples_per_second_is_the_counted_examples_over_the_same_time(tmp_path):
    stream = io.StringIO()
    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=lambda: models.build_classifier("mlp", input_shape=(8, 8, 1), num_classes=10),
            optimizer_fn=optimizer_factory("adam"),
        ),
        strategy=loops.testing.replica_strategy(2),
        train_data=full_batches,
        steps_per_loop=2,
        model_dir=str(tmp_path),
        progress=loops.core.reporting.Progress(stream),
    )
    loop.train(8)
    loop.close()
    results = read_results(str(tmp_path))
    # Every step holds 8 examples, and both rates are over the same inner loops.
    assert results["examples_per_second"] == pytest.approx(8 * results["steps_per_second"])
    scalars = tensorboard_scalars(str(tmp_path))
    assert sorted(scalars["examples_per_second"]) == [2, 4, 6, 8]
    for step, rate in scalars["examples_per_second"].items():
        assert rate == pytest.approx(8 * scalars["steps_per_second"][step], rel=1e-6)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("step ")]
    assert len(lines) == 4
    for line in lines:
        examples, steps = re.search(r"\| (\d+) examples/s \| ([\d.]+) steps/s \|", line).groups()
        # Both printed rounded: 0 decimals for examples, 1 for steps.
        assert abs(int(examples) - 8 * float(steps)) <= 8 * 0.05 + 0.5, line


def test_a_loop_without_the_counted_output_reports_steps_per_second_alone(tmp_path):
    class Counter(loops.Loop):
        needs_train_data = False

        def build(self):
            self.total = tf.Variable(0.0)

        def checkpoint_items(self):
            return {"total": self.total}

        def train_step(self, iterator):
            self.total.assign_add(1.0)
            return {"total": loops.Last(self.total.read_value())}

    stream = io.StringIO()
    loop = loops.Trainer(
        Counter(), model_dir=str(tmp_path), progress=loops.core.reporting.Progress(stream)
    )
    loop.train(3)
    loop.close()
    results = read_results(str(tmp_path))
    assert results["steps_per_second"] > 0
    assert not [key for key in results if key.endswith("_per_second") and key != "steps_per_second"]
    assert "examples/s" not in stream.getvalue() and "steps/s" in stream.getvalue()
