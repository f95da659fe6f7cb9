"""The GAN definition: n_critic critic updates, then one generator update, per train step."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import keras
import numpy as np
import tensorflow as tf

from loops.core import outputs, own_files, pictures, reduction
from loops.core.replica_random import replica_rows, step_seed
from loops.core.update import Update, UpdateResult, any_bad, check_clip_norm, update_outputs
from loops.definition.loop import Loop, RunContext
from loops.vocabulary.whole_numbers import check_whole

GAN_LOSSES = ("non_saturating", "wgan_gp")

# Independent random streams drawn from one (seed, step, substep) key.
_NOISE_STREAM = 0
_ALPHA_STREAM = 1
# The evaluation noise is keyed on a step no training step reaches, so it is fixed.
_EVAL_STEP = -1


# ---- Losses: one value per example, scaled to the global batch by the caller. ----


def non_saturating_discriminator_loss(real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
    """-log D(real) - log(1 - D(fake)) per example, from logits (DCGAN)."""
    return tf.nn.softplus(-real_logits) + tf.nn.softplus(fake_logits)


def non_saturating_generator_loss(fake_logits: tf.Tensor) -> tf.Tensor:
    """-log D(G(z)) per example: strong gradients while the critic rejects the fakes."""
    return tf.nn.softplus(-fake_logits)


def wasserstein_critic_loss(real_scores: tf.Tensor, fake_scores: tf.Tensor) -> tf.Tensor:
    """critic(fake) - critic(real) per example (WGAN); the penalty is added separately."""
    return fake_scores - real_scores


def wasserstein_generator_loss(fake_scores: tf.Tensor) -> tf.Tensor:
    """-critic(G(z)) per example (WGAN)."""
    return -fake_scores


def gradient_penalty(
    critic: Callable[[tf.Tensor], tf.Tensor], real: tf.Tensor, fake: tf.Tensor, alpha: tf.Tensor
) -> tf.Tensor:
    """(|grad critic(x)| - 1)^2 per example at x = alpha * real + (1 - alpha) * fake (WGAN-GP).

    Args:
        critic: maps a batch to one score per example; examples must not
            interact (no batch normalization), so the gradient of the summed
            scores holds each example's own input gradient.
        real, fake: batches of the same shape.
        alpha: one mixing weight per example, drawn from U[0, 1].

    Returns:
        A vector with one penalty per example. Differentiable with respect to
        the critic's weights (an outer tape sees the inner gradient).
    """
    alpha = tf.reshape(tf.cast(alpha, real.dtype), [-1] + [1] * (real.shape.rank - 1))
    interpolates = alpha * real + (1.0 - alpha) * fake
    with tf.GradientTape() as tape:
        tape.watch(interpolates)
        scores = critic(interpolates)
    # The gradient of a vector is that of its sum: each example's own input gradient.
    gradients = tape.gradient(scores, interpolates)
    squares = tf.reduce_sum(tf.square(gradients), axis=tf.range(1, tf.rank(gradients)))
    # The epsilon keeps the norm's gradient finite where the input gradient is 0.
    return tf.square(tf.sqrt(squares + 1e-12) - 1.0)


class GANLoop(Loop):
    """Trains a generator against a critic: n_critic critic updates, then one generator update.

    One train step dequeues `n_critic` global batches of real examples. Each critic
    (discriminator) update uses one of them with fresh noise and reads the weights the previous
    update wrote; the generator update then uses fresh noise for as many examples as the last
    real batch held. Every loss is a per-example loss summed and divided by the real global
    number of examples, and noise and interpolation weights are keyed on (seed, step, substep,
    global example index), so 1 and N replicas compute the same numbers. The global step counts
    generator updates; `d_steps` and `g_steps` count the updates of each network. With the
    run's `ema_decay`, the generator's `loops.Update` keeps a moving average of its weights
    (debiased early in training: `loops.core.weight_average`), updated after every applied generator
    update and checkpointed with its update count (the discriminator's is not averaged). An
    update whose loss or gradients are not finite on some replica is reported as `nonfinite` and
    applied or skipped as the run's `on_nonfinite` says (`Loop.apply_update`).

    Each evaluation draws `num_eval_samples` samples from fixed noise, from the generator: its
    moving average when there is one (the trained generator's results are then prefixed `raw_`),
    else the trained generator. `sample_metrics` turns them into metrics, and a picture of them
    is written as a TensorBoard image summary and, on the chief, a PNG in model_dir: with
    `sample_grid` a grid of image samples, with `scatter_marks` a scatter of 2-D samples over
    the marks (e.g. the real modes).

    Example:

        ring = data.ring.Ring()
        definition = GANLoop(
            generator_fn=lambda: models.gan.ring_generator(seed=0),
            discriminator_fn=lambda: models.gan.ring_discriminator(seed=0),
            generator_optimizer_fn=lambda: keras.optimizers.Adam(2e-3, beta_1=0.5),
            discriminator_optimizer_fn=lambda: keras.optimizers.Adam(2e-3, beta_1=0.5),
            sample_metrics=ring.quality)
        trainer = loops.Trainer(
            definition, train_data=lambda: ring.global_batches(512, seed=0), ema_decay=0.999)
        trainer.train(8000)  # trainer.state.last_eval_metrics["modes_covered"] == 8
    """

    name = "gan"
    watched_loss: str | None = "d_loss"  # ~log(4) when balanced; a WGAN's (< 0) never spikes
    # The exact mode applies each of a step's Updates before the next one computes, as one
    # process does; asynchronous workers cannot keep that order (the reason below).
    supports_exact_parameter_server = True
    parameter_server_reason = (
        "a GAN step is n_critic critic updates and then a generator update, each reading the "
        "weights the one before it wrote: on asynchronous workers other steps' updates land "
        "between them"
    )

    def __init__(
        self,
        *,
        # Networks and their optimizers, built in the strategy's scope.
        generator_fn: Callable[[], keras.Model],
        discriminator_fn: Callable[[], keras.Model],
        generator_optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        discriminator_optimizer_fn: Callable[[], keras.optimizers.Optimizer],
        # The game.
        gan_loss: str = "non_saturating",
        n_critic: int = 1,
        gp_weight: float = 10.0,
        clip_norm: float | None = None,
        # Evaluation.
        sample_metrics: Callable[[np.ndarray], Mapping[str, float]] | None = None,
        num_eval_samples: int = 2500,
        sample_grid: tuple[int, int] | None = None,
        scatter_marks: np.ndarray | None = None,
    ):
        """
        Args:
            generator_fn: builds the generator, a model from noise (its input
                shape, without the batch) to samples shaped like the real data.
            discriminator_fn: builds the critic, a model from a batch to one
                logit or score per example (shape [n] or [n, 1]); its examples
                must not interact (no unsynchronized batch statistics).
            generator_optimizer_fn, discriminator_optimizer_fn: build each network's optimizer.
            gan_loss: "non_saturating" (DCGAN) or "wgan_gp" (Wasserstein loss
                with a gradient penalty on interpolates).
            n_critic: critic updates per generator update, each on its own batch.
            gp_weight: weight of the gradient penalty (wgan_gp only).
            clip_norm: clip each network's summed gradient to this global norm; None: no clip.
            sample_metrics: samples (numpy) -> metrics, run at each evaluation.
            num_eval_samples: samples drawn at each evaluation.
            sample_grid: (rows, columns) of image samples drawn at each evaluation, or None.
            scatter_marks: points (m, 2), e.g. the real modes, marked on a scatter of the
                2-D samples drawn at each evaluation, or None.

        Raises:
            ValueError: a bad argument, with the fix.
        """
        _check_arguments(
            clip_norm, gan_loss, n_critic, gp_weight, num_eval_samples, sample_grid, scatter_marks
        )
        self.generator_fn = generator_fn
        self.discriminator_fn = discriminator_fn
        self.generator_optimizer_fn = generator_optimizer_fn
        self.discriminator_optimizer_fn = discriminator_optimizer_fn
        self.gan_loss = gan_loss
        self.n_critic = n_critic
        self.gp_weight = float(gp_weight)
        self.clip_norm = clip_norm
        self.sample_metrics = sample_metrics
        self.num_eval_samples = num_eval_samples
        self.sample_grid = sample_grid
        self.scatter_marks = scatter_marks
        # Each critic update dequeues a batch; the generator update reuses the
        # last one's size. The Loop resumes the input at step * batches_per_step.
        self.batches_per_step = n_critic
        self.sample_files: list[str] = []

    # ---- Loop hooks. ----

    def build(self) -> None:
        self.generator = _built(self.generator_fn(), "generator_fn")
        self.discriminator = _built(self.discriminator_fn(), "discriminator_fn")
        self.replica_losses = _ReplicaLosses(
            self.generator,
            self.discriminator,
            seed=self.options.seed,
            gan_loss=self.gan_loss,
            gp_weight=self.gp_weight,
            n_critic=self.n_critic,
        )
        self.noise_shape = self.replica_losses.noise_shape
        _check_sample_shape(self, tuple(self.generator.outputs[0].shape))
        self.generator_optimizer = self.generator_optimizer_fn()
        self.discriminator_optimizer = self.discriminator_optimizer_fn()
        if self.generator_optimizer is self.discriminator_optimizer:
            raise ValueError(
                "generator_optimizer_fn and discriminator_optimizer_fn returned the same "
                "optimizer; each network needs its own (return a new one from each call)."
            )
        # Built here, in scope: built lazily inside strategy.run they fail (BUILD.md fact 1).
        self.generator_optimizer.build(self.generator.trainable_variables)
        self.discriminator_optimizer.build(self.discriminator.trainable_variables)
        # Evaluation and export use the generator only: its weights alone are averaged.
        self.discriminator_update = Update(
            self,
            self.discriminator_optimizer,
            self.discriminator,
            clip_norm=self.clip_norm,
            average=False,
        )
        self.generator_update = Update(
            self, self.generator_optimizer, self.generator, clip_norm=self.clip_norm
        )
        self.d_steps = _counter("d_steps")
        self.g_steps = _counter("g_steps")

    def checkpoint_items(self):
        return {
            "generator": self.generator,
            "discriminator": self.discriminator,
            "generator_optimizer": self.generator_optimizer,
            "discriminator_optimizer": self.discriminator_optimizer,
            "d_steps": self.d_steps,
            "g_steps": self.g_steps,
        }

    def train_step(self, iterator):
        step = self.global_step.read_value()
        critic_results = []
        for substep in range(self.n_critic):
            real = next(iterator)
            critic_results.append(self.discriminator_step(real, step, substep))
        generator_result = self.generator_step(real, step)
        losses = {
            "d_loss": tf.add_n([result.sums["loss"] for result in critic_results]) / self.n_critic
        }
        if self.gan_loss == "wgan_gp":
            penalties = [
                tf.math.divide_no_nan(result.sums["gradient_penalty"], result.sums["num_examples"])
                for result in critic_results
            ]
            losses["gradient_penalty"] = tf.add_n(penalties) / self.n_critic
        losses["g_loss"] = generator_result.sums["loss"]
        real_examples = tf.add_n([result.sums["num_examples"] for result in critic_results])
        return {
            **{name: outputs.Mean(value) for name, value in losses.items()},
            # The real examples the critic updates read.
            "num_examples": outputs.Sum(tf.cast(real_examples, tf.int64)),
            # Under a float16 loss scale: d_loss_scale, d_overflow, g_loss_scale, g_overflow.
            **update_outputs(critic_results, prefix="d_"),
            **update_outputs([generator_result], prefix="g_"),
            # Set when any of the step's updates was not finite.
            **any_bad(*critic_results, generator_result),
        }

    def discriminator_step(self, real, step: tf.Tensor, substep: int) -> UpdateResult:
        """One critic update on a distributed batch of real examples; cross-replica context.

        `d_steps` counts the updates applied (a non-finite one goes to the
        run's `on_nonfinite` policy).

        Returns:
            The update's result: its sums hold "loss" (and, for wgan_gp, the
            "gradient_penalty" summed over examples, and "num_examples").
        """
        result = self.discriminator_update(
            self._replica_discriminator_loss, args=(real, step, substep)
        )
        self.d_steps.assign_add(1 - tf.cast(result.skipped, tf.int64))
        return result

    def generator_step(self, real, step: tf.Tensor) -> UpdateResult:
        """One generator update with as many fakes as `real` holds per replica.

        Checked like a critic update; `g_steps` counts the updates applied.
        """
        result = self.generator_update(self._replica_generator_loss, args=(real, step))
        self.g_steps.assign_add(1 - tf.cast(result.skipped, tf.int64))
        return result

    def run_evaluation(self, run: RunContext) -> dict[str, float]:
        # The Controller evaluates in averaged_weights(); this says so for a direct call too.
        with self.averaged_weights():
            metrics = self._evaluate_samples(run, prefix="")
            if self.weight_averages:
                with self.raw_weights():
                    metrics.update(self._evaluate_samples(run, prefix="raw_"))
        return metrics

    def _evaluate_samples(self, run: RunContext, prefix: str) -> dict[str, float]:
        samples = self.sample(self.num_eval_samples)
        picture = _samples_picture(self, samples)
        if picture is not None:
            _write_picture(self, run, picture, prefix)
        if self.sample_metrics is None:
            return {}
        return {prefix + name: value for name, value in self.sample_metrics(samples).items()}

    def results_extra(self):
        # The losses and sample metrics are in the run's "train" and "eval" entries.
        return {
            "d_steps": int(self.d_steps.numpy()),
            "g_steps": int(self.g_steps.numpy()),
            "sample_files": self.sample_files,
        }

    # ---- Sampling. ----

    def sample(self, count: int, *, generator: keras.Model | None = None) -> np.ndarray:
        """`count` samples of `generator` (default: the loop's, which holds its moving average
        inside `averaged_weights`) from fixed, seeded noise."""
        noise = tf.random.stateless_normal(
            (count,) + self.noise_shape,
            seed=step_seed(self.options.seed, _EVAL_STEP, 0, _NOISE_STREAM),
        )
        return np.asarray((generator or self.generator)(noise, training=False))

    # ---- Replica steps: the losses the Updates differentiate (`_ReplicaLosses`). ----

    def _replica_discriminator_loss(self, real, step, substep):
        return self.replica_losses.discriminator_loss(real, step, substep)

    def _replica_generator_loss(self, real, step):
        return self.replica_losses.generator_loss(real, step)


class _ReplicaLosses:
    """The game's losses on one replica's share of a step: the critic's and the generator's,
    with the noise and interpolation weights keyed on (seed, step, substep, global example
    index), so that 1 and N replicas compute the same numbers.

    Args:
        generator, discriminator: the GANLoop's built networks.
        seed: the run's seed.
        gan_loss, gp_weight, n_critic: the GANLoop's.
    """

    def __init__(
        self,
        generator: keras.Model,
        discriminator: keras.Model,
        *,
        seed: int,
        gan_loss: str,
        gp_weight: float,
        n_critic: int,
    ):
        self.generator = generator
        self.discriminator = discriminator
        self.noise_shape = tuple(generator.inputs[0].shape[1:])
        self.seed = seed
        self.gan_loss = gan_loss
        self.gp_weight = gp_weight
        self.n_critic = n_critic

    def noise(self, step, substep, local_rows, global_rows):
        return replica_rows(
            tf.random.stateless_normal,
            step_seed(self.seed, step, substep, _NOISE_STREAM),
            local_rows=local_rows,
            global_rows=global_rows,
            row_shape=self.noise_shape,
        )

    def scores(self, model, inputs):
        scores = tf.cast(model(inputs, training=True), tf.float32)
        return tf.reshape(scores, [-1])

    def discriminator_loss(self, real, step, substep):
        real = tf.cast(real, tf.float32)
        local_rows = tf.shape(real)[0]
        count = reduction.global_count(local_rows)
        # A constant to the critic's update (the Update's tape sees this whole
        # function): no backward pass through the generator is built for it.
        fake = tf.stop_gradient(
            tf.cast(
                self.generator(self.noise(step, substep, local_rows, count), training=True),
                tf.float32,
            )
        )
        logs = {}
        real_scores = self.scores(self.discriminator, real)
        fake_scores = self.scores(self.discriminator, fake)
        if self.gan_loss == "wgan_gp":
            alpha = replica_rows(
                tf.random.stateless_uniform,
                step_seed(self.seed, step, substep, _ALPHA_STREAM),
                local_rows=local_rows,
                global_rows=count,
                row_shape=(),
            )
            penalty = gradient_penalty(
                lambda inputs: self.scores(self.discriminator, inputs), real, fake, alpha
            )
            per_example = (
                wasserstein_critic_loss(real_scores, fake_scores) + self.gp_weight * penalty
            )
            # Sums: the Update adds up logs over replicas and micro-batches.
            logs["gradient_penalty"] = tf.reduce_sum(penalty)
        else:
            per_example = non_saturating_discriminator_loss(real_scores, fake_scores)
        # Real examples: what the penalty is averaged over, and the throughput's unit.
        logs["num_examples"] = tf.cast(local_rows, tf.float32)
        return reduction.scale_to_global_batch(per_example, count), logs

    def generator_loss(self, real, step):
        local_rows = tf.shape(real)[0]
        count = reduction.global_count(local_rows)
        noise = self.noise(step, self.n_critic, local_rows, count)
        fake_scores = self.scores(self.discriminator, self.generator(noise, training=True))
        if self.gan_loss == "wgan_gp":
            per_example = wasserstein_generator_loss(fake_scores)
        else:
            per_example = non_saturating_generator_loss(fake_scores)
        return reduction.scale_to_global_batch(per_example, count), {}


def _built(model: keras.Model, source: str) -> keras.Model:
    if (
        not isinstance(model, keras.Model)
        or not model.built
        or not model.trainable_variables
        or not model.inputs
    ):
        raise ValueError(
            f"{source} returned {model!r}, not a Keras model with weights; build it "
            "starting with keras.Input(shape) so its weights exist before training."
        )
    return model


def _counter(name: str) -> keras.Variable:
    # Updated in cross-replica context; ONLY_FIRST_REPLICA keeps one value per
    # step. A Keras variable like every other weight here, so helpers that read
    # `variable.value` as a tensor (loops.testing.loop_weights) see its value.
    return keras.Variable(
        0, dtype="int64", trainable=False, name=name, aggregation="only_first_replica"
    )


def _check_arguments(
    clip_norm: float | None,
    gan_loss: str,
    n_critic: int,
    gp_weight: float,
    num_eval_samples: int,
    sample_grid: tuple[int, int] | None,
    scatter_marks: np.ndarray | None,
) -> None:
    """Raises ValueError, with the fix, for a bad argument of GANLoop."""
    check_clip_norm(clip_norm)
    if gan_loss not in GAN_LOSSES:
        raise ValueError(f"Unknown gan_loss {gan_loss!r}; choose one of {', '.join(GAN_LOSSES)}.")
    check_whole("n_critic", n_critic)
    if not gp_weight >= 0:
        raise ValueError(f"gp_weight must be >= 0, got {gp_weight!r}.")
    check_whole("num_eval_samples", num_eval_samples)
    if sample_grid is not None:
        rows, columns = sample_grid
        if rows < 1 or columns < 1 or rows * columns > num_eval_samples:
            raise ValueError(
                f"sample_grid {sample_grid!r} needs 1 <= rows * columns <= "
                f"num_eval_samples ({num_eval_samples})."
            )
    if scatter_marks is not None:
        _check_marks(scatter_marks, sample_grid)


def _check_marks(marks, sample_grid: tuple[int, int] | None) -> None:
    """Raises ValueError, with the fix, for `scatter_marks` that are not points (m, 2)."""
    if sample_grid is not None:
        raise ValueError(
            "sample_grid draws image samples and scatter_marks 2-D points; pass one of them."
        )
    shape = np.shape(marks)
    if len(shape) != 2 or shape[0] < 1 or shape[1] != 2 or not np.all(np.isfinite(marks)):
        raise ValueError(
            f"scatter_marks must be finite points of shape (m, 2) with m >= 1, got {marks!r} "
            "(e.g. loops_data.ring.Ring().centers())."
        )


def _check_sample_shape(loop: GANLoop, shape: tuple) -> None:
    """Raises ValueError, with the fix, when the samples' picture cannot draw `shape`."""
    if loop.sample_grid is not None and len(shape) != 4:
        raise ValueError(
            f"sample_grid needs a generator of images (batch, height, width, channels); "
            f"this one gives shape {shape}. Pass sample_grid=None for data that is not images."
        )
    if loop.scatter_marks is not None and shape[1:] != (2,):
        raise ValueError(
            f"scatter_marks needs a generator of 2-D points (batch, 2); this one gives "
            f"shape {shape}. Pass scatter_marks=None for other samples."
        )


def _samples_picture(loop: GANLoop, samples: np.ndarray) -> np.ndarray | None:
    """The picture an evaluation writes of its samples (uint8, (h, w, c)); None: none."""
    if loop.sample_grid is not None:
        rows, columns = loop.sample_grid
        grid_samples = pictures.pixels_from_unit_range(samples[: rows * columns])
        return pictures.image_grid(grid_samples, columns)
    if loop.scatter_marks is not None:
        return pictures.scatter_image(samples, loop.scatter_marks)
    return None


def _write_picture(loop: GANLoop, run: RunContext, picture: np.ndarray, prefix: str) -> None:
    """Writes the samples' picture: a TensorBoard image, and on the chief a PNG in model_dir."""
    run.summaries.images("eval", run.step, {prefix + "samples": picture})
    if run.model_dir and run.is_chief:
        path = os.path.join(run.model_dir, f"{prefix}samples-{run.step:06d}.png")
        own_files.write_atomic(path, tf.io.encode_png(picture).numpy())
        loop.sample_files.append(path)
        run.progress.line(f"samples at step {run.step} in {path}")
