"""Trains a byte-level language model on Python's own source: `python -m loops.bin.lm`."""

from __future__ import annotations

from absl import flags

from loops.bin import binary_flags, flag_checks, training_settings
from loops.cli import application
from loops.cli import flags as loop_flags
from loops_models import settings as model_settings

binary_flags.LM.define()
FLAGS = flags.FLAGS


def build_trainer():
    """The LanguageModelLoop the flags describe; ValueError for a bad combination."""
    from loops.kinds.lm import LanguageModelLoop
    from loops.model_dir.lm_export import export_text_generator
    from loops.run.trainer import Trainer
    from loops_data import python_text
    from loops_models import lm as lm_models

    length, seed, batch = FLAGS.sequence_length, FLAGS.seed, FLAGS.global_batch_size
    arguments = loop_flags.binary_arguments(
        "lm",
        export=lambda lm, path: export_text_generator(lm.model, path, sequence_length=length),
        signature="prompt, length -> text",
    )
    model = loop_flags.setting_values(model_settings.TRANSFORMER_LM)
    replica_rows = -(-batch // arguments["strategy"].num_replicas_in_sync)
    model_settings.check_transformer_fits(model, sequence_length=length, rows=replica_rows)
    definition = LanguageModelLoop(
        model_fn=lambda: lm_models.transformer_lm(
            vocab_size=python_text.VOCAB_SIZE, sequence_length=length, seed=seed, **model
        ),
        optimizer_fn=training_settings.optimizer_fn(
            loop_flags.setting_values(training_settings.OPTIMIZER),
            learning_rate=FLAGS.learning_rate,
            total_steps=FLAGS.train_steps,
        ),
        sequence_length=length,
        sample_length=FLAGS.sample_length,
        **python_text.corpus_notes(length),
        **loop_flags.clip_norm_argument(),
    )
    data = python_text.splits(sequence_length=length, global_batch_size=batch, seed=seed)
    return Trainer(definition, **data, **arguments)


main, run = application.entry_points(build_trainer, description=__doc__, **flag_checks.LM)

if __name__ == "__main__":
    run()
