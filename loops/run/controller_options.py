"""The options of a run: its inner loops, evaluations, checkpoints, outputs and actions, checked."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loops.core import reporting
from loops.run.actions import Action, EarlyStopping, KeepBest
from loops.vocabulary.run_config_tree import ControllerSettings
from loops.vocabulary.whole_numbers import check_whole


@dataclass(frozen=True)
class ControllerOptions(ControllerSettings):
    """How a Trainer's Controller runs it: the `controller` section of the run's
    `loops.RunConfig` (each setting declared, with its default, help and check, in
    loops/vocabulary/settings.py, checked when made) and what the Trainer is handed beside
    it (progress, actions, config).

    Attributes:
        steps_per_loop: train steps per inner loop, the unit of reporting: a
            progress line, summaries and the metrics actions see, each over
            one inner loop. One `tf.function` call runs one inner loop, or
            several in a row where nothing but their reports comes between
            them (`loops.run.execution.loop_schedule`).
        eval_every: evaluate every this many steps (and at the end of
            `train`); None evaluates only at the end.
        checkpoint_every: save every this many steps (and at the end of
            `train`); None saves only at the end.
        model_dir: where checkpoints, summaries and results.json go; None
            keeps everything in memory.
        max_checkpoints: how many recent checkpoints to keep.
        async_checkpoints: write checkpoints in a background thread (one process only;
            `loops.model_dir.checkpoints.Checkpointer`).
        progress: where progress lines go; stdout if None.
        progress_every_seconds: end inner loops early enough (judged from the
            last one's speed) that a progress line comes at least this often;
            None leaves it to steps_per_loop. Only in one process (several
            workers must agree on every inner loop's length).
        profile_steps: (start, end): trace steps start..end (from 1, both
            included) with TensorFlow's profiler into
            model_dir/summaries/train (chief only; `loops.run.profiling`).
        actions: `loops.Action`s run between inner loops, after evaluations
            and at the ends of `train`; their state is saved with the
            checkpoints. Those the options below ask for come first.
        early_stopping_metric, early_stopping_mode, early_stopping_patience: a
            `loops.EarlyStopping` on that eval metric, when it is given.
        keep_best_metric, keep_best_mode: a `loops.KeepBest` by that eval metric
            (into model_dir/best), when it is given.
        config: the run's configuration (a binary's flag values, or a user's
            hyperparameters), JSON-serializable; written into results.json
            under "config".

    Raises (when made):
        ValueError: a bad option.
        TypeError: an action that is not a `loops.Action`.
    """

    progress: reporting.Progress | None = None
    actions: Sequence[Action] = ()
    config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()  # each setting checked by its declaration, as its flag is
        model_dir = self.model_dir
        if model_dir is not None and os.path.exists(model_dir) and not os.path.isdir(model_dir):
            raise ValueError(
                f"model_dir {model_dir!r} is a file, not a directory; pass a "
                "directory path (it is created if missing)."
            )
        asked = _asked_actions(self)
        object.__setattr__(self, "actions", _checked_actions((*asked, *self.actions)))


def _asked_actions(options: ControllerOptions) -> list[Action]:
    """The actions `options` asks for by setting: early stopping, keeping the best checkpoint."""
    asked: list[Action] = []
    if options.early_stopping_metric is not None:
        asked.append(
            EarlyStopping(
                options.early_stopping_metric,
                mode=options.early_stopping_mode,
                patience=options.early_stopping_patience,
            )
        )
    if options.keep_best_metric is not None:
        asked.append(KeepBest(options.keep_best_metric, mode=options.keep_best_mode))
    return asked


def _checked_actions(actions: Sequence[Action]) -> tuple[Action, ...]:
    actions = tuple(actions)
    for action in actions:
        if not isinstance(action, Action):
            raise TypeError(
                f"actions must be loops.Action objects, got {action!r}; subclass "
                "loops.Action and override its hooks."
            )
        if action.every is not None:
            check_whole(
                f"{type(action).__name__}.every", action.every, note=" (or None to turn it off)"
            )
    return actions
