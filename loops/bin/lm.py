"""Trains a byte-level language model on Python's own source: `python -m loops.bin.lm`."""

from __future__ import annotations

import platform

from absl import flags

from loops import flags as loop_flags

loop_flags.define_loop_flags(
    train_steps=1000, global_batch_size=32, learning_rate=2e-3, steps_per_loop=100
)
with loop_flags.heading("data"):
    flags.DEFINE_integer(
        "sequence_length",
        128,
        "Bytes the model reads per window (a row holds one more: the targets are shifted).",
        lower_bound=1,
    )
with loop_flags.heading("model"):
    flags.DEFINE_integer(
        "width", 128, "Transformer width (a multiple of --num_heads).", lower_bound=1
    )
    flags.DEFINE_integer("num_layers", 2, "Transformer blocks.", lower_bound=1)
    flags.DEFINE_integer("num_heads", 4, "Attention heads per block.", lower_bound=1)
with loop_flags.heading("outputs"):
    flags.DEFINE_integer(
        "sample_length",
        80,
        "Bytes each sample continues its prompt by, at every evaluation "
        "(TensorBoard text and MODEL_DIR/samples).",
        lower_bound=1,
    )
loop_flags.define_export_dir_flag(
    "the trained model as a text generator (serving_default: prompt, length -> text)"
)

FLAGS = flags.FLAGS


def build_loop():
    """The LanguageModelLoop the flags describe; ValueError for a bad combination."""
    import keras

    import loops
    from loops.lm import LanguageModelLoop
    from loops_data import python_text
    from loops_models import lm as lm_models

    strategy = loop_flags.make_strategy()
    loop_flags.check_batch_fits_replicas(strategy)
    length, batch, seed = FLAGS.sequence_length, FLAGS.global_batch_size, FLAGS.seed
    if FLAGS.width % FLAGS.num_heads:
        raise ValueError(
            f"--width={FLAGS.width} is not a multiple of --num_heads={FLAGS.num_heads}; "
            f"pass e.g. --width={FLAGS.num_heads * max(1, FLAGS.width // FLAGS.num_heads)}."
        )
    return LanguageModelLoop(
        model_fn=lambda: lm_models.transformer_lm(
            vocab_size=python_text.VOCAB_SIZE,
            sequence_length=length,
            width=FLAGS.width,
            num_layers=FLAGS.num_layers,
            num_heads=FLAGS.num_heads,
            seed=seed,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(FLAGS.learning_rate),
        sequence_length=length,
        clip_norm=FLAGS.clip_norm,
        unigram_perplexity=python_text.unigram_perplexity(length),
        # The text is the running Python's own: another version reads other counts.
        corpus={"python": platform.python_version(), **python_text.corpus_summary(length)},
        sample_length=FLAGS.sample_length,
        train_data=lambda: python_text.global_batches(
            "train",
            sequence_length=length,
            global_batch_size=batch,
            shuffle_seed=seed,
            repeat=True,
        ),
        eval_data=lambda: python_text.global_batches(
            "eval", sequence_length=length, global_batch_size=batch
        ),
        **loop_flags.loop_arguments(
            strategy,
            loop_flags.resolve_model_dir("lm"),
            actions=[
                loops.ExportOnEnd(
                    export, description="signature serving_default: prompt, length -> text"
                )
            ],
        ),
    )


def export(loop) -> str:
    """Exports the model as a text generator to --export_dir; returns the path."""
    from loops.export import export_text_generator

    return export_text_generator(
        loop.model, loop_flags.resolve_export_dir(loop), sequence_length=loop.sequence_length
    )


def summarize(loop) -> str:
    metrics = loop.last_eval_metrics
    if "perplexity" not in metrics:
        return "no evaluation"
    return (
        f"eval perplexity {metrics['perplexity']:.2f} per byte "
        f"({metrics['bits_per_token']:.3f} bits), against {metrics['unigram_perplexity']:.2f} "
        "for the train split's byte frequencies"
    )


def main(argv):
    loop_flags.run_binary(argv, build_loop, summary=summarize)


def run():
    """Console-script entry point (loops-lm)."""
    loop_flags.run(main, description=__doc__)


if __name__ == "__main__":
    run()
