"""Turns SIGTERM into a checkpoint at the next inner-loop boundary and a clean stop."""

from __future__ import annotations

import signal
import threading
from typing import Any

import tensorflow as tf

from loops.cluster import strategies


class PreemptionWatcher:
    """Notes SIGTERM while training; `should_stop` tells whether to save and stop now.

    A cluster manager sends SIGTERM to one worker or to all of them. Under
    MultiWorkerMirroredStrategy every worker must save together (a checkpoint's
    collectives need them all), so the flag is all-reduced across workers at
    each inner-loop boundary, which every worker reaches at the same step.
    """

    def __init__(self, strategy: tf.distribute.Strategy):
        self._strategy = strategy
        self._requested = False
        self._previous: Any = None  # the SIGTERM handler to give back
        # Under ParameterServerStrategy only the coordinator runs the Trainer: its own flag decides.
        self._multi_worker = (
            strategies.num_workers(strategy) > 1
            and strategies.strategy_name(strategy) != "parameter_server"
        )

    def __enter__(self) -> PreemptionWatcher:
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._note)
        return self

    def __exit__(self, *exc_info) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _note(self, signum, frame) -> None:
        del signum, frame
        self._requested = True

    def should_stop(self) -> bool:
        """True when any worker received SIGTERM; every worker must call it."""
        if not self._multi_worker:
            return self._requested
        flag = tf.constant(1.0 if self._requested else 0.0)
        per_replica = self._strategy.run(lambda: tf.identity(flag))
        # ReduceOp has only SUM and MEAN: a sum above 0 means some worker was signalled.
        return float(self._strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) > 0
