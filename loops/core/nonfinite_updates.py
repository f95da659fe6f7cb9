"""The non-finite policy in the graph: a step's update applied, or left out where not finite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from loops.core import gradients
from loops.core import mixed_precision as mixed_precision_lib


def leaves_out_nonfinite(*, on_nonfinite: str, mixed_precision: str, coordinated: bool) -> bool:
    """Whether a run's updates are left out where not finite (else every update is applied).

    Args:
        on_nonfinite: the run's policy ("stop", "skip" or "recover").
        mixed_precision: the run's dtype policy; under "mixed_float16" an
            overflow is routine and its update always left out.
        coordinated: whether the steps run under ParameterServerStrategy,
            where the workers go on with the steps already scheduled while
            the coordinator decides, so that even "stop" skips.
    """
    return (
        on_nonfinite == "skip"
        or coordinated
        or mixed_precision_lib.needs_loss_scale(mixed_precision)
    )


class NonFiniteUpdates:
    """How a step's update is applied under the non-finite policy: what every `loops.Update` calls.

    Args:
        strategy: the run's strategy, which runs the update on its replicas.
        skips: whether a non-finite update is left out on every replica
            (`leaves_out_nonfinite`); False applies every update, and the run
            stops after the step.
    """

    def __init__(self, strategy: tf.distribute.Strategy, *, skips: bool):
        self._strategy = strategy
        self.skips = skips

    def apply(self, finite, apply_fn: Callable[..., Any], *args) -> tf.Tensor:
        """Runs `strategy.run(apply_fn, args)` the way the policy asks; cross-replica context.

        Args:
            finite: the per-replica result of `loops.all_finite` over the
                step's loss and gradients (the same on every replica).
            apply_fn: the replica function that applies the update.

        Returns:
            1.0 when the step was not finite on some replica, else 0.0: the
            step's `nonfinite` output.

        When `skips`, the update runs only when `finite` holds
        (`loops.apply_if_finite`), so it waits for every gradient and the
        check: 10-20% of a step of the digits MLP (benchmarks/RESULTS.md). Otherwise ("stop")
        each variable's update starts as soon as its gradient is ready, the
        inner loop ends right after a non-finite step, and the Controller
        goes back to the last checkpoint.
        """
        if self.skips:
            return gradients.apply_if_finite(self._strategy, finite, apply_fn, *args)
        self._strategy.run(apply_fn, args=args)
        return 1.0 - tf.cast(self._strategy.experimental_local_results(finite)[0], tf.float32)
