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

The one side channel, and who uses it: the `MicroBatch` being computed,
which only the Update makes and enters (`MicroBatch.computing`) while its
replica function runs, and whose normalizer only it reads afterwards. Its
only writers are `loops.global_count` (`record_count`) and
`loops.scale_to_global_batch` (`record_normalizer`); its only other reader is
`loops.replica_random` (`current`). Outside an Update's accumulation none is
entered: the helpers record nothing and `current` is None.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import tensorflow as tf


@dataclass
class MicroBatch:
    """One micro-batch of one replica's share of a step (replica context), made by the Update."""

    step_rows: tf.Tensor  # examples all replicas hold in the whole step (int32)
    first_row: tf.Tensor  # this micro-batch's first example, as a row of the whole step (int32)
    counts: list[tf.Tensor] = field(default_factory=list)  # what global_count returned in it
    # What scale_to_global_batch divided by in it: the micro-batch's normalizer.
    normalizers: list[tf.Tensor | float] = field(default_factory=list)

    @contextlib.contextmanager
    def computing(self) -> Iterator[MicroBatch]:
        """Marks the code inside, on this thread, as computing it (only the Update enters it)."""
        stack = _entered.__dict__.setdefault("stack", [])
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    def normalizer(self, grad_accum_steps: int) -> tf.Tensor | float:
        """The global count that its loss was divided by: its weight in the step.

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
        normalizers = _distinct(self.normalizers)
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
        counts = _distinct(self.counts)
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


# The micro-batch being computed. Thread-local: MirroredStrategy traces each replica's
# function in a thread of its own, and the threads take turns mid-call.
_entered = threading.local()


def current() -> MicroBatch | None:
    """The micro-batch being computed on this thread, or None outside accumulation."""
    stack = getattr(_entered, "stack", None)
    return stack[-1] if stack else None


def record_count(count: tf.Tensor) -> None:
    """Notes a global count the loss function took (only `loops.global_count` calls it)."""
    micro_batch = current()
    if micro_batch is not None:
        micro_batch.counts.append(count)


def record_normalizer(count: tf.Tensor | float) -> None:
    """Notes a count the loss was divided by (only `loops.scale_to_global_batch` calls it)."""
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
