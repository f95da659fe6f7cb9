"""Ends a binary whose main finished well without the interpreter's teardown of TensorFlow.

Once main has returned, every file the run writes is closed (checkpoints,
results.json, the export, summaries flushed after each write), yet tearing
down TensorFlow's modules and native runtime took 1.1-1.8 s of each process
(a 2-core machine, TensorFlow 2.21; benchmarks/RESULTS.md, "Binary start"),
paid by every run and by every test that starts a binary. `exit_finished`
does what the interpreter's exit does that a user can see (waits for the
threads it would wait for, runs the exit handlers, flushes the logs and the
standard streams), then ends the process with status 0. A failing binary
exits the ordinary way.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn


def exit_finished() -> NoReturn:
    """Exit status 0 now, after what an orderly exit does but the teardown."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    # The handlers registered with `atexit` (logging's, absl's, a coverage tool's) run
    # here as at an ordinary exit; CPython names this function but does not document it.
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            pass
    os._exit(0)
