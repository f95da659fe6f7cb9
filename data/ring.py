"""The 2-D ring of Gaussians (the standard GAN mode-collapse benchmark) and its quality metrics."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole


@dataclasses.dataclass(frozen=True)
class Ring:
    """An equal mixture of `num_modes` isotropic Gaussians spaced evenly on a circle.

    The defaults are the benchmark of Metz et al. (unrolled GANs), VEEGAN and
    PacGAN: 8 modes on a circle of radius 2, standard deviation 0.02.

    Attributes:
        num_modes: number of Gaussians (>= 2).
        radius: radius of the circle the means lie on (> 0).
        stddev: standard deviation of every Gaussian (> 0).
        quality_stddevs: a sample within this many standard deviations of a
            mean is a high-quality sample of that mode.
        min_mode_fraction: a mode is covered when at least this fraction of
            all samples are high-quality samples of it (PacGAN's rule: 20 of
            2,500 samples).
    """

    num_modes: int = 8
    radius: float = 2.0
    stddev: float = 0.02
    quality_stddevs: float = 3.0
    min_mode_fraction: float = 20 / 2500

    def __post_init__(self):
        if (
            isinstance(self.num_modes, bool)
            or not isinstance(self.num_modes, int)
            or self.num_modes < 2
        ):
            raise ValueError(f"num_modes must be a whole number >= 2, got {self.num_modes!r}.")
        for name in ("radius", "stddev", "quality_stddevs", "min_mode_fraction"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}.")
        if self.quality_stddevs * self.stddev >= self.radius * math.sin(math.pi / self.num_modes):
            raise ValueError(
                f"Modes of stddev {self.stddev} on radius {self.radius} overlap within "
                f"{self.quality_stddevs} standard deviations; use a smaller stddev or a "
                "larger radius."
            )

    def centers(self) -> np.ndarray:
        """The means, shape (num_modes, 2), the first at angle 0."""
        angles = 2 * np.pi * np.arange(self.num_modes) / self.num_modes
        return (self.radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)).astype(np.float32)

    def global_batches(self, global_batch_size: int, *, seed: int = 0) -> tf.data.Dataset:
        """An endless stream of float32 global batches of shape (global_batch_size, 2).

        Batch i is drawn with a stateless seed keyed on (seed, i), so the stream
        is the same on every run and input pipeline, and skipping k batches
        (resume) lands where a run that stopped after k batches was.

        Raises:
            ValueError: global_batch_size is not a whole number >= 1.
        """
        check_whole("global_batch_size", global_batch_size)
        centers = tf.constant(self.centers())

        def batch(index):
            key = tf.stack([tf.constant(seed, tf.int64), index])
            modes = tf.random.stateless_uniform(
                [global_batch_size],
                seed=tf.random.experimental.stateless_fold_in(key, 0),
                minval=0,
                maxval=self.num_modes,
                dtype=tf.int32,
            )
            offsets = tf.random.stateless_normal(
                [global_batch_size, 2],
                seed=tf.random.experimental.stateless_fold_in(key, 1),
                stddev=self.stddev,
            )
            return tf.gather(centers, modes) + offsets

        return tf.data.Dataset.counter(dtype=tf.int64).map(batch)

    def quality(self, samples: np.ndarray) -> dict[str, float]:
        """Mode coverage and sample quality of generated points, shape (n, 2).

        Returns:
            modes_covered: modes with at least `min_mode_fraction` of the
                samples high-quality samples of them (0 to num_modes).
            high_quality_fraction: fraction of samples within `quality_stddevs`
                standard deviations of their nearest mean.
        """
        samples = np.asarray(samples, np.float64)
        if samples.ndim != 2 or samples.shape[1] != 2 or not len(samples):
            raise ValueError(f"Expected samples of shape (n, 2) with n >= 1, got {samples.shape}.")
        distances = np.linalg.norm(samples[:, None, :] - self.centers()[None], axis=-1)
        nearest = np.argmin(distances, axis=1)
        high_quality = np.min(distances, axis=1) <= self.quality_stddevs * self.stddev
        per_mode = np.bincount(nearest[high_quality], minlength=self.num_modes)
        covered = int(np.sum(per_mode >= self.min_mode_fraction * len(samples)))
        return {"modes_covered": covered, "high_quality_fraction": float(np.mean(high_quality))}
