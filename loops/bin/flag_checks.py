"""What the classifier and LM binaries check of their flags before TensorFlow loads (their
`prepare`), and the sentence the classifier exits with when an image breaks training.

Each `prepare` raises ValueError (a usage error: `loops.cli.application.entry_points`);
nothing here imports TensorFlow, the example data or the models when loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from absl import flags

from loops.bin import summaries, training_settings
from loops.cli import flags as loop_flags
from loops_data import settings as data_settings
from loops_models import settings as model_settings

FLAGS = flags.FLAGS


def prepare_classifier_flags() -> None:
    """Refuses two sources of data, or a warm-up past the run, before TensorFlow loads."""
    values = loop_flags.setting_values(data_settings.IMAGE_CLASSIFICATION)
    data_settings.check_one_image_source(values, dataset_given=FLAGS["dataset"].present)
    check_schedule_flags()


def check_schedule_flags() -> None:
    """Refuses a warm-up that does not end before the run does (`loops.core.schedules`' range).

    Raises:
        ValueError: --lr_warmup_steps >= --train_steps under warmup_cosine.
    """
    values = flags.FLAGS
    warmup, train_steps = values.lr_warmup_steps, values.train_steps
    if values.lr_schedule == "warmup_cosine" and warmup >= train_steps:
        raise ValueError(
            f"--lr_warmup_steps={warmup} is not below --train_steps={train_steps}: the "
            "warm-up must end before the run does (the rate then decays over the rest); "
            f"pass --lr_warmup_steps<{train_steps} or a larger --train_steps."
        )


def explain_classifier_failure(trainer, error: Exception) -> str | None:
    """An --image_dir file that stopped decoding during training, named; else None."""
    del error  # the file is found by checking the folder again, whatever TensorFlow said
    from loops_data import image_folders

    splits = (FLAGS.train_split, FLAGS.eval_split)
    return image_folders.explain_changed_images(FLAGS.image_dir, splits, trainer)


# The byte-level model's tokens (`loops_data.python_text.VOCAB_SIZE`, whose module imports
# TensorFlow).
LM_VOCAB_SIZE = 256


def prepare_lm_flags() -> None:
    """Refuses a --sequence_length one example's attention cannot fit, weights this machine
    cannot hold, or a warm-up past the run, before TensorFlow loads; an unset
    --lr_warmup_steps is at most a tenth of the run."""
    model = loop_flags.setting_values(model_settings.TRANSFORMER_LM)
    model_settings.check_attention_fits(model, sequence_length=FLAGS.sequence_length)
    model_settings.check_transformer_weights_fit(
        model,
        sequence_length=FLAGS.sequence_length,
        vocab_size=LM_VOCAB_SIZE,
        copies=training_settings.weight_copies(
            loop_flags.setting_values(training_settings.OPTIMIZER)
        ),
    )
    if not FLAGS["lr_warmup_steps"].present:
        # The default warm-up is sized for the default run; a short one (a trial, a test)
        # would otherwise be refused or spend most of its steps warming up.
        loop_flags.set_values(
            {"lr_warmup_steps": min(FLAGS.lr_warmup_steps, FLAGS.train_steps // 10)}
        )
    check_schedule_flags()


class Hooks(TypedDict, total=False):
    """What a binary hands `application.entry_points` besides its Trainer and description."""

    prepare: Callable[[], None]
    explain_failure: Callable[[Any, Exception], str | None]
    summary: Callable[[Any], str]


CLASSIFIER = Hooks(prepare=prepare_classifier_flags, explain_failure=explain_classifier_failure)
LM = Hooks(prepare=prepare_lm_flags, summary=summaries.language_model)
