"""Pictures drawn with numpy as uint8 arrays: images tiled, points scattered (for TensorBoard
image summaries and PNG files). Plots with axes and text are drawn by `loops.core.plots`."""

from __future__ import annotations

import math

import numpy as np

LINE_GRAY = 128  # the lines between and around a grid's tiles, and its empty tiles
SCATTER_SIZE = 256  # a scatter picture's side in pixels
_WHITE = np.array([255.0, 255.0, 255.0])
_POINT_BLUE = np.array([31.0, 80.0, 180.0])
_MARK_RED = np.array([220.0, 30.0, 30.0])


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
