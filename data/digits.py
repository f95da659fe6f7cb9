"""The 8x8 handwritten digits shipped inside scikit-learn, as a local TFDS dataset.

Preparing it reads the copy inside the installed scikit-learn package, so it
works offline; `tfds.load("digits")` then serves it like mnist or cifar10.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

TEST_EVERY = 5  # every 5th example (by index) is in the fixed test split


class Digits(tfds.core.GeneratorBasedBuilder):
    """1,797 8x8 grayscale digits (UCI optdigits via scikit-learn): 1,437 train, 360 test."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Fixed split: index % 5 == 0 is test."}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Handwritten digits 0-9 as 8x8 images with 17 gray levels, "
                "scaled to 0-255; the copy bundled with scikit-learn."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://archive.ics.uci.edu/dataset/80",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {
            "train": self._generate_examples(test=False),
            "test": self._generate_examples(test=True),
        }

    def _generate_examples(self, test: bool):
        from sklearn.datasets import load_digits  # only this builder needs scikit-learn

        digits = load_digits()
        # Gray levels 0..16 -> 0..255, the range every image dataset here uses.
        images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
        for index, (image, label) in enumerate(zip(images, digits.target)):
            if (index % TEST_EVERY == 0) == test:
                yield index, {"image": image, "label": int(label)}
