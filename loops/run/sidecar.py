"""Evaluates each checkpoint of a run's model_dir once, as it appears, in its own process.

The evaluator is meant for a process of its own beside training (`--mode=evaluate_checkpoints`,
`loops-launch --evaluator`). It reads the run's files and writes only `MODEL_DIR/evaluator`
(TensorBoard, `history.json`, so a restarted evaluator goes on after the last checkpoint it
handled); it never takes the run's lock. Each checkpoint the state file lists is restored
into the evaluator's Trainer in step order and evaluated with `trainer.evaluate()`; one the
run rotates away before it is read is recorded as skipped. The run is over once the
checkpoint of `train_steps` is handled, or once results.json says the run ended and every
checkpoint up to its step is handled.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from loops.core import reporting
from loops.model_dir import checkpoints, model_dir_lock, run_config
from loops.run.trainer import Trainer
from loops.vocabulary.whole_numbers import check_whole, is_whole

HISTORY_FILE = "history.json"  # in MODEL_DIR/evaluator, next to the evaluator's summaries
DEFAULT_POLL_SECONDS = 1.0
# Long enough for a slow step between two checkpoints; a dead trainer ends the wait.
DEFAULT_TIMEOUT_SECONDS = 3600.0


def evaluator_directory(model_dir: str) -> str:
    """Where the evaluator of the run in `model_dir` writes: its history and summaries."""
    return os.path.join(model_dir, reporting.EVALUATOR_DIRECTORY)


def evaluate_checkpoints(
    trainer: Trainer,
    model_dir: str,
    *,
    train_steps: int | None = None,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    timeout_seconds: float | None = DEFAULT_TIMEOUT_SECONDS,
    compared_config: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Evaluates every checkpoint the run in `model_dir` keeps, once each, until its last one.

    First the settings are checked against the run's config.json (whether there is an
    average, `mixed_precision`, `seed`, and the `config` entries `compared_config` names):
    one that differs raises ValueError naming it. Example (the run's own definition):

        trainer = loops.Trainer(loops.ClassifierLoop(model_fn=..., optimizer_fn=...), eval_data=...)
        loops.evaluate_checkpoints(trainer, "/tmp/run1", train_steps=600)

    Args:
        trainer: a Trainer made with `model_dir=None` on this process's own strategy, whose
            `checkpoint_items` match the run's and that evaluates (`eval_data`, or its own
            `run_evaluation`).
        model_dir: the run's directory.
        train_steps: the step the run trains to (its `--train_steps`); None: the evaluator
            stops when results.json says the run ended (then a results.json left by an
            earlier run of a resumed directory could stop it early).
        poll_seconds: how often to look for a new checkpoint.
        timeout_seconds: give up when no new checkpoint comes for this long and the run has
            not ended; None waits for ever.
        compared_config: keys of the run's `config` that change the evaluated numbers (the
            model's or the eval data's settings); each must have the value the run recorded.

    Returns:
        The history, one entry per checkpoint handled (also by earlier evaluators), in step order:
        "step", "checkpoint", "written", "time", and "metrics" or "skipped" (why not evaluated).

    Raises:
        ValueError: a bad argument, a trainer with a model_dir or nothing to evaluate, a
            setting that differs from the run's (see above), an unreadable config.json, a
            checkpoint that does not match the definition, or another live evaluator of
            `model_dir`.
        TimeoutError: no new checkpoint for `timeout_seconds` before the run ended.
    """
    _check_arguments(trainer, train_steps, poll_seconds, timeout_seconds, compared_config)
    directory = evaluator_directory(model_dir)
    try:
        lock = model_dir_lock.acquire(directory)  # against a second evaluator, not the trainer
    except ValueError as error:
        raise ValueError(f"The evaluator of {model_dir} cannot start: {error}") from error
    sightings = _Sightings(os.path.join(model_dir, "checkpoints"), poll_seconds)
    try:
        reporting.remove_unfinished_writes(directory)
        watch = _Watch(trainer, model_dir, train_steps=train_steps, compared_config=compared_config)
        sightings.start()
        watch.run(sightings, poll_seconds, timeout_seconds)
        return watch.history
    finally:
        sightings.stop()
        model_dir_lock.release(lock)


class _Sightings(threading.Thread):
    """Lists the run's checkpoints every `poll_seconds`, also while an evaluation runs.

    So a checkpoint the trainer writes and rotates away during a long
    evaluation is still seen (and then noted as deleted) rather than missed.
    """

    def __init__(self, directory: str, poll_seconds: float):
        super().__init__(name="loops-evaluator-listing", daemon=True)
        self.directory = directory
        self.poll_seconds = poll_seconds
        self._seen: dict[int, str] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.poll_seconds):
            self.look()

    def look(self) -> list[tuple[int, str]]:
        """Lists now; returns (step, prefix) of each checkpoint seen listed so far, oldest first."""
        listed = checkpoints.listed_checkpoints(self.directory)
        with self._lock:
            self._seen.update(listed)
            return sorted(self._seen.items())

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join()


class _Watch:
    """The evaluator's state: the trainer, the run's files, and the history so far."""

    def __init__(
        self,
        trainer: Trainer,
        model_dir: str,
        *,
        train_steps: int | None,
        compared_config: Sequence[str],
    ):
        self.trainer = trainer
        self.model_dir = model_dir
        self.train_steps = train_steps
        self.checkpoint_directory = os.path.join(model_dir, "checkpoints")
        self.history_path = os.path.join(evaluator_directory(model_dir), HISTORY_FILE)
        self.history = _read_history(self.history_path)
        # Everything the trainer saves: its items, the global step and any weight averages
        # (which its evaluation swaps in), so it evaluates what the trainer would.
        self.items = trainer.saved_items()
        # The loop's own evaluation summaries (scalars, a GAN's sample grid, a
        # language model's samples) go to the evaluator's directory.
        trainer.controller.report_to(reporting.Summaries(evaluator_directory(model_dir)))
        self.settings = {
            **run_config.loop_settings(trainer.step_options),
            **{key: trainer.run_context.config[key] for key in compared_config},
        }
        self._settings_checked = False

    @property
    def last_step(self) -> int:
        return max((entry["step"] for entry in self.history), default=-1)

    def say(self, text: str) -> None:
        self.trainer.run_context.progress.line(f"evaluator: {text}")

    def run(
        self, sightings: _Sightings, poll_seconds: float, timeout_seconds: float | None
    ) -> None:
        until = f" up to step {self.train_steps}" if self.train_steps is not None else ""
        earlier = (
            f"; {len(self.history)} handled before, up to step {self.last_step}"
            if self.history
            else ""
        )
        self._check_settings(before_restore=False)
        self.say(f"watching {self.checkpoint_directory}{until}{earlier}")
        handled_now = 0
        waiting_since = time.monotonic()
        while True:
            # Read before the listing: the final checkpoint is listed before results.json says
            # the run ended, so this listing holds it.
            ended_at = self._run_end()
            listed = sightings.look()
            new = [(step, prefix) for step, prefix in listed if step > self.last_step]
            for step, prefix in new:
                self._handle(step, prefix)
                handled_now += 1
            if new:
                waiting_since = time.monotonic()
                continue  # more may have come meanwhile
            final_step = self._final_step(ended_at, listed)
            if final_step is not None:
                self.say(
                    f"the run ended at step {final_step}; handled {handled_now} checkpoint(s) "
                    f"now, {len(self.history)} in all ({self.history_path})"
                )
                return
            waited = time.monotonic() - waiting_since
            if timeout_seconds is not None and waited >= timeout_seconds:
                raise TimeoutError(self._timeout_message(timeout_seconds))
            time.sleep(poll_seconds)

    def _handle(self, step: int, prefix: str) -> None:
        """Restores and evaluates one listed checkpoint, or notes why not; records it."""
        entry: dict[str, Any] = {"step": step, "checkpoint": prefix}
        try:
            entry["written"] = os.path.getmtime(prefix + ".index")
        except OSError:
            pass  # deleted already: noted below
        self._check_settings(before_restore=True)
        problem = checkpoints.missing_files(prefix)
        try:
            problem = problem or checkpoints.restore_checkpoint(prefix, self.items)
        except ValueError as error:
            raise ValueError(
                f"{error} The evaluator's Trainer must be made like the run's (the same "
                "model and settings; a binary: the same flags as the trainer)."
            ) from error
        if problem is None:
            entry["metrics"] = reporting.scalar_metrics(self.trainer.evaluate())
        else:
            # Listed means complete (checkpoints.listed_checkpoints): files gone since were deleted.
            deleted = checkpoints.missing_files(prefix) is not None
            entry["skipped"] = (
                "deleted before it was read (the trainer keeps only its newest checkpoints, "
                "max_checkpoints)"
                if deleted
                else f"damaged: {problem}"
            )
            self.say(f"skipped {os.path.basename(prefix)}: {entry['skipped']}")
        entry["time"] = time.time()
        self.history.append(entry)
        reporting.write_json_atomic(
            self.history_path, {"model_dir": self.model_dir, "evaluations": self.history}
        )

    def _check_settings(self, *, before_restore: bool) -> None:
        """Refuses settings that would evaluate other numbers than the run's; checks once.

        Before the first restore a missing config.json is a run that records
        none; earlier it may be a trainer that has not written it yet.
        """
        if self._settings_checked:
            return
        recorded = run_config.read(self.model_dir)
        if recorded is None:
            if not before_restore:
                return
            self.say(
                f"{run_config.config_path(self.model_dir)} is missing though the run has "
                "checkpoints (a run of a loops version that did not record it): this loop's "
                "settings are not checked against the run's"
            )
        else:
            found = run_config.differences(self.settings, recorded, self.settings)
            if found:
                fixes = ", ".join(
                    run_config.setting(item.name, item.run, as_flag=False) for item in found
                )
                raise ValueError(
                    f"The evaluator's {type(self.trainer.definition).__name__} would not "
                    "evaluate what the "
                    f"run in {self.model_dir} trained: "
                    f"{run_config.describe(found, as_flags=False)}. Build it with the run's "
                    f"values ({fixes}), which {run_config.config_path(self.model_dir)} records."
                )
        self._settings_checked = True

    def _run_end(self) -> int | None:
        """The step results.json says the run ended at; None while it runs (or was preempted)."""
        try:
            with open(os.path.join(self.model_dir, "results.json")) as stream:
                results = json.load(stream)
        except (OSError, ValueError):
            return None
        if not isinstance(results, dict) or results.get("preempted") is not False:
            return None
        step = results.get("global_step")
        if not is_whole(step):
            return None
        if (
            self.train_steps is not None
            and step < self.train_steps
            and not results.get("stop_reason")
        ):
            return None  # an earlier, shorter run's: this one trains on to train_steps
        return step

    def _final_step(self, ended_at: int | None, listed: list[tuple[int, str]]) -> int | None:
        """The run's last step once it has ended and its checkpoints are handled, else None."""
        if self.train_steps is not None and self.last_step >= self.train_steps:
            return self.last_step
        # A checkpoint beyond the step results.json names: that results.json is an earlier run's.
        if ended_at is not None and all(step <= ended_at for step, _ in listed):
            return ended_at
        return None

    def _timeout_message(self, timeout_seconds: float) -> str:
        newest = (
            f"the newest it handled is step {self.last_step}"
            if self.history
            else "it has found none yet"
        )
        return (
            f"No new checkpoint in {self.checkpoint_directory} for {timeout_seconds:g} s, and "
            f"the run has not ended ({newest}; results.json does not say it ended). Is the "
            f"trainer still running? The history is in {self.history_path}: run the "
            "evaluator again to go on from there, with a longer timeout "
            "(--evaluator_timeout) if checkpoints come less often."
        )


def _read_history(path: str) -> list[dict[str, Any]]:
    """The entries an earlier evaluator of the run recorded, in step order; [] when none."""
    try:
        with open(path) as stream:
            entries = json.load(stream).get("evaluations", [])
    except (OSError, ValueError, AttributeError):
        return []
    return sorted(
        (entry for entry in entries if isinstance(entry, dict) and is_whole(entry.get("step"))),
        key=lambda entry: entry["step"],
    )


def _check_arguments(
    trainer: Trainer,
    train_steps: int | None,
    poll_seconds: float,
    timeout_seconds: float | None,
    compared_config: Sequence[str],
) -> None:
    own_model_dir = trainer.run_context.model_dir
    if own_model_dir is not None:
        raise ValueError(
            f"evaluate_checkpoints needs a Trainer made with model_dir=None, got "
            f"model_dir={own_model_dir!r}: a Trainer with a model_dir takes that directory's "
            "lock and restores its newest checkpoint. Make the evaluator's Trainer without "
            "one; it writes into MODEL_DIR/evaluator."
        )
    if trainer.eval_data is None and trainer.definition.evaluates_eval_data_only():
        raise ValueError(
            f"{type(trainer.definition).__name__} has nothing to evaluate: it has no eval_data and "
            "does not override run_evaluation. Build it with eval_data= (or give it a "
            "run_evaluation) to evaluate checkpoints."
        )
    if train_steps is not None:
        check_whole("train_steps", train_steps, note=" (the run's --train_steps) or None")
    if not (isinstance(poll_seconds, (int, float)) and 0 < poll_seconds < math.inf):
        raise ValueError(f"poll_seconds must be a number of seconds > 0, got {poll_seconds!r}.")
    if timeout_seconds is not None and not (
        isinstance(timeout_seconds, (int, float)) and timeout_seconds > 0
    ):
        raise ValueError(
            f"timeout_seconds must be a number of seconds > 0 (or None: wait for ever), got "
            f"{timeout_seconds!r}."
        )
    config = trainer.run_context.config
    unknown = [key for key in compared_config if key not in config]
    if isinstance(compared_config, str) or unknown:
        raise ValueError(
            f"compared_config must name keys of the run's config, got {compared_config!r}"
            f" (the run's config holds {sorted(config)}); make the Trainer with record= "
            "holding each setting to compare, or leave it out."
        )
