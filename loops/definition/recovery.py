"""The record of a run's recoveries from non-finite steps: saved in every checkpoint, it says
how many batches the train stream has moved past."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TypedDict

import tensorflow as tf

from loops.vocabulary import settings
from loops.vocabulary.whole_numbers import is_whole

# The record's name in a checkpoint, beside the definition's items (reserved: see the Trainer).
CHECKPOINT_NAME = "recoveries"
DEFAULT_MAX_RECOVERIES = settings.DEFAULT_MAX_RECOVERIES


class Recovery(TypedDict):
    """One recovery, as results.json lists it."""

    step: int  # the step whose loss, gradients or weights were not finite, or the spike's last
    restored_step: int  # the checkpoint the run went back to
    skipped_batches: int  # global batches moved past: those of steps restored_step + 1 .. step
    cause: str  # NONFINITE or LOSS_SPIKE (records from before causes were kept: NONFINITE)


NONFINITE = "nonfinite"
LOSS_SPIKE = "loss_spike"


class Recoveries(tf.Module):
    """Every recovery of a run so far, in order; checkpointed as JSON with the run's state.

    The train stream of step k starts at batch k * batches_per_step +
    `skipped_batches`, so a resume from a checkpoint continues at the batch
    the run that saved it would have read next. A checkpoint written before
    this record existed restores as no recovery.

    The JSON lives in a string variable, not in Python state: a checkpoint
    written in the background copies variables when the save begins, and
    cannot copy Python state (TensorFlow skips it with a warning).

    `stream_start` is the step the run's train stream began at: 0, or the step a
    continuation went on from (`loops.WarmStart.continuation`), whose new log's first
    batch is its next step's; the stream of step k then starts at batch
    (k - stream_start) * batches_per_step + `skipped_batches`.
    """

    def __init__(self) -> None:
        super().__init__(name=CHECKPOINT_NAME)
        with tf.init_scope():
            self.record = tf.Variable("[]", dtype=tf.string, trainable=False, name="record")
            self.stream_start = tf.Variable(0, dtype=tf.int64, trainable=False, name="stream_start")

    @property
    def entries(self) -> list[Recovery]:
        return json.loads(self.record.numpy().decode())

    @entries.setter
    def entries(self, entries: list[Recovery]) -> None:
        # A tf.Module hands its setters lists and dicts wrapped for tracking: unwrap them.
        self.record.assign(json.dumps([dict(entry) for entry in entries]))

    @property
    def skipped_batches(self) -> int:
        """Global batches every recovery so far moved the train stream past, in total."""
        return sum(entry["skipped_batches"] for entry in self.entries)


def check_max_recoveries(
    max_recoveries: int | None,
    reactions: Mapping[str, str],
    own_reactions: Mapping[str, str] | None = None,
) -> int:
    """`max_recoveries`, or the default when None; a ValueError for a bad one.

    Args:
        reactions: the built-in bad-step rules' reactions by setting (on_nonfinite, ...:
            `settings.REACTIONS`).
        own_reactions: the definition's own bad-step rules (`Loop.bad_step_rules`), their
            class names -> reactions ("stop" or "recover").

    Raises:
        ValueError: not a whole number >= 1, or given when no rule recovers.
    """
    if max_recoveries is None:
        return DEFAULT_MAX_RECOVERIES
    own = dict(own_reactions or {})
    if "recover" not in (*reactions.values(), *own.values()):
        listed = ", ".join(f"{name} {reaction!r}" for name, reaction in own.items()) or "none"
        built_in = ", ".join(
            f"{name}='recover' (got {value!r})" for name, value in reactions.items()
        )
        first = next(iter(reactions), "on_nonfinite")
        raise ValueError(
            f"max_recoveries={max_recoveries!r} applies only to {built_in} or a "
            "bad-step rule of the definition's own made with reaction 'recover' "
            f"(Loop.bad_step_rules; got {listed}); drop it, or pass {first}='recover' "
            f"(--{first}=recover)."
        )
    if not is_whole(max_recoveries, 1):
        raise ValueError(
            f"max_recoveries must be a whole number >= 1, got {max_recoveries!r}; to stop at "
            "the first non-finite step, pass on_nonfinite='stop' instead."
        )
    return max_recoveries
