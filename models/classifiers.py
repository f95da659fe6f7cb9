"""Small Keras 3 image classifiers: raw pixels (any dtype, 0-255) in, logits out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras

from loops.core.replica_random import StatelessDropout


def _initializer(seed: int, index: int):
    # Explicit per-layer seeds make the initial weights a function of `seed`
    # alone, so loops built with 1 and N replicas start from the same point.
    return keras.initializers.GlorotUniform(seed=seed * 1000 + index)


def _regularizer(l2: float):
    return keras.regularizers.L2(l2) if l2 else None


def _dropout(rate: float, seed: int, index: int):
    # Each layer its own stream; masks differ per replica and match for 1 and N
    # replicas (Keras' Dropout repeats one mask on every replica).
    return [StatelessDropout(rate, seed=seed * 1000 + 500 + index)] if rate else []


def _normalization(batch_norm: bool, name: str):
    # Synchronized: an empty replica (partial final batch) would otherwise turn
    # every weight into NaN, and per-replica statistics break replica parity.
    return [keras.layers.BatchNormalization(synchronized=True, name=name)] if batch_norm else []


def mlp(
    *,
    input_shape: Sequence[int],
    num_classes: int,
    hidden_units: Sequence[int] = (128, 64),
    l2: float = 0.0,
    batch_norm: bool = False,
    dropout: float = 0.0,
    seed: int = 0,
) -> keras.Model:
    """A multilayer perceptron on flattened pixels scaled to [0, 1].

    `dropout` > 0 drops that fraction of each hidden layer's outputs in training.
    """
    layers = [
        keras.Input(tuple(input_shape)),
        keras.layers.Rescaling(1.0 / 255.0, dtype="float32"),
        keras.layers.Flatten(),
    ]
    for index, units in enumerate(hidden_units):
        # A bias before batch norm is cancelled by it (its gradient is only noise).
        layers.append(
            keras.layers.Dense(
                units,
                kernel_initializer=_initializer(seed, index),
                kernel_regularizer=_regularizer(l2),
                use_bias=not batch_norm,
            )
        )
        layers += _normalization(batch_norm, f"batch_norm_{index}")
        layers.append(keras.layers.ReLU())
        layers += _dropout(dropout, seed, index)
    # Logits stay float32 under a mixed dtype policy (loops.mixed_precision): the
    # softmax needs float32 range and digits.
    layers.append(
        keras.layers.Dense(
            num_classes,
            kernel_initializer=_initializer(seed, 99),
            kernel_regularizer=_regularizer(l2),
            name="logits",
            dtype="float32",
        )
    )
    return keras.Sequential(layers, name="mlp")


def cnn(
    *,
    input_shape: Sequence[int],
    num_classes: int,
    filters: Sequence[int] = (32, 64),
    l2: float = 0.0,
    batch_norm: bool = False,
    dropout: float = 0.0,
    seed: int = 0,
) -> keras.Model:
    """A small convolutional net: 3x3 conv blocks with 2x2 pooling, then a dense head.

    `dropout` > 0 drops that fraction of the features before the head in training.
    """
    layers = [keras.Input(tuple(input_shape)), keras.layers.Rescaling(1.0 / 255.0, dtype="float32")]
    for index, width in enumerate(filters):
        layers.append(
            keras.layers.Conv2D(
                width,
                3,
                padding="same",
                kernel_initializer=_initializer(seed, index),
                kernel_regularizer=_regularizer(l2),
                use_bias=not batch_norm,
            )
        )
        layers += _normalization(batch_norm, f"batch_norm_{index}")
        layers += [keras.layers.ReLU(), keras.layers.MaxPooling2D(2, padding="same")]
    # Logits stay float32 under a mixed dtype policy, as in `mlp`.
    layers += [
        keras.layers.Flatten(),
        *_dropout(dropout, seed, len(filters)),
        keras.layers.Dense(
            num_classes,
            kernel_initializer=_initializer(seed, 99),
            kernel_regularizer=_regularizer(l2),
            name="logits",
            dtype="float32",
        ),
    ]
    return keras.Sequential(layers, name="cnn")


CLASSIFIERS: dict[str, Callable[..., keras.Model]] = {"mlp": mlp, "cnn": cnn}


def build_classifier(name: str, **kwargs) -> keras.Model:
    """Builds the classifier called `name` (see CLASSIFIERS) with `kwargs`."""
    if name not in CLASSIFIERS:
        raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(CLASSIFIERS)}.")
    return CLASSIFIERS[name](**kwargs)
