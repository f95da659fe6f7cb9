"""The settings a run records in MODEL_DIR/config.json: the warning when a resume changes
them, and which of them an evaluator must share.

Nothing here imports TensorFlow at load: a binary's evaluator reads and checks
the run's settings before TensorFlow's import and before it builds anything.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from loops.vocabulary import settings
from loops.vocabulary.recorded_settings import RecordedSettingsError, read_recorded_settings
from loops.vocabulary.whole_numbers import is_whole

CONFIG_FILE = "config.json"  # in MODEL_DIR; written by the trainer's chief as the run starts
# The step options that change every evaluation, whatever the kind of training:
# ema_decay whether the averaged or the raw weights are evaluated, mixed_precision the
# dtype it computes in, seed the noise of the loops that draw some to evaluate (a GAN's
# samples, RL's episodes, a language model's samples).
EVALUATION_SETTINGS = ("ema_decay", "mixed_precision", "seed")

# Settings a resume cannot change and stay exact, each with the setting that accepts
# the change anyway (then recorded in results.json's config as CHANGED_ON_RESUME).
EXACT_ONLY_UNCHANGED = {"global_batch_size": "allow_batch_size_change"}
CHANGED_ON_RESUME = "changed_on_resume"
# What a binary records that its run trained on (the recommender: its model kind, interaction
# log and split, `loops.input.log_identity`): a resume that changes it is refused whatever
# the flags say, and the checkpoint keeps it beside the exact-only settings.
RESUME_IDENTITY = "resume_identity"


# Config keys a resumed run may change without a warning: the declarations marked
# `resumable` (how long it trains, how often it evaluates and saves, where its outputs go,
# the topology, the evaluator's and the range test's settings), --export_dir and absl's
# --verbosity (`Loop.config_free_to_change`).
CONFIG_FREE_TO_CHANGE = settings.free_to_change()


def exact_only_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The `EXACT_ONLY_UNCHANGED` settings and the `RESUME_IDENTITY` `config` gives: what the
    checkpoint records beside config.json, so that a deleted or damaged config.json cannot
    let one change silently."""
    names = (*EXACT_ONLY_UNCHANGED, RESUME_IDENTITY)
    return {name: config[name] for name in names if config.get(name) is not None}


def check_resume(
    model_dir: str,
    config: Mapping[str, Any],
    step: int | None = None,
    *,
    checkpoint_record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Refuses a resume of the run in `model_dir` that changes an `EXACT_ONLY_UNCHANGED`
    setting, unless `config` accepts the change, or its `RESUME_IDENTITY` (always); returns
    the accepted changes.

    The values compared against are the checkpoint's own record (`checkpoint_record`, when
    the checkpoint holds one), else config.json's where it reads as a whole number (the
    identity: as a JSON object); a config.json that does not read is left to
    `record_config`, which rewrites it. Every task of a cluster reads the same files, so
    all refuse together.

    Returns:
        {CHANGED_ON_RESUME: {name: {"was", "now", "at_step"}}} for the accepted
        changes, or {} when there are none.

    Raises:
        ValueError: a sentence naming the setting, both values and the ways on.
    """
    recorded = {
        **_compared_from_config_json(read_if_intact(model_dir)),
        **(checkpoint_record or {}),
    }
    _check_identity(model_dir, recorded.get(RESUME_IDENTITY), config.get(RESUME_IDENTITY))
    changes = {}
    for name, allowing in EXACT_ONLY_UNCHANGED.items():
        was, now = recorded.get(name), config.get(name)
        if was is None or now is None or was == now:
            continue
        if not config.get(allowing):
            raise ValueError(
                f"--{name}={now} differs from {was}, the {name} of the run in {model_dir}: "
                f"a resume continues exactly only with the same {name} (the workers and "
                f"replicas may change). Pass --{name}={was}, or --{allowing} to go on with "
                f"{now} (recorded in results.json), or a new --model_dir."
            )
        changes[name] = {"was": was, "now": now, "at_step": step}
    return {CHANGED_ON_RESUME: changes} if changes else {}


def refuse_other_training_data(
    model_dir: str | None,
    identity: Mapping[str, Any],
    *,
    checkpoint_record: Callable[[str], Mapping[str, Any] | None] | None = None,
) -> None:
    """Refuses to go on from (or evaluate) the checkpoints in `model_dir` when they were
    trained on another model, log, table, spec or split than `identity` (this run's
    `RESUME_IDENTITY`, `loops.input.log_identity`): ValueError naming each change and the fix
    (`check_resume`). Nothing is refused without a model_dir or a checkpoint in it.

    Without `checkpoint_record` (before TensorFlow starts), against config.json where a
    checkpoint's index file is there. With it (model_dir -> the newest checkpoint's own
    record, e.g. `loops.run.checkpoint_keeper.recorded_settings`), where a complete
    checkpoint is there: against its record, else config.json (a config.json gone or damaged
    says nothing then).

    Raises:
        ValueError: the sentence of `log_identity.refusal`.
    """
    checkpoints = os.path.join(model_dir or "", "checkpoints")
    if not model_dir or not os.path.isdir(checkpoints):
        return
    if not any(name.endswith(".index") for name in os.listdir(checkpoints)):
        return  # nothing to go on from
    record = None
    if checkpoint_record is not None:
        from loops.model_dir.checkpoints import newest_complete  # imports TensorFlow

        if newest_complete(checkpoints) is None:
            return  # nothing to go on from
        record = checkpoint_record(model_dir)
    check_resume(model_dir, {RESUME_IDENTITY: identity}, checkpoint_record=record)


def _check_identity(model_dir: str, was: Any, now: Any) -> None:
    """Raises ValueError naming each part of the run's `RESUME_IDENTITY` that `now` changes;
    nothing when either is unrecorded."""
    if not isinstance(was, Mapping) or not isinstance(now, Mapping):
        return
    # Here, not at the top: a binary's flags import this module before its cluster starts,
    # and log_identity brings NumPy, whose BLAS threads, started then, would take a SIGTERM
    # meant for the start-up watchdog (loops.cluster.startup_watchdog).
    from loops.input import log_identity

    found = log_identity.changes(was, now)
    if found:
        raise ValueError(log_identity.refusal(model_dir, found, now))


def _compared_from_config_json(recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """The exact-only settings of a config.json that are whole numbers, and its resume
    identity where it is a JSON object; a value of another type (the string "32" written by
    hand) says nothing the checkpoint's record cannot."""
    return {
        name: value
        for name, value in (recorded or {}).items()
        if (name in EXACT_ONLY_UNCHANGED and is_whole(value))
        or (name == RESUME_IDENTITY and isinstance(value, dict))
    }


def read_if_intact(model_dir: str) -> dict[str, Any] | None:
    """config.json's settings for the trainer: None when it is missing, unreadable or not a
    JSON object (the trainer rewrites it; `read` is the evaluator's, which refuses those)."""
    try:
        return read(model_dir)
    except ValueError:
        return None


class Difference(NamedTuple):
    """One setting that changes the evaluated numbers: its value here and in the run."""

    name: str
    here: Any
    run: Any


def loop_settings(step_options: Any) -> dict[str, Any]:
    """The run's `EVALUATION_SETTINGS` among its step options (a checked `StepOptions`), which
    config.json records also when the run gives no config.

    The run's own config (a binary's flags) records them too and has the last word.
    """
    return {name: getattr(step_options, name) for name in EVALUATION_SETTINGS}


def config_path(model_dir: str) -> str:
    return os.path.join(model_dir, CONFIG_FILE)


def read(model_dir: str) -> dict[str, Any] | None:
    """The settings the run in `model_dir` recorded; None while it has recorded none.

    Raises:
        ValueError: config.json is there but is not a JSON object.
    """
    path = config_path(model_dir)
    try:
        return read_recorded_settings(path)
    except RecordedSettingsError as error:
        if isinstance(error.cause, FileNotFoundError):
            return None
        if error.unreadable:
            raise ValueError(
                f"Cannot read {path}, the settings of the run the evaluator checks its own "
                f"against: {error.cause}. Make it readable by this user."
            ) from error.cause
        raise ValueError(
            f"{path} holds no JSON object of settings ({error.detail}), so the evaluator "
            "cannot check that it evaluates what the run trained. The trainer rewrites it "
            "when it starts: rerun the trainer with this --model_dir, or delete the file to "
            "evaluate without the check."
        ) from None


def wait_for(
    model_dir: str, *, timeout_seconds: float | None, poll_seconds: float = 1.0
) -> dict[str, Any] | None:
    """The run's recorded settings, waiting for a trainer started at the same time to write them.

    The trainer writes config.json before its first checkpoint, so a run
    with checkpoints and no config.json is one of a loops version that did
    not record it: None then.

    Raises:
        ValueError: config.json is not a JSON object.
        TimeoutError: neither config.json nor a checkpoint came in `timeout_seconds`.
    """
    state_file = os.path.join(model_dir, "checkpoints", "checkpoint")
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    while True:
        recorded = read(model_dir)
        if recorded is not None or os.path.exists(state_file):
            return recorded
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"No {config_path(model_dir)} and no checkpoint after {timeout_seconds:g} s: "
                "the run has not started (its trainer writes config.json as it starts). Start "
                f"the trainer with --model_dir={model_dir}, or give it longer with "
                "--evaluator_timeout."
            )
        time.sleep(poll_seconds)


def differences(
    here: Mapping[str, Any], run: Mapping[str, Any], names: Iterable[str]
) -> list[Difference]:
    """Each of `names` the run recorded whose value `here` would give other evaluated numbers.

    A name the run did not record (a setting newer than the run) is not compared.
    """
    return [
        Difference(name, here.get(name), run[name])
        for name in names
        if name in run and not _same_numbers(name, here.get(name), run[name])
    ]


def _same_numbers(name: str, here: Any, run: Any) -> bool:
    if name == "ema_decay":
        # Only whether there is an average counts: its decay shaped the averages the
        # checkpoint holds, and an evaluation swaps those in, whatever decay it is given.
        return bool(here) == bool(run)
    return here == run


def describe(found: Iterable[Difference], *, as_flags: bool) -> str:
    """Each difference as "X here and Y in the run", joined by "; ", as flags or as arguments."""
    return "; ".join(
        f"{setting(item.name, item.here, as_flag=as_flags)} here and "
        f"{setting(item.name, item.run, as_flag=as_flags)} in the run{_consequence(item)}"
        for item in found
    )


def setting(name: str, value: Any, *, as_flag: bool) -> str:
    """`--name=value` (a flag) or `name=value` (a Python argument)."""
    if not as_flag:
        return f"{name}={value!r}"
    if value is None:
        return f"--{name} unset"
    if isinstance(value, (list, tuple)):
        value = ",".join(str(part) for part in value)
    return f"--{name}={value}"


def _consequence(item: Difference) -> str:
    if item.name != "ema_decay":
        return ""
    if item.run:
        return " (the raw weights would be evaluated, not the run's moving average)"
    return " (the run kept no moving average to evaluate)"


def record_config(
    model_dir: str,
    config: Mapping[str, Any],
    checkpoint_items: Mapping[str, Any],
    *,
    resuming: bool,
    free_to_change: frozenset[str],
    say: Callable[[str], None],
) -> None:
    """Warns about settings that differ from the run that wrote model_dir; records these.

    The settings are the run's config and the type of each checkpointed item.
    """
    current = {
        **config,
        **{f"checkpoint.{name}": type(item).__name__ for name, item in checkpoint_items.items()},
    }
    from loops.core import (
        reporting,
    )  # here: it imports TensorFlow, which flag parsing must not

    path = config_path(model_dir)
    if resuming and os.path.exists(path):
        previous = read_if_intact(model_dir)
        if previous is None:
            say(
                f"warning: {path} did not read as the run's settings (a JSON object); the "
                "checkpoint is restored (its own record holds what a resume must not "
                "change) and config.json is rewritten with this run's settings."
            )
            previous = current
        # The resume identity was compared whole before the restore (`check_resume`).
        changed = sorted(
            key
            for key in set(previous) | set(current)
            if key not in free_to_change
            and key != RESUME_IDENTITY
            and previous.get(key) != current.get(key)
        )
        for key in changed:
            say(
                f"warning: {key} was {previous.get(key)!r} in the run that wrote "
                f"{model_dir} and is {current.get(key)!r} now; the checkpoint is "
                "restored and training goes on with the new value. If that is not what "
                "you meant, stop and rerun with the old value or a new --model_dir."
            )
    reporting.write_json_atomic(path, current)
