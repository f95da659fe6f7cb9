"""Clears the locals of the framework's frames in a failed call's traceback: they hold iterators."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator

# Frames of these packages are the run's own and TensorFlow's: their locals
# are iterators, batches and tensors, nothing a user would inspect after a
# failure. Other frames (a user's action, a test) keep theirs for a debugger.
_OWN_PACKAGES = ("loops.", "tensorflow.", "keras.")


@contextlib.contextmanager
def dropped_on_failure(*releases: Callable[[], None]) -> Iterator[None]:
    """On an exception out of the block: `drop_framework_locals`, then each of `releases`
    (what else holds the input's iterators), then the exception goes on."""
    try:
        yield
    except BaseException as error:
        drop_framework_locals(error)
        for release in releases:
            release()
        raise


def drop_framework_locals(error: BaseException) -> int:
    """Clears the locals of every finished frame of `_OWN_PACKAGES` in `error`'s tracebacks.

    Why: an exception out of `train` keeps its traceback, and the traceback
    keeps the frames that were reading the train (or eval) iterator. An
    iterator alive until the interpreter's exit keeps its reading threads,
    and a thread that calls into Python then (a `tf.numpy_function` reader)
    can hang the exit (BUILD.md, "A live iterator of a `tf.numpy_function`
    pipeline can hang the interpreter's exit"). With the locals cleared, the
    iterator goes when the Trainer drops its own reference, while Python
    still runs. The traceback still prints and names every line.

    Follows `__cause__` and `__context__` (a sentence raised from a
    TensorFlow error keeps that error). Returns the frames cleared.
    """
    cleared = 0
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        cleared += _clear_own_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
    return cleared


def _clear_own_frames(traceback: types.TracebackType | None) -> int:
    cleared = 0
    while traceback is not None:
        frame = traceback.tb_frame
        if str(frame.f_globals.get("__name__", "")).startswith(_OWN_PACKAGES):
            try:
                frame.clear()
                cleared += 1
            except RuntimeError:  # still running (the caller's own frame): left as it is
                pass
        traceback = traceback.tb_next
    return cleared
