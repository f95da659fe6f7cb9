"""A run's checkpoints in model_dir: the directory's lock, the restore, each save, the way back."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from loops.core import reporting
from loops.model_dir import model_dir_lock, run_outputs
from loops.model_dir.checkpoints import Checkpointer, newest_complete
from loops.model_dir.run_config import check_resume, exact_only_settings, record_config
from loops.placement import Placement

SETTINGS_RECORD = "exact_only_settings"  # the checkpoint's name of `SettingsRecord`


class SettingsRecord(tf.Module):
    """The settings a resume must not change (`run_config.EXACT_ONLY_UNCHANGED`), saved in each
    checkpoint as JSON, so that their check does not depend on config.json alone.

    A string variable, like the recoveries record: a background save copies variables only.
    A checkpoint written before this record existed restores as none ({}).
    """

    def __init__(self) -> None:
        super().__init__(name=SETTINGS_RECORD)
        with tf.init_scope():
            self.record = tf.Variable("{}", dtype=tf.string, trainable=False, name="record")

    @property
    def settings(self) -> dict[str, Any]:
        return json.loads(self.record.numpy().decode())

    @settings.setter
    def settings(self, settings: Mapping[str, Any]) -> None:
        # tf.Module's __setattr__ hands this a tracking wrapper of the dict, and of each
        # dict or list in it (a resume identity's parts), which json takes as plain ones.
        self.record.assign(json.dumps(dict(settings), sort_keys=True, default=_plain))


def _plain(wrapped: Any) -> dict | list:
    return dict(wrapped) if isinstance(wrapped, Mapping) else list(wrapped)


def recorded_settings(model_dir: str) -> dict[str, Any] | None:
    """The `SettingsRecord` of the newest complete checkpoint in model_dir, read without
    building anything; None when there is none, it does not read or holds no record (the
    restore then decides, and checks what it restores)."""
    prefix = newest_complete(os.path.join(model_dir, "checkpoints"))
    if prefix is None:
        return None
    key = f"{SETTINGS_RECORD}/record/.ATTRIBUTES/VARIABLE_VALUE"
    try:
        reader = tf.train.load_checkpoint(prefix)
        if not reader.has_tensor(key):
            return None
        settings = json.loads(reader.get_tensor(key).decode())
    except (tf.errors.OpError, ValueError, UnicodeDecodeError):
        return None
    return settings if isinstance(settings, dict) else None


class CheckpointKeeper:
    """The checkpoints of a run, kept in model_dir under its lock; none without a model_dir.

    Args:
        model_dir: where the run's files go; None keeps no checkpoint.
        max_checkpoints: how many recent checkpoints to keep.
        asynchronous: write checkpoints in a background thread where the strategy runs
            in one process (`Checkpointer`'s asynchronous).
        is_chief: whether this process holds the lock and keeps the checkpoints.
        say: writes a progress line.
    """

    def __init__(
        self,
        *,
        model_dir: str | None,
        max_checkpoints: int,
        asynchronous: bool,
        is_chief: bool,
        say: Callable[[str], None],
    ):
        self._model_dir = model_dir
        self._max_checkpoints = max_checkpoints
        self._asynchronous = asynchronous
        self._is_chief = is_chief
        self._say = say
        self._lock: str | None = None  # the lock file, held by the chief
        self.checkpointer: Checkpointer | None = None
        self.on_disk = False  # whether the restore found one or this run saved one
        self.saved_step: int | None = None
        # The changes of an exact-only setting this resume accepted (`check_resume`).
        self.changed_on_resume: dict[str, Any] = {}
        self._settings_record = SettingsRecord() if model_dir is not None else None

    def open(
        self,
        *,
        placement: Placement,
        items: Mapping[str, Any],
        step_counter: tf.Variable,
        optional_items: Mapping[str, Any],
        config: Mapping[str, Any],
        config_items: Mapping[str, Any],
        config_free_to_change: frozenset[str],
    ) -> str | None:
        """Takes model_dir's lock (chief), restores the newest checkpoint, records the config.

        Args:
            placement: where the run's variables live and its steps run.
            items: name -> trackable, saved and restored.
            step_counter: the variable whose value numbers the checkpoints.
            optional_items: name -> trackable, restored only when present.
            config, config_items, config_free_to_change: the run's config,
                the items whose types it records, and the keys a resume may
                change silently (`loops.model_dir.run_config.record_config`).

        Returns:
            The restored checkpoint's path; None when there is none (or no model_dir).

        Raises:
            ValueError: a checkpoint that does not match `items`, or a resume that
                changes a setting it cannot change and stay exact (`check_resume`).
            OSError: model_dir cannot be written or read, another run holds its lock, or
                a link stands where the run writes its results (`run_outputs`).
        """
        model_dir = self._model_dir
        if model_dir is None:
            return None
        self._lock_as_chief(model_dir)
        record = self._settings_record or SettingsRecord()
        self.checkpointer = self._checkpointer(
            placement, items, step_counter, {**optional_items, SETTINGS_RECORD: record}
        )
        try:
            if self._is_chief:  # a link at results.json would fail only after the training
                run_outputs.check_run_files(model_dir)
            restored = self.restore()
            if restored is not None:
                self.changed_on_resume = check_resume(
                    model_dir,
                    config,
                    int(step_counter.numpy()),
                    checkpoint_record=record.settings,
                )
            record.settings = exact_only_settings(config)
            if self._is_chief:
                record_config(
                    model_dir,
                    config,
                    config_items,
                    resuming=restored is not None,
                    free_to_change=config_free_to_change,
                    say=self._say,
                )
        except (ValueError, OSError):
            self.close()
            raise
        return restored

    def _checkpointer(
        self,
        placement: Placement,
        items: Mapping[str, Any],
        step_counter: tf.Variable,
        optional_items: Mapping[str, Any],
    ) -> Checkpointer:
        assert self._model_dir is not None
        one_process = placement.one_process
        if self._asynchronous and not one_process:
            self._say(
                f"note: async_checkpoints does not apply under the {placement.strategy_name} "
                "strategy (every "
                "worker takes part in a save's collectives): checkpoints are written "
                "synchronously"
            )
        return Checkpointer(
            strategy=placement.strategy,
            directory=os.path.join(self._model_dir, "checkpoints"),
            items=items,
            step_counter=step_counter,
            max_to_keep=self._max_checkpoints,
            optional_items=optional_items,
            say=self._say,
            asynchronous=self._asynchronous and one_process,
        )

    def _lock_as_chief(self, model_dir: str) -> None:
        if self._is_chief:
            self._lock = model_dir_lock.acquire(model_dir)
            # Holding the lock, whatever a killed writer left half-written is stale.
            reporting.remove_unfinished_writes(model_dir)

    def restore(self, before_step: int | None = None) -> str | None:
        """Restores the newest checkpoint (saved before `before_step`, where given:
        `Checkpointer.restore`); returns its path, or None when there is none."""
        if self.checkpointer is None:
            return None
        restored = self.checkpointer.restore(before_step)
        if restored:
            self.on_disk = True
        return restored

    def save(self, step: int) -> str | None:
        """Saves the state now, at `step` (every worker must call it); returns the path.

        Raises:
            NonFiniteWeightsError: a variable is not finite; nothing is saved.
            OSError: the checkpoint cannot be written; the earlier ones are intact.
        """
        if self.checkpointer is None:
            return None
        path = self.checkpointer.save()
        self.saved_step = step
        self.on_disk = True
        return path

    def wait(self) -> None:
        """Returns once a checkpoint written in the background is on disk (`Checkpointer.wait`).

        Raises:
            OSError: its files were not written; the earlier checkpoints are intact.
        """
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def close(self) -> None:
        """Waits for a save in flight, then releases model_dir's lock (a kill leaves its file,
        unlocked): the next run of model_dir finds every checkpoint written."""
        try:
            self.wait()
        except OSError as error:
            self._say(f"error: {error}")
        if self._lock is not None:
            model_dir_lock.release(self._lock)
            self._lock = None
