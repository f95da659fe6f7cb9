"""A TensorBoard profiler trace of a chosen range of train steps, for the Controller.

`Loop(profile_steps=(start, end))` (`--profile_steps=START,END`) traces
steps start..end (counted from 1, both included) with TensorFlow's profiler.
The Controller ends inner loops at step start - 1 and at step end, so the
trace holds those steps' inner loops and nothing else. The trace goes to
`model_dir/summaries/train/plugins/profile/<session>/`, where TensorBoard's
profile plugin finds it (`tensorboard --logdir MODEL_DIR/summaries`, "Profile"
tab); only the chief traces.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import tensorflow as tf

from loops.vocabulary import settings

PLUGIN_HINT = (
    "TensorBoard's profile plugin is not installed here: to view the trace, "
    "pip install tensorboard-plugin-profile, then "
)


def check_profile_steps(profile_steps) -> tuple[int, int] | None:
    """(start, end), whole numbers with 1 <= start <= end, or None; else ValueError naming it."""
    return settings.check_profile_steps("profile_steps", profile_steps)


class StepProfiler:
    """Starts the profiler before step `start` and stops it after step `end`.

    Args:
        steps: (start, end), checked by `check_profile_steps`.
        logdir: where the trace goes (its plugins/profile folder); None
            traces nothing (no model_dir, or not the chief).
        say: writes a progress line.
    """

    def __init__(self, steps: tuple[int, int], logdir: str | None, say: Callable[[str], None]):
        self.start, self.end = steps
        self.logdir = logdir
        self._say = say
        self._active = False
        self.done = False

    def check_reachable(self, step: int, num_steps: int) -> None:
        """Says when a `train` from `step` to `num_steps` cannot trace every profiled step."""
        if self.logdir is None or self.done or (step < self.start and self.end <= num_steps):
            return
        self._say(
            f"warning: profile_steps=({self.start}, {self.end}) is not within the steps this "
            f"train runs ({step + 1} to {num_steps}): "
            + (
                "nothing is traced"
                if step >= self.start or self.start > num_steps
                else f"the trace stops at step {num_steps}"
            )
            + "; pass profile_steps inside them (--profile_steps=START,END)."
        )

    def stop_before(self, step: int) -> int | None:
        """The first step after `step` where an inner loop has to end for the trace; or None."""
        for boundary in (self.start - 1, self.end):
            if boundary > step:
                return boundary
        return None

    def before_loop(self, step: int) -> None:
        """Starts tracing when the next inner loop begins at step `start` (step is start - 1)."""
        if self.logdir is None or self._active or self.done or step != self.start - 1:
            return
        tf.profiler.experimental.start(self.logdir)
        self._active = True

    def after_loop(self, step: int) -> None:
        """Stops tracing once step `end` is done, and says where the trace is."""
        if self._active and step >= self.end:
            self.close()
            view = f"tensorboard --logdir {os.path.dirname(self.logdir or '')}"
            hint = "" if _plugin_installed() else PLUGIN_HINT
            self._say(
                f"profiled steps {self.start}-{self.end} into {self.logdir}/plugins/profile: "
                f"{hint}{view} (Profile tab)"
            )

    def close(self) -> None:
        """Stops a trace in progress (at the end of `train`, however it ends)."""
        if self._active:
            tf.profiler.experimental.stop()
            self._active = False
            self.done = True


def _plugin_installed() -> bool:
    return importlib.util.find_spec("tensorboard_plugin_profile") is not None
