"""Plots with axes and text, drawn by matplotlib into PNG bytes: the learning-rate finder's
curve and a confusion matrix with class names and counts.

matplotlib is imported inside the functions only: the binaries answer --help and flag
errors before anything heavy loads. Each figure is a `matplotlib.figure.Figure` on its own
Agg canvas, never pyplot's global state, so drawing needs no display and is thread-safe.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100  # pixels an inch: a figure's size in inches times this is the PNG's in pixels
LEARNING_RATE_SIZE = (6.4, 4.2)  # inches: 640 x 420 pixels
# Margins around the axes in inches (left, bottom, right, top), for the tick labels, the
# axis labels and the title. Fixed, not matplotlib's constrained layout, which draws a
# figure twice: a confusion matrix at each evaluation costs half the time.
LEARNING_RATE_MARGINS = (0.8, 0.6, 0.2, 0.4)
_NAME_INCHES_A_CHARACTER = 0.085  # a tick label's width a character at 10 points, and more
RAW_LOSS_COLOR, SMOOTHED_LOSS_COLOR, SUGGESTION_COLOR = "#9ab4e6", "#1f50b4", "#dc1e1e"
# A confusion matrix's cells carry their counts, and its ticks the class names, up to
# these many classes; past them the cells are too small to read (the counts are in
# results.json) and the ticks fall back to matplotlib's choice of class indices.
MAX_COUNTED_CLASSES = 30
MAX_NAMED_CLASSES = 60
MAX_NAME_CHARACTERS = 16  # a longer class name is cut, ending in "...", so the plot stays readable


def learning_rate_figure(
    rates: Sequence[float],
    losses: Sequence[float],
    smoothed_losses: Sequence[float],
    suggested_rate: float,
    loss_name: str,
) -> Figure:
    """The loss against the learning rate on a log10 axis, the suggested rate marked.

    The raw losses are drawn light, their smoothing dark, a dashed red line
    stands at the suggestion, whose value the title and the legend give. The
    loss axis is `_loss_range`'s; a non-finite loss breaks its line.
    """
    figure, axes = _new_figure(LEARNING_RATE_SIZE, LEARNING_RATE_MARGINS)
    raw, smoothed = _finite_or_nan(losses), _finite_or_nan(smoothed_losses)
    axes.plot(rates, raw, color=RAW_LOSS_COLOR, linewidth=1.0, label=loss_name)
    smoothed_label = f"{loss_name}, smoothed"
    axes.plot(rates, smoothed, color=SMOOTHED_LOSS_COLOR, linewidth=2.0, label=smoothed_label)
    suggestion = f"suggested rate {suggested_rate:.3g}"
    axes.axvline(suggested_rate, color=SUGGESTION_COLOR, linestyle="--", label=suggestion)
    axes.set_xscale("log")  # major ticks at the powers of ten, labelled 10^k
    low, high = _loss_range(raw, smoothed)
    if high > low:
        margin = 0.05 * (high - low)
        axes.set_ylim(low - margin, high + margin)
    axes.set_xlabel("learning rate (log scale)")
    axes.set_ylabel(loss_name)
    axes.set_title(f"Learning-rate range test: {suggestion}")
    axes.grid(True, which="major", color="#dddddd")
    axes.legend(loc="upper left")
    return figure


def confusion_matrix_figure(counts: np.ndarray, class_names: Sequence[str] | None) -> Figure:
    """A matrix of counts (rows the true class, columns the predicted one) as shaded cells.

    A cell's shade is log(1 + count) / log(1 + the largest count), so one
    count shows beside thousands; each cell carries its count, and the axes
    the class names (`class_names`, else the class indices), up to
    `MAX_COUNTED_CLASSES` and `MAX_NAMED_CLASSES` classes.
    """
    counts = np.asarray(counts, np.int64)
    classes = counts.shape[0]
    side = min(max(4.0, 1.8 + 0.42 * classes), 16.0)
    names = [str(index) for index in range(classes)] if class_names is None else class_names
    shown = [_shortened(str(name)) for name in names]
    labels = 0.45 + _NAME_INCHES_A_CHARACTER * max(map(len, shown)) if shown else 0.45
    figure, axes = _new_figure((side, side), (labels, labels, 0.2, 0.4))
    largest = int(counts.max(initial=0))
    shade = np.log1p(np.maximum(counts, 0)) / np.log1p(largest) if largest > 0 else counts * 0.0
    axes.imshow(shade, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    if classes <= MAX_NAMED_CLASSES:
        axes.set_xticks(range(classes), shown, rotation=90)
        axes.set_yticks(range(classes), shown)
    if classes <= MAX_COUNTED_CLASSES:
        size = 9 if classes <= 12 else 6
        for (row, column), count in np.ndenumerate(counts):
            color = "white" if shade[row, column] > 0.6 else "black"
            axes.text(column, row, str(count), ha="center", va="center", color=color, size=size)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(f"Confusion matrix of {int(counts.sum())} examples")
    return figure


def png_bytes(figure: Figure) -> bytes:
    """The figure as a PNG file's bytes: the same figure gives the same bytes (no metadata)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def _new_figure(size: tuple[float, float], margins: tuple[float, float, float, float]):
    """A white figure of `size` inches on its own Agg canvas, and its one axes `margins`
    inches (left, bottom, right, top) inside the figure's edges."""
    _prepare_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size, dpi=DPI, facecolor="white")
    FigureCanvasAgg(figure)
    (width, height), (left, bottom, right, top) = size, margins
    figure.subplots_adjust(
        left=left / width, bottom=bottom / height, right=1 - right / width, top=1 - top / height
    )
    return figure, figure.add_subplot()


def _loss_range(raw: np.ndarray, smoothed: np.ndarray) -> tuple[float, float]:
    """The loss axis's span: from the lowest finite loss up to the highest smoothed one, but no
    further above the first smoothed loss than that is above the lowest (a blow-up runs off
    the top instead of flattening the descent); (0, 0) without finite losses."""
    finite = smoothed[np.isfinite(smoothed)]
    if not finite.size:
        return 0.0, 0.0
    low = float(min(finite.min(), np.nanmin(raw, initial=np.inf)))
    high = float(finite.max())
    if finite[0] > low:
        high = min(high, float(finite[0]) + (float(finite[0]) - low))
    return low, high


def _finite_or_nan(values: Sequence[float]) -> np.ndarray:
    """The values with every non-finite one as NaN, where matplotlib breaks a line."""
    array = np.asarray(values, np.float64)
    return np.where(np.isfinite(array), array, np.nan)


def _shortened(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARACTERS else name[: MAX_NAME_CHARACTERS - 3] + "..."


def _prepare_matplotlib() -> None:
    """Before matplotlib's first import: a private config directory where its own is unwritable.

    matplotlib keeps its font cache in its config and cache directories; where
    they cannot be written (a read-only home, a user without one) it makes a
    temporary one itself but says so on every run. This makes it quietly, for
    this process only, and leaves a user's MPLCONFIGDIR as it is.
    """
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    home = os.path.expanduser("~")
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    if all(_writable_directory(os.path.join(path, "matplotlib")) for path in (config, cache)):
        return
    private = tempfile.mkdtemp(prefix="loops-matplotlib-")
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = private


def _writable_directory(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)
