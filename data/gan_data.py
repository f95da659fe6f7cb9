"""What loops.bin.gan learns to draw (the ring or the digits images) and how each is judged."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from loops_data import image_classification
from loops_data.ring import Ring

RING_EVAL_SAMPLES = 2500  # PacGAN's and VEEGAN's sample count for the ring metrics
SAMPLE_GRID = (8, 8)


def digits_images(global_batch_size: int, *, seed: int, data_dir: str | None = None):
    """Global batches of digit images scaled to [-1, 1] (the generator's tanh range), no labels."""
    return image_classification.global_batches(
        "digits",
        "train",
        global_batch_size=global_batch_size,
        data_dir=data_dir,
        shuffle_seed=seed,
        repeat=True,
    ).map(lambda images, labels: tf.cast(images, tf.float32) / 127.5 - 1.0)


def train_data(*, dataset: str, data_dir: str | None, global_batch_size: int, seed: int):
    """The Trainer's `train_data` for `dataset` ('ring' or 'digits'): a function of the batches."""
    if dataset == "ring":
        ring = Ring()
        return lambda: ring.global_batches(global_batch_size, seed=seed)
    return lambda: digits_images(global_batch_size, seed=seed, data_dir=data_dir)


def evaluation(dataset: str) -> dict[str, Any]:
    """`loops.GANLoop`'s evaluation keywords for `dataset` ('ring' or 'digits').

    The ring is judged by its mode-coverage metrics on RING_EVAL_SAMPLES samples,
    drawn as a scatter over its modes; the digits by a SAMPLE_GRID of samples
    drawn as an image.
    """
    if dataset == "ring":
        ring = Ring()
        return {
            "sample_metrics": ring.quality,
            "num_eval_samples": RING_EVAL_SAMPLES,
            "scatter_marks": ring.centers(),
        }
    return {"sample_grid": SAMPLE_GRID, "num_eval_samples": SAMPLE_GRID[0] * SAMPLE_GRID[1]}
