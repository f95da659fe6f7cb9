"""Pictures drawn with numpy as uint8 arrays: images tiled, points scattered, a matrix of
counts as a heatmap, curves plotted (for TensorBoard image summaries and PNG files)."""

from __future__ import annotations

import math

import numpy as np

LINE_GRAY = 128  # the lines between and around a grid's tiles, and its empty tiles
SCATTER_SIZE = 256  # a scatter picture's side in pixels
HEATMAP_SIZE = 250  # a heatmap's side in pixels, at least one pixel a cell
PLOT_WIDTH, PLOT_HEIGHT = 480, 320  # a curve plot's size in pixels
_PLOT_MARGIN = 8  # pixels between a plot's frame and its curves
_WHITE = np.array([255.0, 255.0, 255.0])
_POINT_BLUE = np.array([31.0, 80.0, 180.0])
_MARK_RED = np.array([220.0, 30.0, 30.0])
_COUNT_BLUE = np.array([8.0, 48.0, 107.0])
# Curves of a plot in order: a light one (raw values) under a dark one (their smoothing).
CURVE_COLORS = (np.array([150.0, 180.0, 230.0]), _POINT_BLUE)
_GRID_GRAY = np.array([225.0, 225.0, 225.0])


def pixels_from_unit_range(images: np.ndarray) -> np.ndarray:
    """Images with values in [-1, 1] (a tanh generator's) as uint8 pixels 0-255."""
    return np.clip(np.round((np.asarray(images) + 1.0) * 127.5), 0, 255).astype(np.uint8)


def pixels_from_extremes(images: np.ndarray) -> np.ndarray:
    """Images as uint8 pixels: uint8 ones as they are, others scaled so their least value
    is 0 and their largest 255 (one scale for all: models read any range of floats)."""
    images = np.asarray(images)
    if images.dtype == np.uint8 or not images.size:
        return images.astype(np.uint8)
    values = images.astype(np.float64)
    low, high = float(np.min(values)), float(np.max(values))
    scale = 255.0 / (high - low) if high > low else 0.0
    return np.clip(np.round((values - low) * scale), 0, 255).astype(np.uint8)


def image_grid(pixels: np.ndarray, columns: int) -> np.ndarray:
    """Tiles uint8 images (n, h, w, c) in row-major order, `columns` a row, into one image.

    The tiles are separated and framed by 1-pixel mid-gray lines, so images
    with a black or white background stay apart; the tiles of a last row that
    `n` does not fill stay gray.

    Returns:
        An array of shape (rows * (h + 1) + 1, columns * (w + 1) + 1, c),
        rows = ceil(n / columns), dtype uint8.
    """
    count, height, width, channels = pixels.shape
    rows = max(1, math.ceil(count / columns))
    grid = np.full(
        (rows * (height + 1) + 1, columns * (width + 1) + 1, channels), LINE_GRAY, np.uint8
    )
    for index in range(count):
        top = 1 + (index // columns) * (height + 1)
        left = 1 + (index % columns) * (width + 1)
        grid[top : top + height, left : left + width] = pixels[index]
    return grid


def scatter_image(points: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """2-D points as blue dots, darker where more fall, over red rings around the `marks`.

    The picture shows the square around the marks' bounding box grown by half
    on every side (x to the right, y up); a point outside it sits on the
    border (a diverging generator shows as a line there), a non-finite one is
    left out.

    Args:
        points: shape (n, 2), e.g. a generator's samples.
        marks: shape (m, 2), m >= 1, e.g. the means of the real data's modes.

    Returns:
        An RGB image of shape (SCATTER_SIZE, SCATTER_SIZE, 3), dtype uint8.
    """
    points, marks = np.asarray(points, np.float64), np.asarray(marks, np.float64)
    low, high = marks.min(axis=0), marks.max(axis=0)
    center = (low + high) / 2
    half = max(float(np.max(high - low)) * 0.75, 1e-6)

    def to_pixels(xy):
        """Fractional (row, column) of each point: y grows upwards."""
        unit = (xy - (center - half)) / (2 * half) * (SCATTER_SIZE - 1)
        return (SCATTER_SIZE - 1) - unit[:, 1], unit[:, 0]

    finite = points[np.all(np.isfinite(points), axis=1)]
    rows, columns = (
        np.clip(np.round(axis), 0, SCATTER_SIZE - 1).astype(np.int64) for axis in to_pixels(finite)
    )
    counts = np.bincount(rows * SCATTER_SIZE + columns, minlength=SCATTER_SIZE**2)
    # Each point covers 60% of what is left of its pixel's white: 1 point is clear, 5 dark.
    cover = (1.0 - 0.4 ** counts.reshape(SCATTER_SIZE, SCATTER_SIZE))[..., None]
    image = _WHITE * (1.0 - cover) + _POINT_BLUE * cover
    grid_rows, grid_columns = np.mgrid[0:SCATTER_SIZE, 0:SCATTER_SIZE]
    for mark_row, mark_column in zip(*to_pixels(marks)):
        distance = np.hypot(grid_rows - mark_row, grid_columns - mark_column)
        image[np.abs(distance - 6.0) < 0.75] = _MARK_RED
    return np.round(image).astype(np.uint8)


def heatmap(counts: np.ndarray) -> np.ndarray:
    """A matrix of counts (e.g. a confusion matrix) as square cells, white for 0 to dark blue.

    A cell's shade is log(1 + count) / log(1 + the largest count): a single
    count is visible beside thousands.

    Returns:
        An RGB image of shape (r * cell, c * cell, 3), dtype uint8, with
        cell = max(1, HEATMAP_SIZE // max(r, c)) pixels a side.
    """
    counts = np.asarray(counts, np.float64)
    largest = float(np.max(counts, initial=0.0))
    shade = np.log1p(np.maximum(counts, 0.0)) / math.log1p(largest) if largest > 0 else counts * 0
    image = _WHITE * (1.0 - shade[..., None]) + _COUNT_BLUE * shade[..., None]
    cell = max(1, HEATMAP_SIZE // max(counts.shape))
    return np.round(np.kron(image, np.ones((cell, cell, 1)))).astype(np.uint8)


def curve_plot(
    x: np.ndarray,
    curves: list[np.ndarray],
    *,
    grid_x: np.ndarray | tuple = (),
    mark_x: float | None = None,
) -> np.ndarray:
    """Curves over a common x as connected lines, in `CURVE_COLORS` order, framed in gray.

    x runs left to right over its range; y up, over the range of the last
    curve's finite values (with the first curve's lowest): a value above it
    sits on the top border (a loss that blew up), a non-finite one breaks the
    line. Light gray vertical lines stand at `grid_x` (e.g. each power of ten
    of a log-scaled x), a red one at `mark_x`. There are no labels: the
    numbers go beside the picture (a JSON file, a progress line).

    Args:
        x: shape (n,), increasing.
        curves: up to len(CURVE_COLORS) arrays of shape (n,).

    Returns:
        An RGB image of shape (PLOT_HEIGHT, PLOT_WIDTH, 3), dtype uint8.
    """
    x = np.asarray(x, np.float64)
    image = np.ones((PLOT_HEIGHT, PLOT_WIDTH, 1)) * _WHITE
    low_x, high_x = float(x[0]), float(x[-1])
    high_x = high_x if high_x > low_x else low_x + 1.0  # one point: any width will do
    shown = [np.asarray(curve, np.float64) for curve in curves]
    scale = shown[-1][np.isfinite(shown[-1])]
    first = shown[0][np.isfinite(shown[0])]
    low_y = float(min(np.min(scale, initial=np.inf), np.min(first, initial=np.inf)))
    high_y = float(np.max(scale, initial=-np.inf))
    if not np.isfinite(low_y) or not high_y > low_y:
        low_y, high_y = (low_y - 1.0, low_y + 1.0) if np.isfinite(low_y) else (0.0, 1.0)
    inner_width, inner_height = PLOT_WIDTH - 2 * _PLOT_MARGIN, PLOT_HEIGHT - 2 * _PLOT_MARGIN

    def column_of(value):
        return _PLOT_MARGIN + (np.asarray(value) - low_x) / (high_x - low_x) * (inner_width - 1)

    def row_of(value):
        unit = np.clip((np.asarray(value) - low_y) / (high_y - low_y), 0.0, 1.0)
        return _PLOT_MARGIN + (1.0 - unit) * (inner_height - 1)

    for line_x, color in [(value, _GRID_GRAY) for value in grid_x] + (
        [] if mark_x is None else [(mark_x, _MARK_RED)]
    ):
        if low_x <= line_x <= high_x:
            image[_PLOT_MARGIN:-_PLOT_MARGIN, int(round(float(column_of(line_x))))] = color
    for curve, color in zip(shown, CURVE_COLORS):
        _draw_line(image, column_of(x), row_of(curve), np.isfinite(curve), color)
    image[[0, -1], :] = image[:, [0, -1]] = LINE_GRAY
    return np.round(image).astype(np.uint8)


def _draw_line(image: np.ndarray, columns, rows, finite, color: np.ndarray) -> None:
    """Colors the pixels on the segments between consecutive finite points."""
    for start in range(len(columns) - 1):
        if not (finite[start] and finite[start + 1]):
            continue
        span = max(abs(columns[start + 1] - columns[start]), abs(rows[start + 1] - rows[start]))
        along = np.linspace(0.0, 1.0, int(np.ceil(span)) + 1)
        line_columns = np.round(columns[start] + along * (columns[start + 1] - columns[start]))
        line_rows = np.round(rows[start] + along * (rows[start + 1] - rows[start]))
        image[line_rows.astype(np.int64), line_columns.astype(np.int64)] = color
