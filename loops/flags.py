"""The command-line flags every loop binary shares, and the Loop arguments they give."""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from typing import Callable

from absl import app, flags

from loops import parameter_server, strategies
from loops.loop import NonFiniteError


def define_loop_flags(*, train_steps: int | None, global_batch_size: int | None,
                      learning_rate: float, steps_per_loop: int | None = 100) -> None:
    """Defines the shared flags with this binary's defaults.

    A binary whose defaults depend on another flag (the RL algorithm) passes
    None and fills them in after parsing.
    """
    flags.DEFINE_enum("strategy", "mirrored", list(strategies.STRATEGY_NAMES),
                      "tf.distribute strategy to train with.")
    flags.DEFINE_integer("num_replicas", 2,
                         "Replicas for --strategy=mirrored: that many GPUs when present, "
                         "else the CPU split into that many logical devices.", lower_bound=1)
    flags.DEFINE_string("model_dir", None,
                        "Directory for checkpoints, summaries and results.json. A run "
                        "pointed at a directory with a checkpoint resumes from it. "
                        "Default: a new directory under the system temp dir.")
    flags.DEFINE_integer("train_steps", train_steps,
                         "Total training steps (a resumed run trains up to this step).",
                         lower_bound=1)
    flags.DEFINE_integer("global_batch_size", global_batch_size,
                         "Examples per step over all replicas.", lower_bound=1)
    flags.DEFINE_integer("steps_per_loop", steps_per_loop,
                         "Steps per tf.function call; logs and summaries come between calls.",
                         lower_bound=1)
    flags.DEFINE_integer("eval_every", None,
                         "Evaluate every this many steps (always at the end).", lower_bound=1)
    flags.DEFINE_integer("checkpoint_every", None,
                         "Checkpoint every this many steps (always at the end).", lower_bound=1)
    flags.DEFINE_float("learning_rate", learning_rate, "Optimizer learning rate (> 0).")
    flags.DEFINE_integer("seed", 0, "Seed for initial weights, shuffling and noise.")
    flags.DEFINE_bool("run_eagerly", False, "Run steps eagerly (no tf.function), for debugging.")
    flags.DEFINE_enum("on_nonfinite", "stop", ["stop", "skip"],
                      "After a step whose loss or gradients are not finite on any replica "
                      "(its update is skipped): stop with an error, or skip it and go on.")
    flags.register_validator("learning_rate", lambda value: value > 0,
                             message="--learning_rate must be > 0, e.g. --learning_rate=0.001.")


def quiet_logging() -> None:
    """Keeps TensorFlow's and TFDS's INFO chatter out of the progress lines.

    An explicit --verbosity (or -v) flag still wins.
    """
    from absl import logging
    import tensorflow as tf

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel("ERROR")


def resolve_model_dir(name: str) -> str:
    """--model_dir, or a new timestamped directory under the temp dir."""
    if flags.FLAGS.model_dir:
        return flags.FLAGS.model_dir
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(tempfile.gettempdir(), "loops", f"{name}-{stamp}")


def check_batch_fits_replicas(strategy) -> None:
    """Raises ValueError when the global batch cannot give every replica an example."""
    batch, replicas = flags.FLAGS.global_batch_size, strategy.num_replicas_in_sync
    if batch < replicas:
        raise ValueError(
            f"--global_batch_size={batch} is smaller than the {replicas} replicas, so some "
            f"replicas would never get an example; pass --global_batch_size>={replicas}.")


def loop_arguments(strategy, model_dir: str) -> dict:
    """The `Loop` keyword arguments the shared flags set."""
    values = flags.FLAGS
    return {"strategy": strategy, "model_dir": model_dir, "steps_per_loop": values.steps_per_loop,
            "eval_every": values.eval_every, "checkpoint_every": values.checkpoint_every,
            "seed": values.seed, "run_eagerly": values.run_eagerly,
            "on_nonfinite": values.on_nonfinite}


def run_binary(argv, build_loop: Callable, *, train_steps: Callable[[], int],
               summary: Callable | None = None, after_training: Callable | None = None) -> None:
    """The body of every binary's main: build the loop, train, say where outputs went.

    Args:
        argv: what absl left after parsing flags; anything there is an error.
        build_loop: () -> Loop from the flags; ValueError for a bad combination.
        train_steps: () -> the total steps to train to (read after building).
        summary: loop -> one line to print after training, or None.
        after_training: loop -> None, run after training (exports), or None.
    """
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}; every option is a --flag.")
    quiet_logging()
    if flags.FLAGS.strategy == "parameter_server":
        try:
            parameter_server.serve_unless_chief()  # a worker or ps task never returns
        except ValueError as error:
            raise app.UsageError(str(error)) from error
    try:
        loop = build_loop()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    try:
        loop.train(train_steps())
    except NonFiniteError as error:
        sys.exit(f"error: {error}")
    if after_training is not None:
        after_training(loop)
    if summary is not None:
        loop.progress.line(summary(loop))
    report_outputs(loop)


def report_outputs(loop) -> None:
    """Tells the user where the run's outputs went."""
    if not loop.is_chief:
        return
    directory = loop.model_dir
    loop.progress.line(
        f"outputs in {directory}\n"
        f"  results:     {os.path.join(directory, 'results.json')}\n"
        f"  checkpoints: {os.path.join(directory, 'checkpoints')} (rerun with "
        f"--model_dir={directory} and a larger --train_steps to continue)\n"
        f"  summaries:   tensorboard --logdir {os.path.join(directory, 'summaries')}")
