"""Trains a GAN on the 8-Gaussian ring or the digits images: `python -m loops.bin.gan`."""

from __future__ import annotations

from absl import flags

from loops import flags as loop_flags

loop_flags.define_loop_flags(
    train_steps=8000,
    global_batch_size=512,
    learning_rate=2e-3,
    steps_per_loop=500,
    ema_decay=0.999,
)
with loop_flags.heading("data"):
    flags.DEFINE_enum(
        "dataset",
        "ring",
        ["ring", "digits"],
        "'ring': 8 Gaussians on a circle (2-D points, mode-coverage metrics); "
        "'digits': the bundled 8x8 digit images (sample grids as PNG). For digits "
        "a shorter run is enough, e.g. --train_steps=2000 --global_batch_size=128.",
    )
    flags.DEFINE_string(
        "data_dir", None, "TFDS data directory for digits (default: ~/tensorflow_datasets)."
    )
with loop_flags.heading("training"):
    flags.DEFINE_enum(
        "gan_loss",
        "non_saturating",
        ["non_saturating", "wgan_gp"],
        "'non_saturating': the DCGAN loss; 'wgan_gp': Wasserstein loss with a "
        "gradient penalty, usually with --n_critic=5 (on the ring it covers the "
        "modes but sharpens them more slowly than the default).",
    )
    flags.DEFINE_integer(
        "n_critic",
        1,
        "Discriminator updates per generator update, each on its own batch.",
        lower_bound=1,
    )
    flags.DEFINE_float(
        "gp_weight", 10.0, "Gradient penalty weight for --gan_loss=wgan_gp.", lower_bound=0.0
    )
    flags.DEFINE_float("beta_1", 0.5, "Adam's first-moment decay for both optimizers.")
loop_flags.define_export_dir_flag(
    "the generator (noise in, samples out; the moving average when --ema_decay > 0)"
)
flags.register_validator(
    "beta_1", lambda value: 0 <= value < 1, message="--beta_1 must be in [0, 1), e.g. 0.5."
)

FLAGS = flags.FLAGS

RING_EVAL_SAMPLES = 2500  # PacGAN's and VEEGAN's sample count for the ring metrics
SAMPLE_GRID = (8, 8)


def digits_images(global_batch_size: int, *, seed: int, data_dir: str | None = None):
    """Global batches of digit images scaled to [-1, 1] (the generator's tanh range), no labels."""
    import tensorflow as tf

    import loops_data as data

    return data.global_batches(
        "digits",
        "train",
        global_batch_size=global_batch_size,
        data_dir=data_dir,
        shuffle_seed=seed,
        repeat=True,
    ).map(lambda images, labels: tf.cast(images, tf.float32) / 127.5 - 1.0)


def build_loop():
    """The GANLoop the flags describe; ValueError for a bad combination."""
    import keras

    import loops
    from loops.gan import GANLoop
    from loops_data.ring import Ring
    from loops_models import gan as gan_models

    strategy = loop_flags.make_strategy()
    loop_flags.check_batch_fits_replicas(strategy)
    batch, seed = FLAGS.global_batch_size, FLAGS.seed
    if FLAGS.dataset == "ring":
        ring = Ring()
        models_and_data = dict(
            generator_fn=lambda: gan_models.ring_generator(seed=seed),
            discriminator_fn=lambda: gan_models.ring_discriminator(seed=seed),
            train_data=lambda: ring.global_batches(batch, seed=seed),
            sample_metrics=ring.quality,
            num_eval_samples=RING_EVAL_SAMPLES,
        )
    else:
        models_and_data = dict(
            generator_fn=lambda: gan_models.image_generator(seed=seed),
            discriminator_fn=lambda: gan_models.image_discriminator(seed=seed),
            train_data=lambda: digits_images(batch, seed=seed, data_dir=FLAGS.data_dir),
            sample_grid=SAMPLE_GRID,
            num_eval_samples=SAMPLE_GRID[0] * SAMPLE_GRID[1],
        )

    def optimizer():
        return keras.optimizers.Adam(FLAGS.learning_rate, beta_1=FLAGS.beta_1)

    return GANLoop(
        generator_optimizer_fn=optimizer,
        discriminator_optimizer_fn=optimizer,
        gan_loss=FLAGS.gan_loss,
        n_critic=FLAGS.n_critic,
        gp_weight=FLAGS.gp_weight,
        clip_norm=FLAGS.clip_norm,
        **models_and_data,
        **loop_flags.loop_arguments(
            strategy,
            loop_flags.resolve_model_dir(f"gan-{FLAGS.dataset}"),
            actions=[
                loops.ExportOnEnd(export, description="signature serving_default: noise -> samples")
            ],
        ),
    )


def export(loop) -> str:
    """Exports the generator evaluation samples from to --export_dir; returns the path."""
    from loops.export import export_generator

    return export_generator(loop.generator, loop_flags.resolve_export_dir(loop))


def summarize(loop) -> str:
    from loops_data.ring import Ring

    results, metrics = loop.results_extra(), loop.last_eval_metrics
    summary = f"trained {results['g_steps']} generator and {results['d_steps']} discriminator steps"
    if "modes_covered" in metrics:
        summary += (
            f"; modes covered {metrics['modes_covered']} of {Ring().num_modes}, "
            f"high-quality fraction {metrics['high_quality_fraction']:.3f}"
        )
    return summary


def main(argv):
    loop_flags.run_binary(argv, build_loop, summary=summarize)


def run():
    """Console-script entry point (loops-gan)."""
    loop_flags.run(main, description=__doc__)


if __name__ == "__main__":
    run()
