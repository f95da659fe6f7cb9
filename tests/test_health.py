"""Training health from the one update path: gradient norm, clipping, update/weight ratios."""

import glob
import io
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_environments import TwoArmedBandit, policy_value_network
from test_gan import make_gan

import loops
from conftest import OneWeight, make_trainer, read_results
from loops.core import reporting
from loops.kinds import rl

ROWS, FEATURES, HIDDEN = 7, 4, 3  # 7 rows: 4 and 3 on two replicas
LEARNING_RATE = 0.1
RNG = np.random.default_rng(0)
BATCHES = (
    RNG.normal(size=(4, ROWS, FEATURES)).astype(np.float32),
    RNG.normal(size=(4, ROWS)).astype(np.float32),
)
WEIGHTS = [
    RNG.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
    RNG.normal(size=(HIDDEN,)).astype(np.float32),
    RNG.normal(size=(HIDDEN, 1)).astype(np.float32),
    RNG.normal(size=(1,)).astype(np.float32),
]
LAYERS = ("two_layers.first", "two_layers.second")


class TwoLinearLayers(loops.Loop):
    """Squared error of two linear layers, trained by plain SGD: easy to follow in numpy."""

    def __init__(self, *, clip_norm=None, **loop_args):
        super().__init__(**loop_args)
        self.clip_norm = clip_norm

    def build(self):
        self.model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(HIDDEN, name="first"),
                keras.layers.Dense(1, name="second"),
            ],
            name="two_layers",
        )
        self.model.set_weights(WEIGHTS)
        self.optimizer = keras.optimizers.SGD(LEARNING_RATE)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)

    def checkpoint_items(self):
        return {"model": self.model}

    def _replica_loss(self, x, y):
        count = loops.global_count(tf.shape(x)[0])
        error = tf.reshape(tf.cast(self.model(x), tf.float32), [-1]) - y
        return loops.scale_to_global_batch(tf.square(error), count), {}

    def train_step(self, iterator):
        x, y = next(iterator)
        result = self.update(self._replica_loss, args=(x, y))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def train(num_replicas, steps=4, **settings):
    """(the Trainer, its per-step logs) after `steps` steps on BATCHES (health metrics on:
    health_every 10 unless given)."""
    settings.setdefault("train_data", lambda: tf.data.Dataset.from_tensor_slices(BATCHES))
    settings.setdefault("health_every", 10)
    trainer = make_trainer(
        TwoLinearLayers,
        strategy=loops.testing.replica_strategy(num_replicas),
        steps_per_loop=2,
        progress=settings.pop("progress", None) or loops.testing.quiet_progress(),
        **settings,
    )
    return trainer, trainer.train(steps)


def float64_gradients(weights, x, y):
    """The gradient of the mean squared error of the two layers, in float64."""
    w1, b1, w2, b2 = weights
    hidden = x @ w1 + b1
    d_out = 2.0 * ((hidden @ w2 + b2)[:, 0] - y)[:, None] / len(y)
    d_hidden = d_out @ w2.T
    return [x.T @ d_hidden, d_hidden.sum(0), hidden.T @ d_out, d_out.sum(0)]


def float64_steps(steps=4):
    """Each step's gradient norm and update/weight ratios (model, each layer) in float64 numpy."""
    weights = [np.asarray(value, np.float64) for value in WEIGHTS]
    norms, ratios, layer_ratios = [], [], []
    for x, y in zip(*(np.asarray(batch[:steps], np.float64) for batch in BATCHES)):
        gradients = float64_gradients(weights, x, y)
        norms.append(norm(gradients))
        change = [LEARNING_RATE * g for g in gradients]
        ratios.append(norm(change) / norm(weights))
        layer_ratios.append(
            [norm(change[:2]) / norm(weights[:2]), norm(change[2:]) / norm(weights[2:])]
        )
        weights = [w - c for w, c in zip(weights, change)]
    return np.array(norms), np.array(ratios), np.array(layer_ratios)


def norm(arrays):
    return np.sqrt(sum(np.sum(a**2) for a in arrays))


@pytest.mark.parametrize("num_replicas, grad_accum_steps", [(1, 1), (2, 1), (2, 2)])
def test_gradient_norm_and_update_ratios_equal_a_float64_computation(
    num_replicas, grad_accum_steps
):
    _, logs = train(num_replicas, health_every=2, grad_accum_steps=grad_accum_steps)
    norms, ratios, layer_ratios = float64_steps()
    np.testing.assert_allclose(logs["health/grad_norm"], norms, rtol=1e-5)
    # The ratios on the steps that are multiples of health_every (2 and 4) only.
    np.testing.assert_allclose(logs["health/update_ratio"][[1, 3]], ratios[[1, 3]], rtol=1e-5)
    assert logs["health/update_ratio"][[0, 2]].tolist() == [0.0, 0.0]
    for index, layer in enumerate(LAYERS):
        values = logs[f"health/update_ratio.{layer}"]
        np.testing.assert_allclose(values[[1, 3]], layer_ratios[[1, 3], index], rtol=1e-5)
        assert values[[0, 2]].tolist() == [0.0, 0.0]
    assert "health/clipped" not in logs  # no clip norm: nothing is clipped


@pytest.mark.parametrize(
    "clip_norm, clipped, step",
    [(None, None, 3.0), (1.0, 1.0, 1.0), (2.999, 1.0, 2.999), (3.001, 0.0, 3.0), (5.0, 0.0, 3.0)],
)
def test_the_clipped_flag_agrees_with_the_clip_norm_and_the_ratio_with_the_sgd_step(
    clip_norm, clipped, step
):
    x = np.array([[1.0], [2.0], [3.0], [6.0], [3.0]], np.float32)
    trainer = loops.Trainer(
        OneWeight(clip_norm=clip_norm, learning_rate=LEARNING_RATE),
        strategy=loops.testing.replica_strategy(2),
        train_data=lambda: tf.data.Dataset.from_tensors(x),
        health_every=1,
        progress=loops.testing.quiet_progress(),
    )
    logs = trainer.train(1)
    # The norm before clipping; the update is lr * the clipped gradient, the weight 1.
    assert logs["health/grad_norm"].tolist() == pytest.approx([3.0], rel=1e-6)
    assert logs["health/update_ratio"].tolist() == pytest.approx([LEARNING_RATE * step], rel=1e-5)
    weight = float(trainer.definition.model.weights[0].numpy()[0, 0])
    assert weight == pytest.approx(1.0 - LEARNING_RATE * step, rel=1e-6)
    if clipped is None:
        assert "health/clipped" not in logs
    else:
        assert logs["health/clipped"].tolist() == [clipped]
        assert trainer.write_results()["health"]["clipped"] == clipped


@pytest.mark.parametrize("clip_norm", [None, 0.5])
def test_health_metrics_change_no_weight(clip_norm):
    with_health, logs = train(2, steps=3, clip_norm=clip_norm)
    without, plain_logs = train(2, steps=3, clip_norm=clip_norm, health_every=None)
    for kept, plain in zip(with_health.definition.model.weights, without.definition.model.weights):
        np.testing.assert_array_equal(kept.numpy(), plain.numpy())
    assert logs["loss"].tolist() == plain_logs["loss"].tolist()
    assert not [name for name in plain_logs if name.startswith("health/")]
    assert without.write_results()["health"] == {}


def test_tensorboard_results_and_progress_show_the_health_metrics(tmp_path):
    stream = io.StringIO()
    trainer, logs = train(
        2,
        health_every=2,
        clip_norm=2.0,
        model_dir=str(tmp_path),
        progress=reporting.Progress(stream),
    )
    results = trainer.write_results()
    trainer.close()
    # The inner loop of steps 3 and 4: Means of its steps; the ratios of step 4.
    expected = {
        "grad_norm": reporting.plain_number(np.mean(logs["health/grad_norm"][2:])),
        "clipped": reporting.plain_number(np.mean(logs["health/clipped"][2:])),
        "update_ratio": reporting.plain_number(logs["health/update_ratio"][3]),
        **{
            f"update_ratio.{layer}": reporting.plain_number(logs[f"health/update_ratio.{layer}"][3])
            for layer in LAYERS
        },
    }
    assert read_results(str(tmp_path))["health"] == results["health"]
    assert results["health"] == pytest.approx(expected, rel=1e-6)
    assert not [name for name in results["train"] if "health" in name or "grad" in name]
    scalars = {}
    for path in glob.glob(os.path.join(str(tmp_path), "summaries", "train", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars[(event.step, value.tag)] = float(tf.make_ndarray(value.tensor))
    for name, value in expected.items():
        assert scalars[(4, f"health/{name}")] == pytest.approx(value, rel=1e-6), name
    assert scalars[(2, "health/grad_norm")] == pytest.approx(
        np.mean(logs["health/grad_norm"][:2]), rel=1e-6
    )
    line = next(line for line in stream.getvalue().splitlines() if line.startswith("step 4/4"))
    assert f"grad_norm {expected['grad_norm']:.4g}" in line and "update_ratio" not in line


def seeded(seed):
    return keras.initializers.GlorotUniform(seed=seed)


class FiveLayers(TwoLinearLayers):
    def build(self):
        self.model = keras.Sequential(
            [keras.Input((FEATURES,))]
            + [
                keras.layers.Dense(FEATURES, name=f"layer{i}", kernel_initializer=seeded(i))
                for i in range(4)
            ]
            + [keras.layers.Dense(1, name="out", kernel_initializer=seeded(4))],
            name="deep",
        )
        self.optimizer = keras.optimizers.SGD(LEARNING_RATE)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model)


def test_the_layers_with_the_largest_ratios_are_reported_and_kept_until_measured_again():
    trainer = make_trainer(
        FiveLayers,
        strategy=loops.testing.replica_strategy(1),
        train_data=lambda: tf.data.Dataset.from_tensor_slices(BATCHES),
        steps_per_loop=1,
        health_every=3,
        progress=loops.testing.quiet_progress(),
    )
    logs = trainer.train(4)
    at_step_3 = {
        name[len("health/") :]: value[2]
        for name, value in logs.items()
        if name.startswith("health/update_ratio.")
    }
    assert len(at_step_3) == 5
    largest = sorted(at_step_3, key=at_step_3.get, reverse=True)[:3]
    health = trainer.write_results()["health"]  # after step 4, which measured no ratio
    assert sorted(name for name in health if "." in name) == sorted(largest)
    for name in largest:
        assert health[name] == reporting.plain_number(at_step_3[name])
    assert health["update_ratio"] == reporting.plain_number(logs["health/update_ratio"][2])
    assert health["grad_norm"] == reporting.plain_number(logs["health/grad_norm"][3])


def test_a_float16_loss_scale_reports_the_unscaled_norm_and_the_scale():
    first = tuple(batch[0] for batch in BATCHES)
    trainer, logs = train(
        2,
        steps=6,
        mixed_precision="mixed_float16",
        train_data=lambda: tf.data.Dataset.from_tensors(first).repeat(),
    )
    # The first steps overflow at the initial scale (2^15), leave the weights as they
    # were and count in no health metric.
    overflowed = logs["overflow"] == 1
    applied = int(np.argmin(overflowed))
    assert 0 < applied < 6 and logs["health/grad_norm"][overflowed].tolist() == [0.0] * applied
    expected = norm(float64_gradients([np.float64(w) for w in WEIGHTS], *map(np.float64, first)))
    # float16 compute: near the float64 norm (not times the loss scale).
    assert logs["health/grad_norm"][applied] == pytest.approx(expected, rel=1e-2)
    health = trainer.write_results()["health"]
    assert health["loss_scale"] == logs["loss_scale"][-1] == 2.0**15 / 2**applied
    last_loop = ~overflowed[4:]
    assert health["grad_norm"] == pytest.approx(
        np.mean(logs["health/grad_norm"][4:][last_loop]), rel=1e-6
    )


def test_the_gan_reports_each_networks_health_and_ppo_its_updates():
    gan_logs = make_gan(loops.testing.replica_strategy(2), clip_norm=1.0, health_every=1).train(2)
    for network in ("d_", "g_"):
        for metric in ("grad_norm", "clipped", "update_ratio"):
            values = gan_logs[f"health/{network}{metric}"]
            assert values.shape == (2,) and np.all(np.isfinite(values)), (network, metric)
        assert np.all(gan_logs[f"health/{network}update_ratio"] > 0)
    ppo = make_trainer(
        rl.ActorCriticLoop,
        environment=TwoArmedBandit(),
        model_fn=policy_value_network,
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_envs=8,
        rollout_length=4,
        global_batch_size=16,
        epochs=2,
        seed=1,
        strategy=loops.testing.replica_strategy(2),
        steps_per_loop=2,
        health_every=1,
        progress=loops.testing.quiet_progress(),
    )
    ppo_logs = ppo.train(2)
    # Means over the step's 4 updates (2 epochs of 2 minibatches).
    assert np.all(ppo_logs["health/grad_norm"] > 0) and np.all(ppo_logs["health/update_ratio"] > 0)
    assert set(ppo.write_results()["health"]) >= {"grad_norm", "clipped", "update_ratio"}
