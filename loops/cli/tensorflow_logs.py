"""Keeps TensorFlow's own log lines off a binary's console unless the user asks for them."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# A C++ log line (I0000 00:00:1795530023.815669    1325 port.cc:153] ...) and the
# notice absl prints before the first of them.
_CPP_LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ [^ ]+:\d+\] ")
_ABSL_NOTICE = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
# How ClusterCoordinator (cluster_coordinator.py) logs a lost parameter-server worker, an
# error with TensorFlow's whole message: its GRPC details over several lines, each time.
COORDINATOR_WORKER_FAILED = "Worker %s failed with %r:%s"
# What it logs, once a closure, while a server does not answer (each line with the error's
# GRPC details), and before it raises a closure's error to the chief.
COORDINATOR_CLOSURE_FAILED = "Remote function on worker %s failed with %r:%s\n"
COORDINATOR_CANCELLING = "Start cancelling closures due to error %r: %s"
_DEVICE_TASK = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")
# What Keras imports at its own import only if it is installed, for features a binary never
# uses (keras.wrappers' scikit-learn estimators, keras.visualization's image gallery): both
# are installed for loops' own use (the bundled digits, the plots), and together they were
# a third of the CPU time of TensorFlow's import (benchmarks/RESULTS.md, "Binary start").
KERAS_OPTIONAL_IMPORTS = ("sklearn", "matplotlib")


def import_tensorflow(*, quiet: bool) -> None:
    """Imports TensorFlow; with `quiet`, without its C++ log lines.

    TF_CPP_MIN_LOG_LEVEL=3 hides the C++ lines logged once TensorFlow is up
    (a CPU-only machine's cuInit error among them), but not the notices its
    libraries log while loading (oneDNN, missing CUDA drivers): those come
    before absl::InitializeLog and go straight to file descriptor 2. So the
    import writes stderr to a file, and what is not a C++ log line (a Python
    warning) is written on afterwards.

    Either way Keras is imported without its optional integrations
    (`KERAS_OPTIONAL_IMPORTS`, `without_keras_optional_imports`).
    """
    with without_keras_optional_imports():
        if quiet:
            _import_tensorflow_quietly()
        else:
            import tensorflow  # noqa: F401


@contextlib.contextmanager
def without_keras_optional_imports() -> Iterator[None]:
    """Inside, the modules of `KERAS_OPTIONAL_IMPORTS` not yet imported count as not installed,
    so that Keras skips them; after it, they import as usual (for loops' own use)."""
    hidden = [name for name in KERAS_OPTIONAL_IMPORTS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "absent"
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]


def _import_tensorflow_quietly() -> None:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    sys.stderr.flush()
    stderr = os.dup(2)
    failed = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except Exception:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr, 2)
            os.close(stderr)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            # A failed import shows everything: its log lines may say why. An
            # import a signal ended (SystemExit, KeyboardInterrupt) has none to show.
            sys.stderr.write(
                "".join(line for line in lines if failed or not _is_tensorflow_log(line))
            )


def _is_tensorflow_log(line: str) -> bool:
    return line.rstrip("\n") == _ABSL_NOTICE or bool(_CPP_LOG_LINE.match(line))


class OneLineWorkerLoss(logging.Filter):
    """Words ClusterCoordinator's report of a lost parameter-server worker as one line.

    The coordinator logs it only for a loss it survives (the worker's closures run on
    the other workers), so one line says which worker and what that means, in the
    project's words: not the GRPC details over several lines, nor the class of whatever
    TensorFlow raised in the closure it cut short (a SIGKILLed worker's shows as a
    TypeError as often as an UnavailableError).
    """

    def __init__(self) -> None:
        super().__init__()
        self._said_unreachable = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message == COORDINATOR_CANCELLING:
            return False  # the error it names reaches the Trainer, which words it once
        if message.startswith(COORDINATOR_CLOSURE_FAILED) and isinstance(record.args, tuple):
            if self._said_unreachable:
                return False
            self._said_unreachable = True
            worker = _task_name(record.args[0])
            record.msg = (
                "%s could not reach a parameter server; its closures are retried (said "
                "once: a server lost for good stops the run at its next step, naming it)"
            )
            record.args = (worker,)
            return True
        if record.msg == COORDINATOR_WORKER_FAILED and isinstance(record.args, tuple):
            worker = _task_name(record.args[0])
            record.msg = (
                "lost %s: it stopped answering (its process died or its host went down); "
                "training goes on, its closures run on the other workers"
            )
            record.args = (worker,)
        return True


def _task_name(device: object) -> str:
    """`worker_1` for a device of /job:worker/task:1 (the device as given otherwise)."""
    found = _DEVICE_TASK.search(str(device))
    return f"{found.group(1)}_{found.group(2)}" if found else str(device)


def one_line_worker_losses(logger: logging.Logger) -> None:
    """Adds `OneLineWorkerLoss` to TensorFlow's Python `logger` (once)."""
    if not any(isinstance(each, OneLineWorkerLoss) for each in logger.filters):
        logger.addFilter(OneLineWorkerLoss())
