"""Typed step outputs: Mean, Ratio, Sum and Last aggregate as declared, wherever the numbers go."""

import glob
import io
import os

import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import read_results
from loops.core import outputs, reporting

# Per-step values of an inner loop of 3 steps; the second step's update was left out.
VALUES = np.array([1.0, 100.0, 4.0], np.float32)
WEIGHTS = np.array([1.0, 5.0, 3.0], np.float32)
NONFINITE = np.array([0, 1, 0], np.int32)


def test_each_kind_aggregates_over_an_inner_loop_and_leaves_out_skipped_steps():
    kinds = {
        "mean": loops.Mean,
        "ratio": loops.Ratio,
        "sum": loops.Sum,
        "last": loops.Last,
        "nonfinite": loops.Flag,
    }
    logs = {
        "mean": VALUES,
        "mean/weight": WEIGHTS,
        "ratio": VALUES,
        "ratio/weight": WEIGHTS,
        "sum": VALUES,
        "last": VALUES,
        "nonfinite": NONFINITE,
    }
    metrics = outputs.aggregate_steps(kinds, logs)
    assert metrics["mean"] == pytest.approx((1 * 1 + 4 * 3) / 4)  # weighted, step 2 left out
    assert metrics["ratio"] == pytest.approx((1 + 4) / 4)
    assert metrics["sum"] == 105.0
    assert metrics["last"] == 4.0
    assert metrics["nonfinite"] == 1 and isinstance(metrics["nonfinite"], int)
    per_step = outputs.per_step_values(kinds, logs)
    np.testing.assert_allclose(per_step["ratio"], VALUES / WEIGHTS)
    np.testing.assert_array_equal(per_step["mean"], VALUES)


def test_a_mean_or_ratio_over_nothing_is_nan():
    metrics = outputs.aggregate_steps(
        {"loss": loops.Mean, "nonfinite": loops.Flag},
        {
            "loss": np.array([np.inf], np.float32),
            "loss/weight": np.ones(1, np.float32),
            "nonfinite": np.ones(1, np.int32),
        },
    )
    assert np.isnan(metrics["loss"]) and metrics["nonfinite"] == 1


class Scripted(loops.Loop):
    """Makes its own data: step s (from 1) reports VALUES[s - 1] as every kind of output."""

    needs_train_data = False

    def train_step(self, iterator):
        index = tf.cast(self.global_step % 3, tf.int32)
        value = tf.gather(tf.constant(VALUES), index)
        weight = tf.gather(tf.constant(WEIGHTS), index)
        return {
            "mean": loops.Mean(value, weight=weight),
            "ratio": loops.Ratio(value, weight),
            "total": loops.Sum(tf.cast(value, tf.int64)),
            "last": loops.Last(value),
        }

    def eval_step(self, batch):
        def replica_sums(losses, weights):
            return {
                "weighted": tf.reduce_sum(weights * losses),
                "weight": tf.reduce_sum(weights),
                "rows": tf.size(losses, out_type=tf.int64),
            }

        sums = loops.sum_over_replicas(self.strategy, self.strategy.run(replica_sums, args=batch))
        # A weighted evaluation: sum(w * loss) / sum(w) over the whole eval set.
        return {
            "weighted_loss": loops.Ratio(sums["weighted"], sums["weight"]),
            "rows": loops.Sum(sums["rows"]),
        }


EVAL_LOSSES = np.arange(1, 8, dtype=np.float32)
EVAL_WEIGHTS = np.array([0, 1, 2, 3, 0, 5, 1], np.float32)


def test_progress_tensorboard_and_results_show_each_kind_as_declared(tmp_path):
    stream = io.StringIO()
    loop = loops.Trainer(
        Scripted(),
        strategy=loops.testing.replica_strategy(1),
        steps_per_loop=3,
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((EVAL_LOSSES, EVAL_WEIGHTS)).batch(3),
        model_dir=str(tmp_path),
        progress=reporting.Progress(stream),
    )
    logs = loop.train(3)
    loop.close()
    np.testing.assert_array_equal(logs["last"], VALUES)
    np.testing.assert_allclose(logs["ratio"], VALUES / WEIGHTS)
    # float32 results read as their shortest decimals (reporting.plain_number).
    expected = {
        "mean": reporting.plain_number(np.sum(VALUES * WEIGHTS) / np.sum(WEIGHTS)),
        "ratio": reporting.plain_number(np.sum(VALUES) / np.sum(WEIGHTS)),
        "total": 105,
        "last": 4.0,
    }
    weighted = reporting.plain_number(np.sum(EVAL_WEIGHTS * EVAL_LOSSES) / np.sum(EVAL_WEIGHTS))

    results = read_results(str(tmp_path))
    assert results["train"] == expected
    assert isinstance(results["train"]["total"], int)
    assert results["eval"] == {"weighted_loss": weighted, "rows": 7}

    line = next(line for line in stream.getvalue().splitlines() if line.startswith("step 3/3"))
    assert (
        f"mean {expected['mean']:.4g} | ratio {expected['ratio']:.4g} | total 105 | last 4" in line
    )
    assert f"weighted_loss {weighted:.4g}" in stream.getvalue()

    scalars = {}
    for path in glob.glob(os.path.join(str(tmp_path), "summaries", "*", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars[os.path.basename(os.path.dirname(path)) + "/" + value.tag] = float(
                    tf.make_ndarray(value.tensor)
                )
    for name, value in expected.items():
        assert scalars[f"train/{name}"] == pytest.approx(value, rel=1e-6), name
    assert scalars["eval/weighted_loss"] == pytest.approx(weighted, rel=1e-6)
    assert scalars["eval/rows"] == 7


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_a_weighted_evaluation_is_exact_on_any_replica_count(num_replicas):
    loop = loops.Trainer(
        Scripted(),
        strategy=loops.testing.replica_strategy(num_replicas),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((EVAL_LOSSES, EVAL_WEIGHTS)).batch(3),
        progress=loops.testing.quiet_progress(),
    )
    metrics = loop.evaluate()
    assert metrics["rows"] == 7
    assert metrics["weighted_loss"] == pytest.approx(
        np.sum(EVAL_WEIGHTS * EVAL_LOSSES) / np.sum(EVAL_WEIGHTS), rel=1e-6
    )


def test_a_plain_tensor_output_is_refused_with_the_kinds_to_choose_from():
    class Plain(loops.Loop):
        needs_train_data = False

        def train_step(self, iterator):
            return {"loss": tf.constant(1.0)}

    loop = loops.Trainer(
        Plain(), strategy=loops.testing.replica_strategy(1), progress=loops.testing.quiet_progress()
    )
    with pytest.raises(
        TypeError,
        match=r"train_step returned loss=.*say how it aggregates.*"
        r"loops\.Mean\(loss\).*loops\.Ratio.*loops\.Sum.*"
        r"loops\.Last",
    ):
        loop.train(1)
    assert loop.state.step == 0


# Values a float64 column could not hold by a plain cast: 64-bit integers
# beyond 2**53, the extremes, booleans, and floats narrower than float64.
EXACT_LOGS = {
    "big": tf.constant(2**62 + 1, tf.int64),
    "lowest": tf.constant(-(2**63), tf.int64),
    "huge_unsigned": tf.constant(2**64 - 1, tf.uint64),
    "byte": tf.constant(255, tf.uint8),
    "small": tf.constant(-7, tf.int32),
    "flag": tf.constant(True),
    "half": tf.constant(0.1, tf.float16),
    "brain": tf.constant(0.1, tf.bfloat16),
    "double": tf.constant(0.1, tf.float64),
    "word": tf.constant("seen"),
}


def test_logs_of_every_dtype_come_back_exactly_from_the_compiled_loop():
    class EveryDtype(loops.Loop):
        needs_train_data = False

        def train_step(self, iterator):
            return {name: loops.Last(value) for name, value in EXACT_LOGS.items()}

    loop = loops.Trainer(
        EveryDtype(),
        strategy=loops.testing.replica_strategy(1),
        progress=loops.testing.quiet_progress(),
    )
    logs = loop.executor.run(None, 3).logs
    for name, value in EXACT_LOGS.items():
        expected = tf.stack([value] * 3).numpy()
        assert logs[name].dtype == expected.dtype, name
        np.testing.assert_array_equal(logs[name], expected, err_msg=name)
