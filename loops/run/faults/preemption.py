"""Turns SIGTERM or SIGUSR1 into a checkpoint at the next inner-loop boundary and a clean stop."""

from __future__ import annotations

import signal
import threading
from typing import Any

import tensorflow as tf

from loops.placement import Placement
from loops.vocabulary.exit_codes import PREEMPTION_SIGNALS


class PreemptionWatcher:
    """Notes SIGTERM or SIGUSR1 while training; `should_stop` tells whether to save and stop now.

    A cluster manager sends one of them to one worker or to all of them. Under
    MultiWorkerMirroredStrategy every worker must save together (a checkpoint's
    collectives need them all), so the flag is all-reduced across workers at
    each inner-loop boundary, which every worker reaches at the same step.
    """

    def __init__(self, placement: Placement):
        self._strategy = placement.strategy
        self._received: str | None = None  # the signal's name, once one came
        self._previous: dict[int, Any] = {}  # the handlers to give back
        # Under parameter servers only the coordinator runs the Trainer: its own flag decides.
        self._multi_worker = placement.workers_stop_together
        self._signalled_anywhere: Any = None  # the traced sum of the flags, once asked

    def __enter__(self) -> PreemptionWatcher:
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            self._previous = {
                signum: signal.signal(signum, self._note) for signum in PREEMPTION_SIGNALS
            }
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _note(self, signum, frame) -> None:
        del frame
        self._received = self._received or signal.Signals(signum).name

    @property
    def received(self) -> str:
        """What preempted the run, for its last line: this process's signal, or another's."""
        return self._received or "a signal to another worker"

    def should_stop(self) -> bool:
        """True when any worker received a preemption signal; every worker must call it."""
        if not self._multi_worker:
            return self._received is not None
        if self._signalled_anywhere is None:
            self._signalled_anywhere = tf.function(self._summed_flags)
        flag = tf.constant(0.0 if self._received is None else 1.0)
        # ReduceOp has only SUM and MEAN: a sum above 0 means some worker was signalled.
        return float(self._signalled_anywhere(flag)) > 0

    def _summed_flags(self, flag: tf.Tensor) -> tf.Tensor:
        """Every worker's flag summed, traced once: called eagerly, `strategy.run` warned of
        its overhead and traced a new function at every boundary (its lambda a new one)."""
        per_replica = self._strategy.run(tf.identity, args=(flag,))
        return self._strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
