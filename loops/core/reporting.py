"""What a loop tells the world: progress lines, TensorBoard summaries, results.json."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import numpy as np
import tensorflow as tf

from loops.core import own_files


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers: what a run reports (lines, TensorBoard scalars, JSON).

    An evaluation's arrays (a confusion matrix, the worst examples) are the
    definition's to draw; `Trainer.evaluate` returns them with the numbers.
    """
    return {name: value for name, value in metrics.items() if np.ndim(value) == 0}


def format_metrics(metrics: Mapping[str, float]) -> str:
    return " | ".join(f"{name} {value:.4g}" for name, value in metrics.items())


# An ETA past this many years says only that: datetime.timedelta, which shows the shorter
# ones, holds at most 999,999,999 days, fewer than a huge --train_steps can ask for.
LONGEST_ETA_YEARS = 100
_YEAR_SECONDS = 365.25 * 24 * 3600


def eta_text(seconds: float) -> str:
    """`seconds` to go as a progress line says them: "0:01:40", "3 days, 2:00:00", or "more
    than 100 years"."""
    if seconds > LONGEST_ETA_YEARS * _YEAR_SECONDS:  # inf included
        return f"more than {LONGEST_ETA_YEARS} years"
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    """Writes one line per inner loop: step, metrics, steps/s and ETA."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout  # where the lines go (a StringIO in tests)

    def train(
        self,
        step: int,
        total: int,
        metrics: Mapping[str, float],
        rates: Mapping[str, float] | float,
    ) -> None:
        """One line after an inner loop.

        Args:
            rates: "steps_per_second" and, when the loop counts them,
                "<unit>_per_second" (examples, tokens, env_steps) over that
                inner loop; a number is steps per second alone.
        """
        if not isinstance(rates, Mapping):
            rates = {"steps_per_second": rates}
        steps_per_second = rates["steps_per_second"]
        remaining = max(total - step, 0) / steps_per_second if steps_per_second > 0 else 0.0
        eta = eta_text(remaining)
        shown = {
            name: value
            for name, value in metrics.items()
            if name != "num_examples" and not (name == "nonfinite" and value == 0)
        }
        units = "".join(
            f"{value:.0f} {name[: -len('_per_second')]}/s | "
            for name, value in rates.items()
            if name != "steps_per_second"
        )
        self.line(
            f"step {step}/{total} | {format_metrics(shown)} | "
            f"{units}{steps_per_second:.1f} steps/s | ETA {eta}"
        )

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        self.line(f"eval at step {step} | {format_metrics(metrics)}")

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


class Summaries:
    """TensorBoard scalars for train and eval; silent when `directory` is None."""

    def __init__(self, directory: str | None):
        self._writers: dict[str, Any] = {}
        self._directory = directory

    def _writer(self, name: str):
        assert self._directory is not None  # callers return early without a directory
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(os.path.join(self._directory, name))
        return self._writers[name]

    @property
    def silent(self) -> bool:
        """Whether these summaries write nothing (no directory: off the chief, or no model_dir),
        so a picture need not be drawn."""
        return self._directory is None

    def scalars(self, name: str, step: int, metrics: Mapping[str, float]) -> None:
        if self._directory is None:
            return
        with self._writer(name).as_default(step=step):
            for key, value in metrics.items():
                tf.summary.scalar(key, value)
        self._writer(name).flush()

    def text(self, name: str, step: int, texts: Mapping[str, str]) -> None:
        """Markdown texts for TensorBoard's text dashboard (e.g. a model's samples)."""
        if self._directory is None:
            return
        with self._writer(name).as_default(step=step):
            for key, value in texts.items():
                tf.summary.text(key, value)
        self._writer(name).flush()

    def images(self, name: str, step: int, images: Mapping[str, np.ndarray]) -> None:
        """Pictures for TensorBoard's images dashboard, each one uint8 image (h, w, c)."""
        if self._directory is None:
            return
        with self._writer(name).as_default(step=step):
            for key, value in images.items():
                tf.summary.image(key, value[None])
        self._writer(name).flush()

    def hparams(self, config: Mapping[str, object]) -> None:
        """Records the run's configuration for TensorBoard's HParams dashboard.

        Its table pairs each run's configuration with the last value of each
        train and eval scalar, so runs can be compared side by side.
        """
        if self._directory is None or not config:
            return
        from tensorboard.plugins.hparams import api as hparams_api

        values = {
            name: value if isinstance(value, (bool, int, float, str)) else str(value)
            for name, value in config.items()
        }
        with self._writer("").as_default():
            hparams_api.hparams(
                values, trial_id=os.path.basename(os.path.dirname(os.path.abspath(self._directory)))
            )
        self._writer("").flush()

    def writer(self, name: str):
        """The file writer for `name` (for images and other summaries); None when silent."""
        return None if self._directory is None else self._writer(name)


TEMPORARY_PREFIX = own_files.TEMPORARY_PREFIX  # write_json_atomic's temporaries
# MODEL_DIR/evaluator belongs to the run's evaluator (loops/run/sidecar.py), a process of
# its own that never holds the model_dir's lock: only it cleans up there.
EVALUATOR_DIRECTORY = "evaluator"


def plain_number(value) -> float | int:
    """A numpy scalar as the Python number it stands for: 0.002, not 0.0020000000949949026.

    A float32 becomes the shortest decimal that reads back as the same float32.
    """
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return (
            float(np.format_float_positional(value, unique=True, trim="-"))
            if np.isfinite(value)
            else float(value)
        )
    return float(value)


def library_versions() -> dict[str, str]:
    """Versions of Python and the libraries a run's numbers depend on."""
    versions = {"python": platform.python_version()}
    for name in ("loops", "tensorflow", "keras", "tensorflow-datasets", "numpy", "absl-py"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def previous_history(model_dir: str, *, up_to_step: int) -> list[dict]:
    """The evaluations an earlier run of `model_dir` recorded, up to the restored step."""
    try:
        with open(os.path.join(model_dir, "results.json")) as stream:
            history = json.load(stream).get("history", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [
        entry
        for entry in history
        if isinstance(entry, dict) and entry.get("step", up_to_step + 1) <= up_to_step
    ]


def write_json_atomic(path: str, payload: Mapping) -> None:
    """Writes JSON so a reader (or a crash) never sees a half-written file (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: str, text: str) -> None:
    """Writes a text file at once, never through a link (`own_files.write_atomic`).

    Raises:
        own_files.PlantedLinkError: `path` is a symbolic link; nothing was written.
        OSError: the file cannot be written; a previous version of it is intact.
    """
    own_files.write_atomic(path, text.encode("utf-8"))


def remove_unfinished_writes(directory: str) -> None:
    """Removes temporaries that killed writers left in `directory` (its writer holds the lock).

    Its `EVALUATOR_DIRECTORY` is left alone: a live evaluator may be writing there.
    """
    for parent, folders, files in os.walk(directory):
        if parent == directory and EVALUATOR_DIRECTORY in folders:
            folders.remove(EVALUATOR_DIRECTORY)
        for name in files:
            if name.startswith(TEMPORARY_PREFIX) and name.endswith(".tmp"):
                os.remove(os.path.join(parent, name))
        for name in [folder for folder in folders if folder.startswith(".export-")]:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            folders.remove(name)
