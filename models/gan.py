"""Generators and critics for GANLoop: MLPs for the 2-D ring, DCGAN-style convnets for images.

No network here uses batch normalization: the WGAN-GP penalty needs each
example's own input gradient, batch statistics would differ between a critic
call on real and on fake examples, and without them the generator's moving
average is a plain average of its weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras


def _initializer(seed: int, index: int):
    # Explicit per-layer seeds make the initial weights a function of `seed`
    # alone, so loops built with 1 and N replicas start from the same point.
    return keras.initializers.GlorotUniform(seed=seed * 1000 + index)


def ring_generator(
    *, noise_dim: int = 16, hidden_units: Sequence[int] = (64, 64), seed: int = 0
) -> keras.Model:
    """Noise (noise_dim,) -> a 2-D point, through ReLU layers."""
    layers = [keras.Input((noise_dim,))]
    for index, units in enumerate(hidden_units):
        layers.append(
            keras.layers.Dense(
                units, activation="relu", kernel_initializer=_initializer(seed, index)
            )
        )
    layers.append(keras.layers.Dense(2, kernel_initializer=_initializer(seed, 99), name="point"))
    return keras.Sequential(layers, name="ring_generator")


def ring_discriminator(*, hidden_units: Sequence[int] = (64, 64), seed: int = 0) -> keras.Model:
    """A 2-D point -> one logit (or critic score), through LeakyReLU layers."""
    layers = [keras.Input((2,))]
    for index, units in enumerate(hidden_units):
        layers += [
            keras.layers.Dense(units, kernel_initializer=_initializer(seed, 500 + index)),
            keras.layers.LeakyReLU(0.2),
        ]
    layers.append(keras.layers.Dense(1, kernel_initializer=_initializer(seed, 599), name="score"))
    return keras.Sequential(layers, name="ring_discriminator")


def image_generator(
    *, image_shape: Sequence[int] = (8, 8, 1), noise_dim: int = 32, filters: int = 64, seed: int = 0
) -> keras.Model:
    """Noise (noise_dim,) -> an image in [-1, 1]: dense to a quarter-size map, one 2x upsampling.

    Raises:
        ValueError: the image height or width is odd.
    """
    height, width, channels = image_shape
    if height % 2 or width % 2:
        raise ValueError(
            f"image_shape {tuple(image_shape)} needs an even height and width "
            "(the generator upsamples once by 2)."
        )
    return keras.Sequential(
        [
            keras.Input((noise_dim,)),
            keras.layers.Dense(
                height // 2 * width // 2 * filters,
                activation="relu",
                kernel_initializer=_initializer(seed, 0),
            ),
            keras.layers.Reshape((height // 2, width // 2, filters)),
            keras.layers.Conv2DTranspose(
                filters // 2,
                4,
                strides=2,
                padding="same",
                activation="relu",
                kernel_initializer=_initializer(seed, 1),
            ),
            keras.layers.Conv2D(
                channels,
                3,
                padding="same",
                activation="tanh",
                kernel_initializer=_initializer(seed, 2),
                name="image",
            ),
        ],
        name="image_generator",
    )


def image_discriminator(
    *, image_shape: Sequence[int] = (8, 8, 1), filters: int = 32, seed: int = 0
) -> keras.Model:
    """An image in [-1, 1] -> one logit (or critic score): two strided convolutions, LeakyReLU."""
    return keras.Sequential(
        [
            keras.Input(tuple(image_shape)),
            keras.layers.Conv2D(
                filters, 3, strides=2, padding="same", kernel_initializer=_initializer(seed, 500)
            ),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Conv2D(
                filters * 2,
                3,
                strides=2,
                padding="same",
                kernel_initializer=_initializer(seed, 501),
            ),
            keras.layers.LeakyReLU(0.2),
            keras.layers.Flatten(),
            keras.layers.Dense(1, kernel_initializer=_initializer(seed, 599), name="score"),
        ],
        name="image_discriminator",
    )


# loops.bin.gan's --dataset -> (its generator, its discriminator).
NETWORKS = {
    "ring": (ring_generator, ring_discriminator),
    "digits": (image_generator, image_discriminator),
}
