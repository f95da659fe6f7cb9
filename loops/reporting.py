"""What a loop tells the world: progress lines, TensorBoard summaries, results.json."""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
from typing import Mapping, TextIO

import tensorflow as tf


def format_metrics(metrics: Mapping[str, float]) -> str:
    return " | ".join(f"{name} {value:.4g}" for name, value in metrics.items())


class Progress:
    """Writes one line per inner loop: step, metrics, steps/s and ETA."""

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream or sys.stdout

    def train(self, step: int, total: int, metrics: Mapping[str, float],
              steps_per_second: float) -> None:
        remaining = max(total - step, 0) / steps_per_second if steps_per_second > 0 else 0.0
        eta = datetime.timedelta(seconds=round(remaining))
        shown = {name: value for name, value in metrics.items()
                 if name != "num_examples" and not (name == "nonfinite" and value == 0)}
        self.line(f"step {step}/{total} | {format_metrics(shown)} | "
                  f"{steps_per_second:.1f} steps/s | ETA {eta}")

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self.line(f"eval at step {step} | {format_metrics(metrics)}")

    def line(self, text: str) -> None:
        print(text, file=self._stream, flush=True)


class Summaries:
    """TensorBoard scalars for train and eval; silent when `directory` is None."""

    def __init__(self, directory: str | None):
        self._writers = {}
        self._directory = directory

    def _writer(self, name: str):
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(
                os.path.join(self._directory, name))
        return self._writers[name]

    def scalars(self, name: str, step: int, metrics: Mapping[str, float]) -> None:
        if self._directory is None:
            return
        with self._writer(name).as_default(step=step):
            for key, value in metrics.items():
                tf.summary.scalar(key, value)
        self._writer(name).flush()

    def writer(self, name: str):
        """The file writer for `name` (for images and other summaries); None when silent."""
        return None if self._directory is None else self._writer(name)


def write_json_atomic(path: str, payload: Mapping) -> None:
    """Writes JSON so a reader (or a crash) never sees a half-written file."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".results.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream, indent=2, sort_keys=True)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
