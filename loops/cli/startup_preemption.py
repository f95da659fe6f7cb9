"""SIGTERM or SIGUSR1 while a binary starts (flags, TensorFlow's import, the build): exit 42."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from loops.vocabulary import exit_codes
from loops.vocabulary.exit_codes import PREEMPTION_SIGNALS


def exit_preempted(signum, frame) -> None:
    """The handler until training watches for preemption: no completed step to save, so stop."""
    del frame
    name = signal.Signals(signum).name
    print(f"preempted ({name}) before training started: nothing to save", file=sys.stderr)
    sys.exit(exit_codes.PREEMPTED)


def note_after_training(signum, frame) -> None:
    """The handler once training has returned: every step is saved and results.json written,
    so the few lines left (the summary, where the outputs went) finish and the run exits 0."""
    del frame
    name = signal.Signals(signum).name
    print(
        f"{name} after training finished: every step is saved; finishing the report",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def sigterm_handler(handler: Callable[[int, Any], None] | int = exit_preempted) -> Iterator[None]:
    """SIGTERM and SIGUSR1 go to `handler` inside; the handlers before come back after.

    A binary's start enters it first, before absl parses its flags and long
    before TensorFlow's import, so that a scheduler's SIGTERM at any moment of
    start-up is the preemption exit (42) with a line, as it is during training
    (where `loops.run.faults.preemption.PreemptionWatcher` takes SIGTERM over, to save
    first, and gives this handler back after). A Python handler runs only
    when the main thread is back in Python: code that blocks in TensorFlow's
    C++ until killed enters it with `signal.SIG_DFL`.

    Off the main thread (where Python installs no handler) it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
