"""Saves and restores a loop's state: the chief into model_dir, others to scratch."""

from __future__ import annotations

import os
import shutil
from typing import Mapping

import tensorflow as tf

from loops import strategies


class Checkpointer:
    """A tf.train.CheckpointManager that every worker calls and only the chief keeps.

    Under MultiWorkerMirroredStrategy every worker must take part in the
    collectives of a save (DESIGN.md fact 11), so non-chief workers save too,
    into a scratch directory that is removed right after.

    `optional_items` are saved like `items` but restored only when the
    checkpoint holds them, so state added to a run later (an action's, such
    as an early-stopping wait count) starts fresh instead of failing the
    restore.
    """

    def __init__(self, *, strategy: tf.distribute.Strategy, directory: str,
                 items: Mapping[str, object], step_counter: tf.Variable,
                 max_to_keep: int, optional_items: Mapping[str, object] | None = None):
        self._is_chief = strategies.is_chief(strategy)
        self._chief_directory = directory
        self.directory = directory
        if not self._is_chief:
            self.directory = os.path.join(
                directory, f".scratch_{strategies.task_name(strategy)}")
        self.items = dict(items)
        self.optional_items = dict(optional_items or {})
        self.checkpoint = tf.train.Checkpoint(**self.items, **self.optional_items)
        self._manager = tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=max_to_keep,
            step_counter=step_counter)
        self._step_counter = step_counter

    @property
    def latest(self) -> str | None:
        return tf.train.latest_checkpoint(self._chief_directory)

    def restore(self) -> str | None:
        """Restores the newest checkpoint, if any; returns its path.

        Raises:
            ValueError: the checkpoint does not match the loop's objects.
        """
        path = self.latest
        if path is None:
            return None
        try:
            saved = {name.split("/")[0] for name, _ in tf.train.list_variables(path)}
            present = {name: item for name, item in self.optional_items.items() if name in saved}
            status = tf.train.Checkpoint(**self.items, **present).restore(path)
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            reason = str(error).splitlines()[0][:240]
            raise ValueError(
                f"The checkpoint {path} does not match this loop ({reason}...). "
                "It comes from a different model or loop: point --model_dir at "
                "a new directory, or rebuild the loop that wrote it.") from error
        return path

    def save(self) -> str | None:
        """Saves at the current step; returns the kept path (None off the chief)."""
        path = self._manager.save(checkpoint_number=self._step_counter)
        if not self._is_chief:
            shutil.rmtree(self.directory, ignore_errors=True)
            return None
        return path
