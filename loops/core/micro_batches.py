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
    # What scale_to_global_batch divided by in it: the micro-batch's normalizer.
    normalizers: list[tf.Tensor | float] = field(default_factory=list)


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
    """Notes a global count the loss function took (`loops.global_count` calls it)."""
    micro_batch = current()
    if micro_batch is not None:
        micro_batch.counts.append(count)


def record_normalizer(count: tf.Tensor | float) -> None:
    """Notes a count the loss was divided by (`loops.scale_to_global_batch` calls it)."""
    micro_batch = current()
    if micro_batch is not None:
        micro_batch.normalizers.append(count)


def _distinct(values: list) -> list:
    """`values` without repeats: the same tensor object, or the same Python number."""
    distinct: list = []
    for value in values:
        if not any(value is seen or (_is_number(value) and value == seen) for seen in distinct):
            distinct.append(value)
    return distinct


def _is_number(value) -> bool:
    return isinstance(value, (int, float))


def normalizer(micro_batch: MicroBatch, grad_accum_steps: int) -> tf.Tensor | float:
    """The global count that `micro_batch`'s loss was divided by: its weight in the step.

    It is the count given to `loops.scale_to_global_batch`; a loss function
    that divides by hand is understood only when it took exactly one
    `loops.global_count`. Anything else is ambiguous and refused, rather than
    weighting the micro-batches by a count the loss was not divided by.

    Raises:
        ValueError: no count, or several different ones, that the loss may have been
            divided by.
    """
    fix = (
        "Compute the whole loss as one vector of per-example (or per-token) losses and "
        "divide it once, by loops.scale_to_global_batch(per_example_loss, count), with "
        "count = loops.global_count(...) of what it sums over (examples, a sum of "
        f"weights, tokens); or set grad_accum_steps=1 (it is {grad_accum_steps})."
    )
    normalizers = _distinct(micro_batch.normalizers)
    if len(normalizers) == 1:
        return normalizers[0]
    if len(normalizers) > 1:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} weights each micro-batch's gradients by "
            "the global count its loss is divided by, and this loss function divided parts "
            f"of its loss by {len(normalizers)} different counts "
            f"(loops.scale_to_global_batch called with {len(normalizers)} counts), so no "
            f"single weight is right. {fix}"
        )
    counts = _distinct(micro_batch.counts)
    if len(counts) == 1:
        return counts[0]
    took = (
        "took no loops.global_count"
        if not counts
        else f"took {len(counts)} different loops.global_count values"
    )
    raise ValueError(
        f"grad_accum_steps={grad_accum_steps} weights each micro-batch's gradients by the "
        f"global count its loss is divided by, and this loss function {took} and called no "
        f"loops.scale_to_global_batch, so which count its loss was divided by is not known. "
        f"{fix}"
    )
