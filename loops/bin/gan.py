"""Trains a GAN on the 8-Gaussian ring or the digits images: `python -m loops.bin.gan`."""

from __future__ import annotations

from absl import flags

from loops.bin import binary_flags, summaries, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops_data import settings as data_settings

binary_flags.GAN.define()
FLAGS = flags.FLAGS


def build_trainer():
    """The GANLoop the flags describe; ValueError for a bad combination."""
    from loops.kinds.gan import GANLoop
    from loops.model_dir.gan_export import export_generator
    from loops.run.trainer import Trainer
    from loops_data import gan_data
    from loops_models import gan as gan_models

    arguments = loop_flags.binary_arguments(
        f"gan-{FLAGS.dataset}",
        export=lambda definition, path: export_generator(definition.generator, path),
        signature="noise -> samples",
    )
    data = loop_flags.setting_values(data_settings.GAN_DATA)
    training = loop_flags.setting_values(training_settings.GAN)
    optimizer = training_settings.adam_fn(FLAGS.learning_rate, beta_1=training.pop("beta_1"))
    generator, discriminator = gan_models.NETWORKS[data["dataset"]]
    seed = FLAGS.seed
    definition = GANLoop(
        generator_fn=lambda: generator(seed=seed),
        discriminator_fn=lambda: discriminator(seed=seed),
        generator_optimizer_fn=optimizer,
        discriminator_optimizer_fn=optimizer,
        **gan_data.evaluation(data["dataset"]),
        **training,
        **loop_flags.clip_norm_argument(),
    )
    train_data = gan_data.train_data(**data, global_batch_size=FLAGS.global_batch_size, seed=seed)
    return Trainer(definition, train_data=train_data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__, summary=summaries.gan)

if __name__ == "__main__":
    run()
