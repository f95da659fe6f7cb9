"""The command-line flags every loop binary shares, and the Loop arguments they give."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import tempfile
from typing import Callable, Sequence

from absl import app, flags

from loops import exit_codes, parameter_server, strategies
from loops.actions import MODES, Action, EarlyStopping, KeepBest, UnknownMetricError
from loops.loop import NonFiniteError


def define_loop_flags(*, train_steps: int | None, global_batch_size: int | None,
                      learning_rate: float, steps_per_loop: int | None = 100) -> None:
    """Defines the shared flags with this binary's defaults.

    A binary whose defaults depend on another flag (the RL algorithm) passes
    None and fills them in after parsing.
    """
    flags.DEFINE_enum("strategy", "mirrored", list(strategies.STRATEGY_NAMES),
                      "tf.distribute strategy to train with. central_storage keeps the "
                      "variables on one device (the CPU) and computes on --num_replicas "
                      "devices.")
    flags.DEFINE_integer("num_replicas", 2,
                         "Replicas for --strategy=mirrored or central_storage: that many GPUs "
                         "when present, else the CPU split into that many logical devices.",
                         lower_bound=1)
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
                      "After a step whose loss or gradients are not finite on any replica: "
                      "stop with an error (nothing saved after it; back to the last "
                      "checkpoint), or skip its update everywhere and go on.")
    flags.register_validator("learning_rate", lambda value: value > 0,
                             message="--learning_rate must be > 0, e.g. --learning_rate=0.001.")
    flags.DEFINE_string("early_stopping_metric", None,
                        "Stop training once this eval metric (e.g. loss, accuracy) has not "
                        "improved for --early_stopping_patience evaluations in a row; needs "
                        "--eval_every. A rerun of a stopped run stops again at once.")
    flags.DEFINE_enum("early_stopping_mode", "min", list(MODES),
                      "min: lower --early_stopping_metric is better (loss); max: higher is "
                      "better (accuracy).")
    flags.DEFINE_integer("early_stopping_patience", 3,
                         "Evaluations in a row without improvement before stopping.",
                         lower_bound=1)
    flags.DEFINE_string("keep_best_metric", None,
                        "Keep a checkpoint of the best evaluation by this eval metric in "
                        "MODEL_DIR/best (with best.json: its step and value).")
    flags.DEFINE_enum("keep_best_mode", "min", list(MODES),
                      "min: lower --keep_best_metric is better (loss); max: higher is better "
                      "(accuracy).")


def define_export_dir_flag(what: str) -> None:
    """Defines --export_dir for a binary that exports `what` at the end of training."""
    flags.DEFINE_string("export_dir", None,
                        f"Where to export {what} as a SavedModel at the end of training. "
                        "Default: MODEL_DIR/export.")


def resolve_export_dir(loop) -> str:
    """--export_dir, or model_dir/export."""
    return flags.FLAGS.export_dir or os.path.join(loop.model_dir, "export")


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


def flag_actions() -> list[Action]:
    """The actions the shared flags ask for (early stopping, keeping the best checkpoint)."""
    values = flags.FLAGS
    actions: list[Action] = []
    if values.early_stopping_metric:
        actions.append(EarlyStopping(values.early_stopping_metric,
                                     mode=values.early_stopping_mode,
                                     patience=values.early_stopping_patience))
    if values.keep_best_metric:
        actions.append(KeepBest(values.keep_best_metric, mode=values.keep_best_mode))
    return actions


def loop_arguments(strategy, model_dir: str, *, actions: Sequence[Action] = ()) -> dict:
    """The `Loop` keyword arguments the shared flags set, with the binary's own `actions`."""
    values = flags.FLAGS
    return {"strategy": strategy, "model_dir": model_dir, "steps_per_loop": values.steps_per_loop,
            "eval_every": values.eval_every, "checkpoint_every": values.checkpoint_every,
            "seed": values.seed, "run_eagerly": values.run_eagerly,
            "on_nonfinite": values.on_nonfinite, "actions": [*flag_actions(), *actions]}


def run_binary(argv, build_loop: Callable, *, train_steps: Callable[[], int],
               summary: Callable | None = None) -> None:
    """The body of every binary's main: build the loop, train, say where outputs went.

    Args:
        argv: what absl left after parsing flags; anything there is an error.
        build_loop: () -> Loop from the flags; ValueError for a bad combination.
        train_steps: () -> the total steps to train to (read after building).
        summary: loop -> one line to print after training, or None.
    """
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}; every option is a --flag.")
    quiet_logging()
    if flags.FLAGS.strategy == "parameter_server":
        try:
            parameter_server.serve_unless_chief()  # a worker or ps task never returns
        except ValueError as error:
            raise app.UsageError(str(error)) from error
    # Until train watches for it, a SIGTERM has no completed step to save: exit at once.
    signal.signal(signal.SIGTERM, _exit_preempted)
    try:
        loop = build_loop()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    try:
        loop.train(train_steps())
    except (NonFiniteError, UnknownMetricError, OSError) as error:
        sys.exit(f"error: {error}")
    if summary is not None:
        loop.progress.line(summary(loop))
    report_outputs(loop)
    loop.close()
    if loop.preempted:
        # Not 0: a scheduler must tell a preempted run (rerun it) from a finished one.
        sys.exit(exit_codes.PREEMPTED)


def _exit_preempted(signum, frame) -> None:
    del signum, frame
    print("preempted (SIGTERM) before training started: nothing to save", file=sys.stderr)
    sys.exit(exit_codes.PREEMPTED)


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
