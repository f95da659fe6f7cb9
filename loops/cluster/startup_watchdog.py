"""Bounds a cluster task's start-up, TensorFlow's own included, and keeps SIGTERM working there.

While TensorFlow starts a multi-worker runtime (MultiWorkerMirroredStrategy,
ParameterServerStrategy) the main thread blocks in C++ holding the GIL: no
Python signal handler and no Python thread runs until it returns, which it
may never do (a peer that stopped, an address where another program
listens). Worse, that start installs TensorFlow's own C++ SIGTERM handler,
which only notes the signal. So the watchdog is a separate small process,
this file run as a script (standard library only), and SIGTERM is blocked in
the task meanwhile: it stays pending, where the watchdog sees it
(/proc/PID/status, ShdPnd), out of reach of any handler. A SIGTERM that a
thread still takes (one started before, outside `sigterm_blocked`) reaches
the watchdog through `signal.set_wakeup_fd`, written by the interpreter's
C-level handler even while the GIL is held. The watchdog prints the sentence
to the task's stderr and ends the task with a signal whose C-level handler
is libc's `_exit`, installed through ctypes: `_exit` gets the signal's number
as its exit code, so signal 42 (a real-time signal on Linux) exits with
exit_codes.PREEMPTED and SIGHUP (1) exits 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# Bytes the task writes to the watchdog besides the signal numbers.
_TENSORFLOW_STARTS = 0
# Seconds past the wait's own deadline before the watchdog ends a wait blocked
# outside Python (a host name lookup that hangs): the wait's own error comes first.
_WAIT_MARGIN_SECONDS = 10.0
# The signal whose number is the exit code of a start-up that ran out of time.
_TIMEOUT_SIGNAL = signal.SIGHUP  # 1
# How often the watchdog looks for a pending SIGTERM.
_POLL_SECONDS = 0.1


@contextlib.contextmanager
def sigterm_blocked() -> Iterator[None]:
    """Blocks SIGTERM in this thread inside; the threads started inside keep it blocked.

    A binary imports TensorFlow inside, so that TensorFlow's own threads never
    take a SIGTERM (see the module's docstring). One arriving inside is
    delivered when it ends, to this thread.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class StartupWatchdog:
    """A context that ends the task if its cluster start-up outlasts its bound or gets SIGTERM.

    Inside it, SIGTERM exits with `preempted_code` (nothing has run, so
    rerunning loses nothing) whatever the main thread is doing, and the task
    exits 1 with a sentence if the wait for its peers has not ended within
    `wait_seconds` (plus a margin: the wait raises its own error first) or
    TensorFlow's start has not returned `start_seconds` after `tensorflow_starts`.
    Outside the main thread, or off Linux, it does nothing.

    Args:
        task: the task's name, e.g. `worker_1`.
        wait_seconds, start_seconds: the bounds (math.inf: none).
        preempted_code: the exit code of SIGTERM, a real-time signal number.
    """

    def __init__(self, task: str, wait_seconds: float, start_seconds: float, preempted_code: int):
        self._task = task
        self._seconds = (wait_seconds, start_seconds)
        self._preempted_code = preempted_code
        self._child: subprocess.Popen | None = None
        self._write_fd = -1
        self._restore: list[Any] = []
        self._sigterm_noted = False

    def __enter__(self) -> StartupWatchdog:
        if threading.current_thread() is not threading.main_thread() or _libc is None:
            return self
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # set_wakeup_fd requires it
        self._child = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), str(os.getpid()), str(read_fd)]
            + [str(seconds) for seconds in self._seconds]
            + [str(self._preempted_code), *self._messages()],
            stdin=subprocess.DEVNULL,
            pass_fds=(read_fd,),
        )
        os.close(read_fd)
        previous_exits = {
            number: _set_c_handler(number, _exit_address())
            for number in (self._preempted_code, _TIMEOUT_SIGNAL)
        }
        self._restore = [
            signal.signal(signal.SIGTERM, self._note_sigterm),
            signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False),
            previous_exits,
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}),
        ]
        return self

    def tensorflow_starts(self) -> None:
        """Says the wait is over: TensorFlow's start now has `start_seconds`."""
        if self._child is not None:
            os.write(self._write_fd, bytes([_TENSORFLOW_STARTS]))

    def __exit__(self, *exc_info) -> None:
        if self._child is None:
            return
        previous_handler, previous_fd, previous_exits, previous_mask = self._restore
        signal.set_wakeup_fd(previous_fd)
        os.close(self._write_fd)
        # The watchdog exits at the end of its pipe, unless it read or finds a
        # SIGTERM first: then it ends this process, whose exit handlers are still set.
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        for number, handler in previous_exits.items():
            _set_c_handler(number, handler)
        signal.signal(signal.SIGTERM, previous_handler)
        # One pending since the watchdog's last look goes to the caller's handler now.
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        self._child = None
        if self._sigterm_noted:
            # It came after the wakeup fd was given back: the watchdog never saw it.
            signal.raise_signal(signal.SIGTERM)

    def _note_sigterm(self, signum, frame) -> None:
        # The watchdog acts on it (the C-level handler has written it to the pipe).
        del signum, frame
        self._sigterm_noted = True

    def _messages(self) -> list[str]:
        wait_seconds, start_seconds = self._seconds
        return [
            f"{self._task} received SIGTERM while starting its cluster (waiting for its "
            "peers or in TensorFlow's start-up), before any work; exiting with code "
            f"{self._preempted_code} (preempted): rerun the same command to start again.",
            f"{self._task} did not finish waiting for its cluster within "
            f"{wait_seconds + _WAIT_MARGIN_SECONDS:g} s (blocked outside Python, e.g. on a "
            "host name lookup); exiting with code 1. Check the hosts of TF_CONFIG and the "
            "network, then rerun.",
            f"{self._task}: TensorFlow's cluster start-up did not finish within "
            f"{start_seconds:g} s after every task of TF_CONFIG answered; exiting with code "
            "1. A task stopped meanwhile, or an address of TF_CONFIG reaches a server that "
            "is not a task of this cluster: check that every task runs with the same "
            "TF_CONFIG cluster, then rerun (or set LOOPS_CLUSTER_TIMEOUT_SECONDS higher).",
        ]


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None  # real-time signal 42 and this use of _exit are Linux's
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def _exit_address() -> int | None:
    return ctypes.cast(_libc._exit, ctypes.c_void_p).value


def _set_c_handler(number: int, address: int | None) -> int | None:
    """Sets the C-level handler of signal `number`; returns the one it replaces."""
    return _libc.signal(number, address)


def _watch(argv: list[str]) -> None:
    """The watchdog process: argv is the task's pid, the pipe's fd, the two bounds,
    the preempted exit code and the three sentences of `StartupWatchdog._messages`."""
    # A SIGTERM or Ctrl-C sent to the whole process group reaches the task too,
    # where this process must see it, not die of it first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    task_pid, read_fd = int(argv[0]), int(argv[1])
    wait_seconds, start_seconds = float(argv[2]), float(argv[3])
    preempted_code = int(argv[4])
    sigterm_message, wait_message, start_message = argv[5:8]
    deadline, message = time.monotonic() + wait_seconds + _WAIT_MARGIN_SECONDS, wait_message
    while True:
        if _sigterm_pending(task_pid):
            _end(task_pid, sigterm_message, preempted_code)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _end(task_pid, message, _TIMEOUT_SIGNAL)
            return
        ready, _, _ = select.select([read_fd], [], [], min(remaining, _POLL_SECONDS))
        if not ready:
            continue
        received = os.read(read_fd, 64)
        # At the pipe's end a last look: the task waits for this process to exit.
        if signal.SIGTERM in received or (not received and _sigterm_pending(task_pid)):
            _end(task_pid, sigterm_message, preempted_code)
            return
        if not received:
            return  # the task's start-up is over (or the task is gone)
        if _TENSORFLOW_STARTS in received:
            deadline, message = time.monotonic() + start_seconds, start_message


def _sigterm_pending(pid: int) -> bool:
    """Whether a SIGTERM waits for process `pid`, blocked in all its threads."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("ShdPnd:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _end(task_pid: int, message: str, exit_signal: int) -> None:
    print(message, file=sys.stderr, flush=True)
    try:
        os.kill(task_pid, exit_signal)
    except ProcessLookupError:
        pass  # it ended meanwhile


if __name__ == "__main__":
    _watch(sys.argv[1:])
