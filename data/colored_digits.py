"""A large on-disk image dataset made locally: the bundled digits as 32x32 color JPEGs, perturbed.

It stands in for a dataset that does not fit in memory (a user's many-gigabyte
TFDS dataset) in the streaming benchmark and tests: any number of examples,
JPEG-encoded as large real datasets are (so a pipeline decodes them; a 32x32
PNG took 1.7x the CPU to decode), in several shard files, written without a
download. Example i of a split is the digit
`digits[i % 1797]` upscaled to 32x32 with a random shift and scale, a random
foreground and background color and pixel noise, all drawn from (seed, split,
i): the same files every time.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

IMAGE_SIZE = 32


@dataclasses.dataclass
class ColoredDigitsConfig(tfds.core.BuilderConfig):
    train_examples: int = 0
    test_examples: int = 0
    seed: int = 0


class ColoredDigits(tfds.core.GeneratorBasedBuilder):
    """Handwritten digits as 32x32x3 JPEGs with random placement, colors and noise."""

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {"1.0.0": "PNG images.", "1.1.0": "JPEG images (decoded in 0.6x the CPU)."}
    BUILDER_CONFIGS: list[ColoredDigitsConfig] = []

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="The 8x8 digits upscaled to 32x32 color JPEGs, shifted, colored, noised.",
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(
                        shape=(IMAGE_SIZE, IMAGE_SIZE, 3), encoding_format="jpeg"
                    ),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        config = self.builder_config
        return {
            "train": self._generate_examples(config.train_examples, split=0),
            "test": self._generate_examples(config.test_examples, split=1),
        }

    def _generate_examples(self, count: int, split: int):
        from sklearn.datasets import load_digits  # only this builder needs scikit-learn

        digits = load_digits()
        small = (digits.images / 16.0).astype(np.float32)
        chunk = 1024
        for first in range(0, count, chunk):
            indices = np.arange(first, min(first + chunk, count))
            images = _render(small, indices, seed=(self.builder_config.seed, split, first))
            for index, image in zip(indices, images):
                label = int(digits.target[index % len(small)])
                yield int(index), {"image": image, "label": label}


def _render(small: np.ndarray, indices: np.ndarray, seed) -> np.ndarray:
    """32x32x3 uint8 images of digits `indices % len(small)`, each placed and colored at random."""
    rng = np.random.default_rng(seed)
    count = len(indices)
    glyphs = small[indices % len(small)]
    # Nearest-neighbour upscale to 24..32 pixels, placed at a random offset.
    sizes = rng.integers(24, IMAGE_SIZE + 1, size=count)
    canvas = np.zeros((count, IMAGE_SIZE, IMAGE_SIZE), np.float32)
    for row, (glyph, size) in enumerate(zip(glyphs, sizes)):
        cells = (np.arange(size) * 8 // size).astype(np.int64)
        top, left = rng.integers(0, IMAGE_SIZE - size + 1, size=2)
        canvas[row, top : top + size, left : left + size] = glyph[np.ix_(cells, cells)]
    foreground = rng.uniform(0.5, 1.0, size=(count, 1, 1, 3))
    background = rng.uniform(0.0, 0.4, size=(count, 1, 1, 3))
    mixed = background + canvas[..., None] * (foreground - background)
    noisy = mixed + rng.normal(0.0, 0.04, size=mixed.shape)
    return np.clip(np.round(noisy * 255.0), 0, 255).astype(np.uint8)


def generate(
    data_dir: str,
    *,
    train_examples: int,
    test_examples: int,
    seed: int = 0,
    num_shards: int = 4,
    file_format: str = "tfrecord",
) -> str:
    """Writes the dataset under `data_dir` (once; later calls reuse it); returns its folder.

    The directory is a TFDS dataset directory: `tfds.builder_from_directory`
    and `--data_dir` read it. The train split is written in `num_shards` files.
    """
    for name, value in (("train_examples", train_examples), ("test_examples", test_examples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    config = ColoredDigitsConfig(
        name=f"train{train_examples}_test{test_examples}_seed{seed}_{file_format}",
        train_examples=train_examples,
        test_examples=test_examples,
        seed=seed,
    )
    builder = ColoredDigits(config=config, data_dir=data_dir, file_format=file_format)
    if not builder.is_prepared():
        with tf.device("/cpu:0"):
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(num_shards=num_shards)
            )
    return os.fspath(builder.data_dir)
