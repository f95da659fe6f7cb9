"""Which slice of a step's examples a replica's loss function is computing, under gradient
accumulation.

`loops.Update` with `grad_accum_steps` K splits each replica's share of a
step into K micro-batches and runs the loss function once per micro-batch.
While it does, two things must still see the whole step: the loss
normalization (each micro-batch's gradients are weighted by the global count
its loss divided by, which `loops.global_count` records here) and the random
draws keyed by example (`loops.replica_random` keys each example by its row
in the whole step, read here, so a mask or a noise vector does not depend on
K or on the replica count).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import tensorflow as tf


@dataclass
class MicroBatch:
    """One micro-batch of one replica's share of a step (replica context)."""

    step_rows: tf.Tensor  # examples all replicas hold in the whole step (int32)
    first_row: tf.Tensor  # this micro-batch's first example, as a row of the whole step (int32)
    counts: list[tf.Tensor] = field(default_factory=list)  # what global_count returned in it


# Thread-local: MirroredStrategy traces each replica's function in a thread of
# its own, and the threads take turns mid-call.
_current = threading.local()


@contextlib.contextmanager
def computing(micro_batch: MicroBatch) -> Iterator[MicroBatch]:
    """Marks the code inside as computing `micro_batch` (the Update calls this)."""
    stack = _current.__dict__.setdefault("stack", [])
    stack.append(micro_batch)
    try:
        yield micro_batch
    finally:
        stack.pop()


def current() -> MicroBatch | None:
    """The micro-batch being computed on this thread, or None outside accumulation."""
    stack = getattr(_current, "stack", None)
    return stack[-1] if stack else None


def record_count(count: tf.Tensor) -> None:
    """Notes a global count the loss function divides by (`loops.global_count` calls it)."""
    micro_batch = current()
    if micro_batch is not None:
        micro_batch.counts.append(count)
