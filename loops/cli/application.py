"""A loop binary's application runner: its `main` and console script (`entry_points`), the
checks before TensorFlow loads (cluster, resume, outputs and profile), the train, evaluator
and range-test modes, SIGTERM, and the exit codes.

The flags themselves (their definitions from the declarations, their values as Trainer
arguments) are `loops.cli.flags`'. Nothing here imports TensorFlow when loaded: a binary
answers --help or a bad flag before TensorFlow's seconds-long import.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from loops.cli import flags as loop_flags
from loops.cli import process_exit, startup_preemption, tensorflow_logs
from loops.cli.flags import (
    EVALUATE_CHECKPOINTS,
    EVALUATOR_TASK,
    FIND_LR,
    TRAIN,
    check_micro_batches,
    default_output_dir,
    evaluated_settings,
    flag_values,
    mode,
    parse_flags,
    strategy_name,
    tf_config_task_type,
)
from loops.cluster import cluster_config
from loops.model_dir import run_config, run_outputs
from loops.vocabulary import exit_codes, settings
from loops.vocabulary.whole_numbers import is_whole


def check_run_outputs() -> None:
    """Refuses, before TensorFlow loads, what stands where the run in --model_dir writes its
    results.json and config.json (a planted link, a directory: `run_outputs.check_run_files`)
    and an export the run would replace and did not write (`check_export_dir`).

    Raises:
        app.UsageError: naming the path and the fix.
    """
    model_dir = flags.FLAGS.model_dir
    if model_dir and os.path.isdir(model_dir):
        try:
            run_outputs.check_run_files(model_dir)
        except OSError as error:
            raise app.UsageError(str(error)) from error
    check_export_dir()


def check_export_dir() -> None:
    """Refuses, before any training, an --export_dir that the export would have to replace:
    a link, a directory that holds no SavedModel, or another run's export without
    --replace_export (`run_outputs.check_export_replaceable`).

    Raises:
        app.UsageError: naming the path and the fix.
    """
    path = flags.FLAGS.export_dir if "export_dir" in flags.FLAGS else None
    if not path:
        return  # MODEL_DIR/export: the run's own
    if os.path.islink(path):
        # The export is written beside it and renamed into its place, which a link is not.
        raise app.UsageError(
            f"--export_dir={path} is a link (to {os.readlink(path)}), which the export at the "
            "end of training cannot replace, so it would fail after the work; pass the "
            f"directory it points to (--export_dir={os.path.realpath(path)}) or a new one."
        )
    _check_writable(path, "--export_dir", "the export at the end of training")
    if not os.path.exists(path):
        return
    # A SavedModel directory holds saved_model.pb (or .pbtxt); checking the name
    # spares loading TensorFlow for it.
    if not any(
        os.path.isfile(os.path.join(path, name)) for name in ("saved_model.pb", "saved_model.pbtxt")
    ):
        raise app.UsageError(
            f"--export_dir={path} exists and holds no SavedModel, so the export at the end "
            "would have to replace it; pass a new directory (or an earlier export) as "
            "--export_dir, or move that one away."
        )
    try:
        run_outputs.check_export_replaceable(
            path, flags.FLAGS.model_dir or None, replace=flags.FLAGS.replace_export
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from error


def check_profile_steps_in_run() -> None:
    """Refuses --profile_steps that end past --train_steps (a trace never written or cut
    short), before TensorFlow loads.

    Raises:
        app.UsageError: naming both flags and the fix.
    """
    if "profile_steps" not in flags.FLAGS or not flags.FLAGS.profile_steps:
        return
    steps = settings.parse_profile_steps(flags.FLAGS.profile_steps)
    train_steps = flags.FLAGS.train_steps
    if steps is not None and train_steps is not None and steps[1] > train_steps:
        raise app.UsageError(
            f"--profile_steps={flags.FLAGS.profile_steps} ends past --train_steps="
            f"{train_steps}, so its trace would never be written in full; pass steps within "
            f"the run (END <= {train_steps}) or a larger --train_steps."
        )


def _check_writable(path: str, flag: str, writer: str) -> None:
    """Refuses `path` when its nearest existing directory cannot be written (a read-only file
    system, or no permission), before any work is done that `writer` would then lose.

    Raises:
        app.UsageError: naming the flag, the directory and the fix.
    """
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    directory = existing if os.path.isdir(existing) else os.path.dirname(existing)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise app.UsageError(
            f"{flag}={path} cannot be written ({directory} is read-only or not writable by "
            f"this user), so {writer} would fail after the work; pass a writable {flag}."
        )


def run(main: Callable[[list[str]], None], *, description: str) -> None:
    """`app.run(main)` with this module's flag parsing and --help.

    From here on SIGTERM is the preemption exit (`startup_preemption`): a binary's
    console script calls this first, so no moment of its start-up ends by the signal.
    A main that finished well ends the process at once (`process_exit`).
    """
    with startup_preemption.sigterm_handler():
        try:
            app.run(main, flags_parser=functools.partial(parse_flags, description=description))
        except SystemExit as ended:
            if ended.code not in (None, 0):
                raise
    process_exit.exit_finished()


def entry_points(
    build_trainer: Callable,
    *,
    description: str,
    summary: Callable | None = None,
    prepare: Callable[[], None] | None = None,
    explain_failure: Callable[[Any, Exception], str | None] | None = None,
) -> tuple[Callable[[list[str]], None], Callable[[], None]]:
    """A binary's `main` (what `app.run` calls, or a test) and `run` (its console script).

    Args:
        build_trainer: () -> the `loops.Trainer` the flags describe (`run_binary`).
        description: the first lines of its --help (its module docstring).
        summary: trainer -> one line to print after training, or None.
        prepare: called first in main, with the flags parsed: checks or fills in
            flags before the mode is acted on; a ValueError is a usage error.
        explain_failure: (trainer, a TensorFlow error training raised) -> the
            sentence to exit with, naming its cause and the fix, or None to
            let the error through (`run_binary`).
    """

    def main(argv: list[str]) -> None:
        if prepare is not None:
            try:
                prepare()
            except ValueError as error:
                raise app.UsageError(str(error)) from error
        run_binary(argv, build_trainer, summary=summary, explain_failure=explain_failure)

    def console_script() -> None:
        run(main, description=description)

    return main, console_script


def run_binary(
    argv: Sequence[str],
    build_trainer: Callable,
    *,
    summary: Callable | None = None,
    explain_failure: Callable[[Any, Exception], str | None] | None = None,
) -> None:
    """The body of every binary's main: build the trainer, train, say where outputs went.

    Args:
        argv: what absl left after parsing flags; anything there is an error.
        build_trainer: () -> the `loops.Trainer` the flags describe; ValueError for a bad
            combination.
        summary: trainer -> one line to print after training, or None.
        explain_failure: (trainer, a `tf.errors.OpError` training raised) -> the
            sentence to exit with (e.g. naming the data file that failed), or
            None to let the error through.
    """
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments {argv[1:]}; every option is a --flag.")
    if mode() == EVALUATE_CHECKPOINTS:
        _evaluate_checkpoints(build_trainer)
        return
    if mode() == FIND_LR:
        _find_learning_rate(build_trainer)
        return
    if tf_config_task_type() == EVALUATOR_TASK:
        raise app.UsageError(
            f"TF_CONFIG names this task '{EVALUATOR_TASK}', which evaluates the checkpoints "
            f"of the cluster's run; drop --mode={TRAIN} (an evaluator task runs "
            f"--mode={EVALUATE_CHECKPOINTS})."
        )
    check_cluster()
    check_resume_settings()
    check_run_outputs()
    check_profile_steps_in_run()
    # Against the whole batch now; against a replica's rows once the strategy exists.
    # (Unset, the batch is the loop's own: the RL loops', which take no micro-batches.)
    if flags.FLAGS.global_batch_size is not None:
        try:
            check_micro_batches(flags.FLAGS.grad_accum_steps, flags.FLAGS.global_batch_size, 1)
        except ValueError as error:
            raise app.UsageError(str(error)) from error
    # Until train watches for it, a SIGTERM has no completed step to save: exit at
    # once, TensorFlow's import included. The caller's handler comes back
    # afterwards (tests call main in-process).
    with startup_preemption.sigterm_handler():
        if strategy_name() in cluster_config.CLUSTER_STRATEGIES:
            from loops.cluster.startup_watchdog import sigterm_blocked

            # The threads TensorFlow starts at import never take a SIGTERM, which
            # keeps it from TensorFlow's own handler during the cluster's start-up.
            with sigterm_blocked():
                quiet_logging()
        else:
            quiet_logging()
        if flags.FLAGS.strategy == "parameter_server":
            _serve_unless_chief()
        _build_and_train(build_trainer, summary, explain_failure)


def _serve_unless_chief() -> None:
    """A parameter-server cluster's worker or ps task serves until killed; the chief returns."""
    from loops.cluster import parameter_server

    # A server waits in TensorFlow's C++ and never comes back to Python to run
    # a handler: SIGTERM ends it the default way.
    with startup_preemption.sigterm_handler(signal.SIG_DFL):
        try:
            parameter_server.serve_unless_chief()
        except ValueError as error:
            raise app.UsageError(str(error)) from error


def check_cluster() -> None:
    """Finds the cluster --strategy needs (--cluster) and says so; exits 1 with a sentence
    when it is missing or bad, or when a scheduler started several tasks of a one-process run.

    Runs before TensorFlow loads: a task refused for its cluster never starts it.
    """
    from loops.cluster import task_cluster

    try:
        found = task_cluster.adopt_cluster(
            strategy_name(),
            flags.FLAGS.cluster,
            port=flags.FLAGS.cluster_port,
            num_ps=flags.FLAGS.cluster_num_ps,
        )
        if strategy_name() in cluster_config.CLUSTER_STRATEGIES:
            cluster_config.check_cluster(strategy_name())
    except ValueError as error:
        sys.exit(f"error: {error}")
    if found is not None:
        print(found.line(), file=sys.stderr, flush=True)


def check_resume_settings() -> None:
    """Exits 1 before TensorFlow loads when the flags change a setting of the run in
    --model_dir that a resume cannot change and stay exact (`run_config.check_resume`)."""
    model_dir = flags.FLAGS.model_dir
    checkpoints = os.path.join(model_dir or "", "checkpoints")
    if not model_dir or not os.path.isdir(checkpoints):
        return
    if not any(name.endswith(".index") for name in os.listdir(checkpoints)):
        return  # nothing to resume
    try:
        run_config.check_resume(model_dir, flag_values())
    except ValueError as error:
        sys.exit(f"error: {error}")


def _check_resume_against_the_checkpoint() -> None:
    """`check_resume_settings` again, with the newest checkpoint's own record of the settings
    (a config.json gone, damaged or holding a string says nothing): refused before the
    trainer builds its model and input (its restore checks again what it restores).

    Raises:
        ValueError: the sentence of `run_config.check_resume`.
    """
    model_dir = flags.FLAGS.model_dir
    if not model_dir:
        return
    from loops.run.checkpoint_keeper import recorded_settings

    record = recorded_settings(model_dir)
    if record:
        run_config.check_resume(model_dir, flag_values(), checkpoint_record=record)


def _build_and_train(
    build_trainer: Callable,
    summary: Callable | None,
    explain_failure: Callable[[Any, Exception], str | None] | None,
) -> None:
    import tensorflow as tf

    from loops.run.actions import UnknownMetricError
    from loops.vocabulary.errors import ClusterTaskLostError, LossSpikeError, NonFiniteError

    errors_to_report = (NonFiniteError, LossSpikeError, UnknownMetricError, ClusterTaskLostError)

    try:
        _check_resume_against_the_checkpoint()
        trainer = build_trainer()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    reported: tuple[type[Exception], ...] = (*errors_to_report, OSError)
    try:
        trainer.train(flags.FLAGS.train_steps)
    except reported as error:
        sys.exit(f"error: {error}")
    except tf.errors.OpError as error:
        explained = None if explain_failure is None else explain_failure(trainer, error)
        if explained is None:
            raise
        sys.exit(f"error: {explained}")
    finally:
        with startup_preemption.sigterm_handler(startup_preemption.note_after_training):
            trainer.close()
    with startup_preemption.sigterm_handler(startup_preemption.note_after_training):
        if summary is not None:
            trainer.run_context.progress.line(summary(trainer))
        report_outputs(trainer)
    if trainer.state.preempted:
        # Not 0: a scheduler must tell a preempted run (rerun it) from a finished one.
        sys.exit(exit_codes.PREEMPTED)


def _evaluate_checkpoints(build_trainer: Callable) -> None:
    """--mode=evaluate_checkpoints: the Trainer built on this host evaluates the run's checkpoints.

    Exits 1 with the reason when evaluation fails or times out, and 42
    (preempted) on SIGTERM: the history so far is on disk, and the same
    command goes on after it.
    """
    model_dir = flags.FLAGS.model_dir
    if not model_dir:
        raise app.UsageError(
            f"--mode={EVALUATE_CHECKPOINTS} evaluates the checkpoints of the run in "
            "--model_dir; pass the trainer's --model_dir."
        )
    with startup_preemption.sigterm_handler(_exit_evaluator):
        _take_run_settings(model_dir)
        quiet_logging()
        from loops.run.sidecar import evaluate_checkpoints

        try:
            trainer = build_trainer()
        except ValueError as error:
            raise app.UsageError(str(error)) from error
        try:
            evaluate_checkpoints(
                trainer,
                model_dir,
                train_steps=_evaluated_train_steps(model_dir),
                timeout_seconds=flags.FLAGS.evaluator_timeout or None,
                compared_config=evaluated_settings(),
            )
        except (ValueError, OSError) as error:  # TimeoutError is an OSError
            sys.exit(f"error: {error}")


def _evaluated_train_steps(model_dir: str) -> int | None:
    """The step the evaluator watches up to: --train_steps when given, else the run's own
    (config.json, written as the trainer starts), else None (results.json says when it ended).

    The flag's default is not the run's: a run trained to another --train_steps would be
    waited for until --evaluator_timeout.
    """
    if flags.FLAGS["train_steps"].present:
        return flags.FLAGS.train_steps
    recorded = (run_config.read_if_intact(model_dir) or {}).get("train_steps")
    if is_whole(recorded, 1):
        return recorded
    return None


def _find_learning_rate(build_trainer: Callable) -> None:
    """--mode=find_lr: the range test on the Trainer the flags describe, from the newest
    checkpoint in --model_dir when it holds one (read only); its files in --find_lr_dir.

    Exits 1 with the reason when the test cannot run.
    """
    values = flags.FLAGS
    model_dir = values.model_dir
    try:
        output_dir = values.find_lr_dir or default_output_dir("lr_find")
    except ValueError as error:  # before TensorFlow loads
        raise app.UsageError(str(error)) from error
    quiet_logging()
    from loops.model_dir import checkpoints
    from loops.run.lr_finder import check_outside_run, find_learning_rate

    try:
        if model_dir:
            check_outside_run(output_dir, model_dir)
        trainer = build_trainer()
    except ValueError as error:
        raise app.UsageError(str(error)) from error
    has_checkpoint = bool(model_dir) and checkpoints.newest_complete(
        os.path.join(model_dir, "checkpoints")
    )
    try:
        find_learning_rate(
            trainer,
            min_rate=values.find_lr_min_rate,
            max_rate=values.find_lr_max_rate,
            steps=values.find_lr_steps,
            stop_factor=values.find_lr_stop_factor,
            loss=values.find_lr_loss or None,
            output_dir=output_dir,
            from_checkpoint=model_dir if has_checkpoint else None,
        )
    except (ValueError, OSError) as error:
        sys.exit(f"error: {error}")
    finally:
        trainer.close()


def _take_run_settings(model_dir: str) -> None:
    """Sets each `evaluated_settings` flag left unset to the run's value; refuses a given one.

    The run's values are those its trainer recorded in MODEL_DIR/config.json
    (waited for up to --evaluator_timeout when the trainer starts at the
    same time). Prints the settings it takes.

    Raises:
        app.UsageError: a flag given on the command line has another value
            than the run's.
    """
    try:
        recorded = run_config.wait_for(
            model_dir, timeout_seconds=flags.FLAGS.evaluator_timeout or None
        )
    except (ValueError, OSError) as error:  # TimeoutError is an OSError
        sys.exit(f"error: {error}")
    if recorded is None:
        return  # a run that records none: evaluate_checkpoints says so
    found = run_config.differences(flag_values(), recorded, evaluated_settings())
    given = [item for item in found if flags.FLAGS[item.name].present]
    path = run_config.config_path(model_dir)
    if given:
        names = " ".join(f"--{item.name}" for item in given)
        values = " ".join(run_config.setting(item.name, item.run, as_flag=True) for item in given)
        raise app.UsageError(
            f"--mode={EVALUATE_CHECKPOINTS} would not evaluate what the run in {model_dir} "
            f"trained ({path}): {run_config.describe(given, as_flags=True)}. Drop {names} "
            f"to take the run's {'value' if len(given) == 1 else 'values'}, or pass the "
            f"run's: {values}."
        )
    loop_flags.set_values({item.name: item.run for item in found})
    if found:
        taken = ", ".join(run_config.setting(item.name, item.run, as_flag=True) for item in found)
        print(f"evaluator: took the run's settings from {path}: {taken}", flush=True)


def _exit_evaluator(signum, frame) -> None:
    del frame
    print(
        f"evaluator stopped ({signal.Signals(signum).name}); its history is on disk: the same "
        "command goes on after the last checkpoint it handled",
        file=sys.stderr,
    )
    sys.exit(exit_codes.PREEMPTED)


def quiet_logging() -> None:
    """Keeps TensorFlow's and TFDS's log lines out of the progress lines, and loads TensorFlow.

    An explicit --verbosity (or -v), or the user's own TF_CPP_MIN_LOG_LEVEL,
    brings TensorFlow's lines back.
    """
    from absl import logging

    verbose = flags.FLAGS["verbosity"].present
    if not verbose:
        logging.set_verbosity(logging.WARNING)
    tensorflow_logs.import_tensorflow(
        quiet=not verbose and "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    )
    if not verbose:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
        tensorflow_logs.one_line_worker_losses(tf.get_logger())


def report_outputs(trainer) -> None:
    """Tells the user where the run's outputs went."""
    if not trainer.run_context.is_chief:
        return
    directory = trainer.run_context.model_dir
    trainer.run_context.progress.line(
        f"outputs in {directory}\n"
        f"  results:     {os.path.join(directory, 'results.json')}\n"
        f"  checkpoints: {os.path.join(directory, 'checkpoints')} (rerun with "
        f"--model_dir={directory} and a larger --train_steps to continue)\n"
        f"  summaries:   tensorboard --logdir {os.path.join(directory, 'summaries')}"
    )
